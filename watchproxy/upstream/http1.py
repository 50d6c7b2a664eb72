"""HTTP/1.1 as watchproxy speaks it to the apiserver: request heads out, responses in.

A pure state machine in the manner of h11: :class:`ResponseParser` is fed the bytes a
connection receives and returns what they complete (a head, body bytes, the end of the
message); it never touches a socket, so every framing rule is tested with plain bytes. The
connection around it (``upstream.pool``) only moves bytes.

Framing follows RFC 9112 section 6.3, in its order: no body after a HEAD request or for a 1xx,
204 or 304 answer; ``Transfer-Encoding: chunked``; ``Content-Length``; otherwise the body runs to
the close of the connection. Anything that does not parse is a :class:`ProtocolError` and the
connection is not used again: the apiserver is a trusted peer, so a broken message means a
broken connection, not an attack to be survived.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from multidict import CIMultiDict

from watchproxy.kube.headers import HOP_BY_HOP

MAX_HEAD_BYTES = 65536
MAX_CHUNK_LINE = 4096

# The hop-by-hop names, and their lengths as bits of one int: a field whose name has another
# length is not looked at (most of an apiserver's are not).
_HOP_BY_HOP: Final = HOP_BY_HOP
_HOP_BY_HOP_SIZES: Final = sum(1 << size for size in {len(name) for name in HOP_BY_HOP})
_LONGEST_HOP_BY_HOP: Final = max(len(name) for name in HOP_BY_HOP) + 1

# Parser states. Plain ints: the parser runs for every request the proxy forwards.
_IDLE: Final = 0  # no response expected: bytes now are a protocol error
_HEAD: Final = 1
_LENGTH: Final = 2
_CHUNK_SIZE: Final = 3
_CHUNK_DATA: Final = 4
_CHUNK_END: Final = 5
_TRAILERS: Final = 6
_UNTIL_CLOSE: Final = 7


class ProtocolError(Exception):
    """The bytes from upstream are not an HTTP/1.1 response this connection can carry."""


class Broken(Exception):
    """The connection ended or garbled the answer; ``before_answer``: no byte of it came, and
    the request may never have reached the apiserver."""

    def __init__(self, message: str, *, before_answer: bool = False) -> None:
        super().__init__(message)
        self.before_answer = before_answer


class ResponseHead:
    """An answer's head. Its status line and framing are read when it arrives and every line is
    checked then; its fields are parsed into :attr:`headers` only when first asked for. The
    fast lane passes most heads on as they came (:attr:`passable`) and never asks: building the
    fields was a tenth of the proxy's instructions per proxied request (callgrind)."""

    __slots__ = (
        "_headers",
        "_text",
        "chunked",
        "content_length",
        "http10",
        "keep_alive",
        "passable",
        "raw",
        "reason",
        "status",
    )

    def __init__(
        self,
        status: int,
        reason: str,
        text: str,
        raw: bytes,
        *,
        http10: bool,
        content_length: int | None,
        chunked: bool,
        keep_alive: bool,
        passable: bool,
    ) -> None:
        self.status = status
        self.reason = reason
        self._text = text
        self._headers: CIMultiDict[str] | None = None
        self.http10 = http10
        self.raw = b"" if http10 else raw  # the head's bytes as they came (HTTP/1.1 only)
        self.content_length = content_length  # its one Content-Length (None: none, or chunked)
        self.chunked = chunked  # Transfer-Encoding: chunked
        self.keep_alive = keep_alive  # neither HTTP/1.0 nor Connection: close
        # No hop-by-hop field and exactly one Content-Length: a client may get it unchanged.
        self.passable = passable

    @property
    def headers(self) -> CIMultiDict[str]:
        if self._headers is None:
            self._headers = _fields(self._text)
        return self._headers


class EndOfMessage:
    """The response's body is complete; ``reusable`` says whether the connection may carry
    another request (not after ``Connection: close``, an HTTP/1.0 answer or a body that ran
    to the close)."""

    __slots__ = ("reusable",)

    def __init__(self, reusable: bool) -> None:
        self.reusable = reusable


Event = ResponseHead | bytes | EndOfMessage


def encode_fields(fields: Mapping[str, str]) -> str:
    """Header lines, each ending in CRLF. A line break in a name or a value would let a client
    add headers of its own choosing upstream: ValueError, before anything is sent."""
    lines = [f"{name}: {value}\r\n" for name, value in fields.items()]
    text = "".join(lines)
    # Checked once, whole: a CR or LF anywhere but at the end of a line is a line break inside
    # a name or a value.
    if text.count("\r") != len(lines) or text.count("\n") != len(lines):
        broken = next(n for n, v in fields.items() if "\r" in n + v or "\n" in n + v)
        raise ValueError(f"header {broken[:40]!r} holds a line break")
    for name in fields:
        if ":" in name:
            raise ValueError(f"header {name[:40]!r} holds a colon")
    return text


