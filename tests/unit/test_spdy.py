"""The fake apiserver's SPDY/3.1 frame codec (kubefake/spdy.py)."""

from __future__ import annotations

import struct
import zlib

import pytest

from kubefake import spdy


def test_dictionary_is_the_spec_constant() -> None:
    # The draft's dictionary is 1423 bytes; its first word is "options", its last bytes "enq=0.".
    assert len(spdy.DICTIONARY) == 1423
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.DICTIONARY.endswith(b"utf-,*,enq=0.")
    assert b"\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\x07version" in spdy.DICTIONARY


def test_control_frame_head_layout() -> None:
    frame = spdy.encode_control(spdy.PING, 0, struct.pack(">I", 7))
    assert frame[:8] == bytes([0x80, 0x03, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04])
    assert spdy.FrameReader().feed(frame) == [spdy.ControlFrame(spdy.PING, 0, b"\0\0\0\x07")]


def test_data_frames_round_trip_when_split_at_every_byte() -> None:
    wire = spdy.encode_data(5, b"hello") + spdy.encode_data(7, b"", fin=True)
    wire += spdy.encode_data(9, b"x" * 70_000)
    reader = spdy.FrameReader()
    frames: list[spdy.Frame] = []
    for i in range(len(wire)):
        frames += reader.feed(wire[i : i + 1])
    assert frames == [
        spdy.DataFrame(5, 0, b"hello"),
        spdy.DataFrame(7, spdy.FLAG_FIN, b""),
        spdy.DataFrame(9, 0, b"x" * 70_000),
    ]


def test_header_blocks_share_one_zlib_context_per_direction() -> None:
    client, server = spdy.HeaderCodec(), spdy.HeaderCodec()
    first = spdy.syn_stream_payload(client, 1, {"streamType": "error"})
    second = spdy.syn_stream_payload(client, 3, {"streamType": "stdout", "port": "8080"})
    assert spdy.parse_syn_stream(server, first) == (1, {"streamtype": ["error"]})
    assert spdy.parse_syn_stream(server, second) == (
        3,
        {"streamtype": ["stdout"], "port": ["8080"]},
    )
    # The second block reuses the first one's history, so a fresh inflater cannot read it.
    with pytest.raises(spdy.ProtocolError):
        spdy.HeaderCodec().decode(second[10:])
    reply = spdy.syn_reply_payload(server, 3, {})
    assert spdy.parse_syn_reply(client, reply) == (3, {})


def test_header_block_primed_with_the_dictionary_only() -> None:
    # Another implementation's deflate with the same dictionary must be readable: built here
    # with zlib directly, including a NUL-separated multi-value.
    deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
    block = struct.pack(">I", 1) + struct.pack(">I", 1) + b"a" + struct.pack(">I", 3) + b"x\0y"
    data = deflate.compress(block) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert spdy.HeaderCodec().decode(data) == {"a": ["x", "y"]}
    # ... and unreadable without it: the dictionary is part of the format.
    with pytest.raises(zlib.error):
        zlib.decompressobj().decompress(data)


def test_wrong_version_and_truncated_blocks_are_protocol_errors() -> None:
    bad = struct.pack(">IBBH", 0x80000000 | (2 << 16) | spdy.PING, 0, 0, 0)
    with pytest.raises(spdy.ProtocolError):
        spdy.FrameReader().feed(bad)
    codec = spdy.HeaderCodec()
    deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
    truncated = deflate.compress(struct.pack(">II", 1, 99)) + deflate.flush(zlib.Z_SYNC_FLUSH)
    with pytest.raises(spdy.ProtocolError):
        codec.decode(truncated)
    with pytest.raises(spdy.ProtocolError):
        spdy.parse_syn_stream(codec, b"short")
