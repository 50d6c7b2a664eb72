"""WebSocket watches, the pure part: the handshake the apiserver accepts, server frames (RFC
6455's own examples), one message per event, and the client's control frames read from bytes
however they are split."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from watchproxy.kube import websocket as ws

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 section 1.3


def headers(**extra: str) -> CIMultiDict[str]:
    base = {
        "Upgrade": "websocket",
        "Connection": "keep-alive, Upgrade",
        "Sec-WebSocket-Key": KEY,
        "Sec-WebSocket-Version": "13",
        "Origin": "http://127.0.0.1:8001",
    }
    base.update({name.replace("_", "-"): value for name, value in extra.items()})
    return CIMultiDict((k, v) for k, v in base.items() if v)


def masked(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bytes = b"\x37\xfa\x21\x3d"
) -> bytes:
    first = (0x80 if fin else 0) | opcode
    length = len(payload)
    if length < 126:
        head = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, length)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_the_accept_value_is_rfc_6455s() -> None:
    assert ws.accept_value(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_a_websocket_watch_request_gets_its_handshake_with_its_one_subprotocol_echoed() -> None:
    plain = ws.handshake("GET", headers())
    assert plain == ws.Handshake("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", None)
    assert ("Sec-WebSocket-Accept", plain.accept) in plain.switching_headers()
    one = ws.handshake("GET", headers(Sec_WebSocket_Protocol=" v4.channel.k8s.io "))
    assert one is not None and one.protocol == "v4.channel.k8s.io"
    assert ("Sec-WebSocket-Protocol", "v4.channel.k8s.io") in one.switching_headers()


@pytest.mark.parametrize(
    ("method", "hdrs"),
    [
        ("POST", headers()),
        ("GET", headers(Upgrade="SPDY/3.1")),
        ("GET", headers(Connection="keep-alive")),
        ("GET", headers(Sec_WebSocket_Version="8")),
        ("GET", headers(Sec_WebSocket_Key="")),
        ("GET", headers(Origin="")),  # x/net: "null origin", 403
        ("GET", headers(Origin="null")),  # not a URI Go's ParseRequestURI takes: 403
        ("GET", headers(Sec_WebSocket_Protocol="a, b")),  # x/net picks none of several: 400
    ],
    ids=[
        "post",
        "spdy",
        "no-connection-upgrade",
        "version-8",
        "no-key",
        "no-origin",
        "opaque-origin",
        "two-subprotocols",
    ],
)
def test_a_handshake_the_apiserver_refuses_is_left_to_it(
    method: str, hdrs: CIMultiDict[str]
) -> None:
    assert ws.handshake(method, hdrs) is None


def test_server_frames_are_unmasked_with_rfc_6455s_length_encodings() -> None:
    assert ws.frame(ws.TEXT, b"Hello") == b"\x81\x05Hello"
    assert ws.frame(ws.PONG, b"Hello") == b"\x8a\x05Hello"
    assert ws.frame(ws.BINARY, b"x" * 256)[:4] == b"\x82\x7e\x01\x00"
    assert ws.frame(ws.BINARY, b"x" * 65536)[:10] == b"\x82\x7f\x00\x00\x00\x00\x00\x01\x00\x00"
    assert ws.frame_header(ws.TEXT, 125) == b"\x81\x7d"
    assert ws.frame_header(ws.TEXT, 65535) == b"\x81\x7e\xff\xff"
    assert ws.close_frame() == b"\x88\x02\x03\xe8"  # status 1000, no reason


def test_each_event_line_is_one_text_message_with_its_newline() -> None:
    lines = [b'{"type":"ADDED"}\n', b'{"type":"MODIFIED","object":{"x":"' + b"y" * 300 + b'"}}\n']
    framed = ws.frame_events(b"".join(lines), binary=False)
    assert framed == b"".join(ws.frame(ws.TEXT, line) for line in lines)
    assert b"".join(ws.frame_lines(lines, binary=False)) == framed


def test_each_length_prefixed_event_is_one_binary_message_without_its_prefix() -> None:
    events = [b"k8s\x00one", b"k8s\x00" + os.urandom(70000)]
    body = b"".join(struct.pack("!I", len(e)) + e for e in events)
    assert list(ws.event_messages(body, binary=True)) == events
    framed = ws.frame_events(body, binary=True)
    assert framed == b"".join(ws.frame(ws.BINARY, e) for e in events)
    prefixed = [struct.pack("!I", len(e)) + e for e in events]
    assert b"".join(ws.frame_lines(prefixed, binary=True)) == framed


def test_rfc_6455s_masked_hello_is_a_data_frame_the_reader_skips() -> None:
    reader = ws.ClientFrames()
    assert reader.feed(b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58") == []
    assert reader.feed(masked(ws.PING, b"Hello")) == [ws.ControlFrame(ws.PING, b"Hello")]


@given(
    data=st.lists(st.binary(max_size=70000), max_size=4),
    ping=st.binary(max_size=125),
    cuts=st.lists(st.integers(min_value=1, max_value=4096), max_size=50),
)
def test_control_frames_are_found_however_the_bytes_are_split(
    data: list[bytes], ping: bytes, cuts: list[int]
) -> None:
    wire = b"".join(masked(ws.TEXT, d) for d in data) + masked(ws.PING, ping)
    wire += masked(ws.BINARY, b"z" * 300) + masked(ws.CLOSE, b"\x03\xe8")
    reader = ws.ClientFrames()
    found: list[ws.ControlFrame] = []
    at = 0
    for cut in cuts:
        found += reader.feed(wire[at : at + cut])
        at += cut
    found += reader.feed(wire[at:])
    assert found == [ws.ControlFrame(ws.PING, ping), ws.ControlFrame(ws.CLOSE, b"\x03\xe8")]


@pytest.mark.parametrize(
    "wire",
    [
        b"\x89\x05Hello",  # unmasked: x/net answers close 1002
        masked(ws.PING, b"x" * 126),
        masked(ws.PING, b"x", fin=False),
    ],
    ids=["unmasked", "long-control", "fragmented-control"],
)
def test_a_frame_x_net_refuses_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(ws.ProtocolError):
        ws.ClientFrames().feed(wire)
