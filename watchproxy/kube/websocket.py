"""Watches over WebSocket, as kube-apiserver 1.37 serves them: the handshake and the frames.

A watch request with ``Upgrade: websocket`` (fabric8 kubernetes-client asks for one on every
watch by default) is answered by the apiserver's ``WatchServer.HandleWS`` (apiserver
``pkg/endpoints/handlers/watch.go``) through ``golang.org/x/net/websocket``:

- The handshake is x/net's ``websocket.Handler``: it needs ``Sec-WebSocket-Version: 13``, a
  ``Sec-WebSocket-Key`` and an ``Origin`` header (no ``Origin``: 403); one offered subprotocol
  is echoed, more than one is refused (400), none is fine. Errors found before the watch starts
  (RBAC, a bad query) are plain HTTP answers, sent before any upgrade.
- Each event is one unfragmented message, exactly the bytes an HTTP watch writes for it without
  the stream's framing: a text message for a media type that encodes as text (JSON: the event's
  line with its ``\\n``), a binary one otherwise (protobuf: the event without its length
  prefix). No subprotocol changes that (``base64.binary.k8s.io`` is for log and exec streams,
  not watches).
- The server never pings. It reads and discards what the client sends, answers a ping with a
  pong carrying its payload, and ends the watch when the client closes. However the watch ends
  (``timeoutSeconds``, the client's close, an in-stream 410 ERROR after its one message), the
  server sends a close frame with status 1000 and no reason and closes the connection, without
  waiting for the client's close. An unmasked client frame is answered with close 1002.

Everything here is pure: bytes and headers in, bytes out (RFC 6455: server frames unmasked,
client frames masked).
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

# RFC 6455 section 1.3: appended to the client's key, hashed, base64-encoded.
_ACCEPT_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONTINUATION = 0x0
TEXT = 0x1
BINARY = 0x2
CLOSE = 0x8
PING = 0x9
PONG = 0xA

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
MAX_CONTROL_PAYLOAD = 125


def is_websocket_request(headers: Mapping[str, str]) -> bool:
    """``Upgrade: websocket`` and "upgrade" anywhere in ``Connection`` (a substring, not a
    token: the apiserver's ``wsstream.IsWebSocketRequest`` and x/net's handshake both ask
    so) — a watch the apiserver serves over WebSocket."""
    if headers.get("Upgrade", "").lower() != "websocket":
        return False
    return "upgrade" in headers.get("Connection", "").lower()


# What Go's url.ParseRequestURI takes (x/net parses the Origin so): an absolute URI (a scheme
# and a colon) or an absolute path, without control characters. "null" (a browser's opaque
# origin) is neither: 403.
_ORIGIN = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*:|/)[^\x00-\x1f\x7f]*")


@dataclass(frozen=True, slots=True)
class Handshake:
    """A WebSocket handshake the apiserver would accept: what the 101 answers it with."""

    accept: str  # Sec-WebSocket-Accept
    protocol: str | None  # the one subprotocol offered, echoed; None when none was

    def switching_headers(self) -> list[tuple[str, str]]:
        headers = [
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Accept", self.accept),
        ]
        if self.protocol is not None:
            headers.append(("Sec-WebSocket-Protocol", self.protocol))
        return headers


def accept_value(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _ACCEPT_GUID).digest()).decode()


def handshake(method: str, headers: Mapping[str, str]) -> Handshake | None:
    """The handshake of a WebSocket watch request, or None where the apiserver would refuse
    it (it answers those itself: a request the proxy relays unchanged)."""
    if method != "GET" or not is_websocket_request(headers):
        return None
    if headers.get("Sec-WebSocket-Version", "") != "13":
        return None
    key = headers.get("Sec-WebSocket-Key", "")
    if not key:
        return None  # x/net takes any other key as it comes, as RFC 6455's hash does
    if _ORIGIN.fullmatch(headers.get("Origin", "")) is None:
        return None  # x/net's websocket.Handler: no Origin ("null origin") or a bad one, 403
    offered = headers.get("Sec-WebSocket-Protocol", "").strip()
    protocols = [p.strip() for p in offered.split(",")] if offered else []
    if len(protocols) > 1:
        return None  # x/net picks none of several by itself: 400
    return Handshake(accept_value(key), protocols[0] if protocols else None)


def frame_header(opcode: int, length: int) -> bytes:
    """The head of one unfragmented, unmasked (server) frame carrying ``length`` bytes."""
    first = 0x80 | opcode
    if length < 126:
        return struct.pack("!BB", first, length)
    if length < 1 << 16:
        return struct.pack("!BBH", first, 126, length)
    return struct.pack("!BBQ", first, 127, length)


def frame(opcode: int, payload: bytes) -> bytes:
    return frame_header(opcode, len(payload)) + payload


def close_frame(code: int = CLOSE_NORMAL) -> bytes:
    """A close frame as x/net's ``Conn.Close`` sends it: the status code, no reason."""
    return frame(CLOSE, struct.pack("!H", code))