def encode_head(
    method: str,
    target: str,
    host: str,
    headers: Mapping[str, str] | HeaderBlock,
    *,
    extra: str = "",
) -> bytes:
    """A request head: its fields, then ``extra`` (lines that end in CRLF, checked by the
    caller). The target is a client's, as its request line held it (no line break can), or
    the proxy's own."""
    fields = headers.encoded if isinstance(headers, HeaderBlock) else encode_fields(headers)
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{fields}{extra}\r\n"
    return head.encode("latin-1")


class HeaderBlock:
    """Request fields that many requests send alike (what goes upstream for a client's
    repeated header lines): read-only, and encoded for the wire once, when first sent."""

    __slots__ = ("_encoded", "fields")

    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields = fields  # never changed once here: the encoding is kept
        self._encoded: str | None = None

    @property
    def encoded(self) -> str:
        if self._encoded is None:
            self._encoded = encode_fields(self.fields)
        return self._encoded


def parse_head(head: bytes) -> tuple[int, str, CIMultiDict[str], bool]:
    """Status, reason, headers of a response head (ending in a blank line), and whether it is
    HTTP/1.0."""
    read = read_head(head)
    return read.status, read.reason, read.headers, read.http10


def read_head(head: bytes) -> ResponseHead:
    """A response head (ending in a blank line), checked line by line, its framing read; its
    fields are parsed later, if asked for. ProtocolError when it is not HTTP/1.x."""
    text = head.decode("latin-1")
    line_end = text.find("\r\n")
    version, _, after = text[:line_end].partition(" ")
    code, _, reason = after.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.1 status line: {text[:line_end][:80]!r}")
    # One pass over the field lines: each must have a name and a colon, and only the
    # hop-by-hop ones (framing among them) are looked at; none is split yet.
    lengths: list[str] = []
    encodings: list[str] = []
    hop_by_hop = closes = False
    at = line_end + 2
    end = len(text) - 2  # the blank line
    while at < end:
        stop = text.find("\n", at) - 1  # one character: found by memchr
        colon = text.find(":", at, stop)
        first = text[at]
        last = text[colon - 1]
        if (
            colon <= at
            or text[stop] != "\r"  # a bare LF: not from an apiserver
            or first == " "  # folded (obs-fold)
            or first == "\t"
            or last == " "  # space before the colon
            or last == "\t"
        ):
            raise ProtocolError(f"malformed header line: {text[at:stop][:80]!r}")
        size = colon - at
        if size < _LONGEST_HOP_BY_HOP and (_HOP_BY_HOP_SIZES >> size) & 1:
            name = text[at:colon].lower()
            if name in _HOP_BY_HOP:
                value = text[colon + 1 : stop].strip(" \t")
                if name == "content-length":
                    lengths.append(value)
                elif name == "transfer-encoding":
                    encodings.append(value)
                    hop_by_hop = True
                else:
                    hop_by_hop = True
                    closes = closes or (name == "connection" and "close" in value.lower())
        at = stop + 2
    if lengths and (lengths.count(lengths[0]) != len(lengths) or not lengths[0].isdigit()):
        raise ProtocolError(f"bad Content-Length {lengths!r:.60}")
    if encodings and (len(encodings) != 1 or encodings[0].lower() != "chunked" or lengths):
        raise ProtocolError(f"unsupported Transfer-Encoding {encodings!r:.60}")
    http10 = version == "HTTP/1.0"
    return ResponseHead(
        int(code),
        reason,
        text,
        head,
        http10=http10,
        content_length=int(lengths[0]) if lengths else None,
        chunked=bool(encodings),
        keep_alive=not http10 and not closes,
        passable=not http10 and len(lengths) == 1 and not hop_by_hop,
    )


