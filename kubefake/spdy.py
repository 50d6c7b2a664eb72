"""SPDY/3.1 frame codec for the fake apiserver.

kubectl before 1.30 (and client-go's remotecommand/portforward fallbacks) speak SPDY/3.1 after an
HTTP/1.1 ``Upgrade: SPDY/3.1``. This module only encodes and decodes frames; the exec and
port-forward servers that use it are separate. Written from the SPDY/3.1 draft:

- every frame has an 8-byte head. Control frames: bit 0 set, 15-bit version (3), 16-bit type,
  8-bit flags, 24-bit length. Data frames: bit 0 clear, 31-bit stream id, flags, length.
- name/value header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are zlib streams primed with the
  spec's fixed dictionary. The compression context lives for the whole session, one per
  direction, so each block is compressed with a SYNC_FLUSH and never a full finish.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3

SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02

_HEAD = struct.Struct(">IBBH")  # first word, flags, length high byte, length low 16 bits
MAX_FRAME_LENGTH = (1 << 24) - 1

# The header-block dictionary of the SPDY/3 draft (section 2.6.10.1): length-prefixed words,
# then a run of status codes, reason phrases, dates and media types. 1423 bytes.
# "200 OK" holds a space, so the words are split on "|".
_WORDS = (
    b"options|head|post|put|delete|trace|accept|accept-charset|accept-encoding|accept-language"
    b"|accept-ranges|age|allow|authorization|cache-control|connection|content-base"
    b"|content-encoding|content-language|content-length|content-location|content-md5"
    b"|content-range|content-type|date|etag|expect|expires|from|host|if-match"
    b"|if-modified-since|if-none-match|if-range|if-unmodified-since|last-modified|location"
    b"|max-forwards|pragma|proxy-authenticate|proxy-authorization|range|referer|retry-after"
    b"|server|te|trailer|transfer-encoding|upgrade|user-agent|vary|via|warning"
    b"|www-authenticate|method|get|status|200 OK|version|HTTP/1.1|url|public|set-cookie"
    b"|keep-alive|origin"
).split(b"|")
_TAIL = (
    b"100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    b"203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    b"401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    b"503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00"
    b" Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    b"application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    b"gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = b"".join(len(w).to_bytes(4, "big") + w for w in _WORDS) + _TAIL


class ProtocolError(Exception):
    """The peer sent bytes that are not SPDY/3.1 frames."""


@dataclass(frozen=True)
class ControlFrame:
    type: int
    flags: int
    payload: bytes


@dataclass(frozen=True)
class DataFrame:
    stream_id: int
    flags: int
    data: bytes


Frame = ControlFrame | DataFrame


def encode_control(type_: int, flags: int, payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_LENGTH:
        raise ValueError("control frame too long")
    first = 0x80000000 | (VERSION << 16) | type_
    return _HEAD.pack(first, flags, len(payload) >> 16, len(payload) & 0xFFFF) + payload


def encode_data(stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
    if len(data) > MAX_FRAME_LENGTH:
        raise ValueError("data frame too long")
    flags = FLAG_FIN if fin else 0
    head = _HEAD.pack(stream_id & 0x7FFFFFFF, flags, len(data) >> 16, len(data) & 0xFFFF)
    return head + data


@dataclass
class FrameReader:
    """Splits a byte stream into frames; feed() bytes as they arrive, then iterate frames()."""

    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= _HEAD.size:
            first, flags, len_hi, len_lo = _HEAD.unpack_from(self._buffer)
            length = (len_hi << 16) | len_lo
            end = _HEAD.size + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[_HEAD.size : end])
            del self._buffer[:end]
            if first & 0x80000000:
                version = (first >> 16) & 0x7FFF
                if version != VERSION:
                    raise ProtocolError(f"unsupported SPDY version {version}")
                frames.append(ControlFrame(first & 0xFFFF, flags, payload))
            else:
                frames.append(DataFrame(first & 0x7FFFFFFF, flags, payload))
        return frames


class HeaderCodec:
    """One session's two zlib contexts: deflate for what we send, inflate for what we read."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(zdict=DICTIONARY)
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)

    def encode(self, headers: dict[str, str]) -> bytes:
        block = bytearray(len(headers).to_bytes(4, "big"))
        for name, value in headers.items():
            for part in (name.lower().encode(), value.encode()):
                block += len(part).to_bytes(4, "big") + part
        return self._deflate.compress(bytes(block)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, compressed: bytes) -> dict[str, list[str]]:
        try:
            block = self._inflate.decompress(compressed)
        except zlib.error as exc:
            raise ProtocolError(f"bad header block: {exc}") from exc
        try:
            (count,) = struct.unpack_from(">I", block)
            offset = 4
            headers: dict[str, list[str]] = {}
            for _ in range(count):
                name, offset = _string(block, offset)
                value, offset = _string(block, offset)
                # A value may hold several values separated by NUL (SPDY/3 section 2.6.10).
                headers.setdefault(name.decode(), []).extend(v.decode() for v in value.split(b"\0"))
        except (struct.error, UnicodeDecodeError) as exc:
            raise ProtocolError(f"bad header block: {exc}") from exc
        return headers


def _string(block: bytes, offset: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from(">I", block, offset)
    start = offset + 4
    if start + length > len(block):
        raise struct.error("string runs past the header block")
    return block[start : start + length], start + length


def syn_stream_payload(codec: HeaderCodec, stream_id: int, headers: dict[str, str]) -> bytes:
    """SYN_STREAM body: stream id, associated id 0, priority 0, slot 0, header block."""
    return struct.pack(">IIH", stream_id, 0, 0) + codec.encode(headers)


def parse_syn_stream(codec: HeaderCodec, payload: bytes) -> tuple[int, dict[str, list[str]]]:
    if len(payload) < 10:
        raise ProtocolError("SYN_STREAM too short")
    (stream_id,) = struct.unpack_from(">I", payload)
    return stream_id & 0x7FFFFFFF, codec.decode(payload[10:])


def syn_reply_payload(codec: HeaderCodec, stream_id: int, headers: dict[str, str]) -> bytes:
    return struct.pack(">I", stream_id) + codec.encode(headers)


def parse_syn_reply(codec: HeaderCodec, payload: bytes) -> tuple[int, dict[str, list[str]]]:
    if len(payload) < 4:
        raise ProtocolError("SYN_REPLY too short")
    (stream_id,) = struct.unpack_from(">I", payload)
    return stream_id & 0x7FFFFFFF, codec.decode(payload[4:])