def event_messages(payload: bytes, *, binary: bool) -> Iterator[bytes]:
    """The events of an HTTP watch body's ``payload`` (whole events only), one message each:
    ``\\n``-terminated lines for text, 4-byte length-prefixed frames (prefix dropped) for
    binary."""
    at, end = 0, len(payload)
    if binary:
        while at < end:
            (length,) = struct.unpack_from("!I", payload, at)
            yield payload[at + 4 : at + 4 + length]
            at += 4 + length
        return
    while at < end:
        cut = payload.find(b"\n", at)
        cut = end if cut < 0 else cut + 1
        yield payload[at:cut]
        at = cut


def frame_events(payload: bytes, *, binary: bool) -> bytes:
    """Every event of ``payload`` as one WebSocket message."""
    opcode = BINARY if binary else TEXT
    return b"".join(
        frame_header(opcode, len(m)) + m for m in event_messages(payload, binary=binary)
    )


def frame_lines(lines: Sequence[bytes], *, binary: bool) -> list[bytes]:
    """``lines`` (whole events each) as buffers for ``writelines``: text lines are not copied,
    only their heads are made; a binary event is copied without its 4-byte prefix."""
    opcode = BINARY if binary else TEXT
    buffers: list[bytes] = []
    for line in lines:
        if binary:
            body = memoryview(line)[4:].tobytes() if len(line) > 4 else b""
            buffers.append(frame_header(opcode, len(body)))
            buffers.append(body)
        else:
            buffers.append(frame_header(opcode, len(line)))
            buffers.append(line)
    return buffers


class ProtocolError(Exception):
    """The client broke RFC 6455 (an unmasked frame, a long or fragmented control frame)."""


@dataclass(frozen=True, slots=True)
class ControlFrame:
    opcode: int
    payload: bytes


class ClientFrames:
    """Reads a client's frames from bytes as they arrive, keeping only control frames.

    A watch client has nothing to say but ping and close, so data frames are skipped as they
    stream by (never buffered, whatever their length). ``feed`` returns the control frames
    completed by the bytes given and raises :class:`ProtocolError` on a frame x/net refuses.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip = 0  # bytes of a data frame's payload still to skip

    def feed(self, data: bytes) -> list[ControlFrame]:
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = data[skipped:]
        self._buffer += data
        found: list[ControlFrame] = []
        while not self._skip:
            control = self._next()
            if control is None:
                break
            if control.opcode >= CLOSE:
                found.append(control)
        return found

    def _next(self) -> ControlFrame | None:
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        first, second = buffer[0], buffer[1]
        opcode = first & 0x0F
        if not second & 0x80:
            raise ProtocolError("an unmasked client frame")
        length = second & 0x7F
        at = 2
        if length == 126:
            if len(buffer) < 4:
                return None
            (length,) = struct.unpack_from("!H", buffer, 2)
            at = 4
        elif length == 127:
            if len(buffer) < 10:
                return None
            (length,) = struct.unpack_from("!Q", buffer, 2)
            at = 10
        if opcode >= CLOSE and (length > MAX_CONTROL_PAYLOAD or not first & 0x80):
            raise ProtocolError("a control frame longer than 125 bytes or fragmented")
        mask_at = at
        at += 4
        if opcode < CLOSE:
            # A data frame: drop its head and whatever of its payload is here, skip the rest.
            if len(buffer) < at:
                return None
            here = min(length, len(buffer) - at)
            del buffer[: at + here]
            self._skip = length - here
            return ControlFrame(opcode, b"")
        if len(buffer) < at + length:
            return None
        mask = buffer[mask_at:at]
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(buffer[at : at + length]))
        del buffer[: at + length]
        return ControlFrame(opcode, payload)