def _fields(text: str) -> CIMultiDict[str]:
    """The fields of a head that :func:`read_head` checked."""
    headers: CIMultiDict[str] = CIMultiDict()
    for line in text.split("\r\n")[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.add(name, value.strip(" \t"))
    return headers


class ResponseParser:
    """Responses on one connection, one after another, each asked for by :meth:`expect`."""

    __slots__ = ("_buffer", "_keep_alive", "_no_body", "_remaining", "_state")

    def __init__(self) -> None:
        self._state = _IDLE
        self._buffer = b""
        self._remaining = 0
        self._keep_alive = True
        self._no_body = False

    @property
    def idle(self) -> bool:
        """No response is under way (the last one ended, or none was asked for)."""
        return self._state == _IDLE

    def expect(self, *, head_request: bool = False) -> None:
        """A request was sent: parse its response next. ``head_request``: it has no body."""
        if self._state != _IDLE:
            raise ProtocolError("a response is still under way")
        self._state = _HEAD
        self._no_body = head_request

    def feed(self, data: bytes) -> list[Event]:
        """The events ``data`` completes, in order. Bytes after the end of a response that
        nobody asked for are a protocol error (HTTP/1.1 answers only what was asked)."""
        events: list[Event] = []
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        view = memoryview(data)
        at = 0
        end = len(data)
        while at < end:
            state = self._state
            if state == _LENGTH:
                take = min(self._remaining, end - at)
                events.append(data if at == 0 and take == end else bytes(view[at : at + take]))
                at += take
                self._remaining -= take
                if self._remaining == 0:
                    events.append(self._finish())
            elif state == _UNTIL_CLOSE:
                events.append(bytes(view[at:]) if at else data)
                at = end
            elif state == _HEAD:
                stop = data.find(b"\r\n\r\n", at)
                if stop < 0:
                    self._keep(data, at, MAX_HEAD_BYTES, "response head")
                    break
                head = self._begin(data[at : stop + 4])
                at = stop + 4
                if head is not None:
                    events.append(head)
                    if self._state == _IDLE:  # a message without a body ends with its head
                        events.append(EndOfMessage(self._keep_alive))
            elif state == _CHUNK_SIZE:
                stop = data.find(b"\r\n", at)
                if stop < 0:
                    self._keep(data, at, MAX_CHUNK_LINE, "chunk size line")
                    break
                size_text = data[at:stop].split(b";", 1)[0].strip(b" \t")
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                if size < 0 or size_text[:1] in (b"+", b"-") or size_text.startswith(b"0x"):
                    raise ProtocolError(f"bad chunk size {size_text[:20]!r}")
                at = stop + 2
                if size == 0:
                    self._state = _TRAILERS
                else:
                    self._state = _CHUNK_DATA
                    self._remaining = size
            elif state == _CHUNK_DATA:
                take = min(self._remaining, end - at)
                events.append(bytes(view[at : at + take]))
                at += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _CHUNK_END
            elif state == _CHUNK_END:
                if end - at < 2:
                    self._keep(data, at, 2, "chunk end")
                    break
                if data[at : at + 2] != b"\r\n":
                    raise ProtocolError("a chunk does not end with CRLF")
                at += 2
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                stop = data.find(b"\r\n", at)
                if stop < 0:
                    self._keep(data, at, MAX_HEAD_BYTES, "trailer")
                    break
                line_was_empty = stop == at
                at = stop + 2
                if line_was_empty:  # trailers (ignored: nothing the proxy forwards uses them)
                    events.append(self._finish())
            else:
                raise ProtocolError(f"{end - at} unexpected bytes after the response")
        return events

    def feed_eof(self) -> list[Event]:
        """The connection closed: that ends a body that runs to the close; anywhere else in a
        message it is a truncated response."""
        if self._state == _UNTIL_CLOSE:
            self._state = _IDLE
            return [EndOfMessage(False)]
        if self._state == _IDLE:
            return []
        raise ProtocolError("the connection closed in the middle of a response")

    def _keep(self, data: bytes, at: int, limit: int, what: str) -> None:
        rest = data[at:]
        if len(rest) > limit:
            raise ProtocolError(f"{what} longer than {limit} bytes")
        self._buffer = rest

    def _finish(self) -> EndOfMessage:
        self._state = _IDLE
        return EndOfMessage(self._keep_alive)

    def _begin(self, data: bytes) -> ResponseHead | None:
        head = read_head(data)
        status = head.status
        if 100 <= status < 200 and status != 101:
            return None  # an interim answer (100 Continue, 103): the real one follows
        self._keep_alive = head.keep_alive
        if self._no_body or status in (204, 304) or 100 <= status < 200:
            self._state = _IDLE
            if status == 101:
                self._keep_alive = False  # the connection now belongs to another protocol
            return head
        if head.chunked:
            self._state = _CHUNK_SIZE
            return head
        if head.content_length is not None:
            self._remaining = head.content_length
            self._state = _LENGTH if self._remaining else _IDLE
            return head
        self._keep_alive = False
        self._state = _UNTIL_CLOSE
        return head
