"""One HTTP/1.1 connection to the apiserver, carrying one request at a time.

:class:`Connection` is the protocol of a connection the pool dialed: it writes a request as one
``write()``, hands every byte it reads to llhttp (the parser Node.js ships, through
``httptools``), and keeps the answer's head and body parts until the request's owner takes
them. The same connection carries a one-shot request, a stream (a watch, ``logs -f``) and an
upgrade (exec, attach, port-forward): after a 101 the parser steps aside and the transport is
handed to the caller as a plain byte stream (:meth:`Connection.take_stream`). It owns its
transport and is the only one that closes it, until that hand-over.

Framing is llhttp's (RFC 9112 section 6.3: chunked, Content-Length, or to the close; no body
for 1xx, 204, 304). Anything it refuses breaks the connection: the apiserver is a trusted peer,
so a broken message means a broken connection, not an attack to survive. Two things llhttp
leaves to its caller: the answer to a HEAD request has no body whatever its Content-Length says
(the answer ends with its head and the connection is not used again, so the parser never needs
to know), and the end of a body that runs to the close (``connection_lost`` ends it).
"""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import cast

import httptools
from multidict import CIMultiDict

from watchproxy.kube.headers import HOP_BY_HOP

# Reading pauses when this much of a body waits unread (a big LIST to a slow consumer).
HIGH_WATER = 1 << 18
# What a connection reads at most at once (its own buffer): most answers in one read.
READ_BUFFER_BYTES = 65536
# An answer's head (status line and fields) longer than this breaks the connection.
MAX_HEAD_BYTES = 65536
# TCP keepalive: a watch or an exec session may be silent for hours, so silence cannot mean a
# dead apiserver; keepalive probes find a peer that vanished (half-open) within about a minute.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 10, 3

# The hop-by-hop names (Content-Length among them) as llhttp hands names over: lower-case bytes,
# and their lengths: a field whose name has another length is not looked at (most of an
# apiserver's are not).
_HOP_BY_HOP = frozenset(name.encode("latin-1") for name in HOP_BY_HOP)
_HOP_BY_HOP_SIZES = frozenset(len(name) for name in _HOP_BY_HOP)


class Broken(Exception):
    """The connection ended or garbled the answer; ``before_answer``: no byte of it came, and
    the request may never have reached the apiserver."""

    def __init__(self, message: str, *, before_answer: bool = False) -> None:
        super().__init__(message)
        self.before_answer = before_answer


class ResponseHead:
    """An answer's head: status, fields (a CIMultiDict built when first asked for: the fast
    lane passes most heads on as they came and never asks), and the head's bytes as they came."""

    __slots__ = ("_fields", "_headers", "content_length", "passable", "raw", "reason", "status")

    def __init__(
        self,
        status: int,
        reason: str,
        fields: list[tuple[bytes, bytes]],
        raw: bytes,
        *,
        content_length: int | None,
        passable: bool,
    ) -> None:
        self.status = status
        self.reason = reason
        self._fields = fields
        self._headers: CIMultiDict[str] | None = None
        self.raw = raw  # the head's bytes as they came (b"": not kept)
        self.content_length = content_length  # its one Content-Length (None: none)
        # HTTP/1.1, no hop-by-hop field and exactly one Content-Length: a client may get the
        # head unchanged.
        self.passable = passable

    @property
    def headers(self) -> CIMultiDict[str]:
        if self._headers is None:
            self._headers = CIMultiDict(
                (name.decode("latin-1"), value.strip(b" \t").decode("latin-1"))
                for name, value in self._fields
            )
        return self._headers


class Connection(asyncio.BufferedProtocol):
    """One connection; carries one request and its answer at a time.

    Buffered: the TLS transport reads into this connection's own buffer. For a protocol that is
    not, uvloop's TLS transport allocates 256 KiB for every read, which glibc serves with mmap,
    mremap and munmap: three system calls and fresh pages for every answer.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()  # once: each lookup is a getpid() on 3.11
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self.idle_since = 0.0
        self.reused = False
        self._parser: httptools.HttpResponseParser | None = None
        self._head_request = False
        self._head_bytes = b""  # what arrived of the answer's head so far
        self._fields: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._head: ResponseHead | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._ended = False  # the answer's body is complete
        self._reusable = False  # ... and the connection may carry another request
        self._to_close = False  # the body runs to the close of the connection
        self._upgraded = False  # a 101: every byte now belongs to the new protocol
        self._extra = False  # a second answer began after this request's
        self._behind_switch: bytes | None = None  # after a 101's head, in the same reads
        self._error: Broken | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._answered = False
        self._expired = False  # the request's deadline passed before its answer's head came
        # The deadline for the answer's head (loop time; None: none in force) and the one timer
        # that checks it, armed lazily: a request's timer is rarely due, and one call_at and one
        # cancel per request were a timer handle made and dropped every time. The timer stays
        # armed past the answer and, when it fires, compares with the deadline then in force.
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is not an asyncio.Transport subclass, but has its methods.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in (
                ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
                ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                ("TCP_KEEPCNT", KEEPALIVE_COUNT),
            ):
                if hasattr(socket, option):  # Linux; other systems keep their defaults
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        # llhttp reads the buffer in place and hands each part of a body over as bytes of its
        # own: a copy of the read first (tobytes) would copy every byte of a body twice.
        self._received(self._buffer[:nbytes])

    def data_received(self, data: bytes) -> None:
        self._received(data)

    def _received(self, data: bytes | memoryview) -> None:
        """``data``: valid during the call only (the read buffer): kept, it is copied."""
        self._answered = True
        if self._upgraded:
            self._keep(bytes(data))
            self._wake()
            return
        parser = self._parser
        if parser is None or self._ended:
            # Nothing was asked (or the answer has ended): HTTP/1.1 answers only what was asked.
            self._break(Broken(f"{len(data)} unexpected bytes from the apiserver"))
            return
        if self._head is None:
            self._head_bytes += data
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # a 101 (on_headers_complete saw it)
        except httptools.HttpParserError as error:
            if self._behind_switch is None:
                self._break(Broken(f"the apiserver's answer is not HTTP/1.1: {error}"))
                return
        if self._behind_switch is not None:
            # Whatever llhttp made of the bytes behind a 101's head, they are the new protocol's.
            self._upgraded = True
            self._parser = None
            self._keep(self._behind_switch)
            self._behind_switch = None
        if self._head is None and len(self._head_bytes) > MAX_HEAD_BYTES:
            self._break(Broken(f"the apiserver's answer head is over {MAX_HEAD_BYTES} bytes"))
            return
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost says what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._to_close and self._head is not None and exc is None:
            self._ended = True  # the body that runs to the close has run to it
        elif not self._ended and self._error is None and self._parser is not None:
            reason = (
                f"the connection broke: {exc}" if exc else "the apiserver closed the connection"
            )
            self._error = Broken(reason, before_answer=not self._answered)
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    # llhttp's callbacks

    def on_message_begin(self) -> None:
        if self._head is not None:
            # A second answer to one request: nothing after it can be trusted.
            self._extra = True
            self._reusable = False

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._extra:
            self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        if self._extra:
            return
        status = parser.get_status_code()
        raw = self._head_bytes
        end = raw.find(b"\r\n\r\n")
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103): the real one follows.
            self._head_bytes = raw[end + 4 :] if end >= 0 else b""
            self._fields = []
            self._reason = b""
            return
        lengths = 0
        content_length: int | None = None
        hop_by_hop = framed = False
        for name, value in self._fields:
            if len(name) not in _HOP_BY_HOP_SIZES:
                continue
            lower = name.lower()
            if lower in _HOP_BY_HOP:
                if lower == b"content-length":
                    lengths += 1
                    content_length = int(value)  # llhttp checked its digits
                else:
                    hop_by_hop = True
                    framed = framed or lower == b"transfer-encoding"
        http11 = parser.get_http_version() == "1.1"
        self._head = ResponseHead(
            status,
            self._reason.decode("latin-1"),
            self._fields,
            raw[: end + 4] if end >= 0 else b"",
            content_length=content_length if lengths == 1 else None,
            passable=http11 and end >= 0 and lengths == 1 and not hop_by_hop,
        )
        self._head_bytes = b""
        if status == 101:
            # llhttp flags an upgrade only with "Connection: upgrade" beside it; a 101 is one
            # whatever the fields say. Every byte behind its head is the new protocol's.
            self._behind_switch = raw[end + 4 :] if end >= 0 else b""
        self._reusable = parser.should_keep_alive() and status != 101 and not self._extra
        framed = framed or lengths > 0 or status in (101, 204, 304) or self._head_request
        self._to_close = not framed  # its body runs to the close
        if self._head_request:
            # A HEAD answer has no body; llhttp is not told, so the connection ends here.
            self._ended = True
            self._reusable = False

    def on_body(self, body: bytes) -> None:
        if not self._head_request and not self._extra:
            self._keep(body)

    def on_message_complete(self) -> None:
        if self._head is not None and not self._extra:
            self._ended = True

    # the exchange

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, data: bytes, *, head_request: bool) -> None:
        assert self.transport is not None and self._error is None
        if self._parser is None:
            # One per connection: llhttp is ready for the next answer once one has ended.
            self._parser = httptools.HttpResponseParser(self)
        self._head_request = head_request
        self._head = None
        self._head_bytes = b""
        self._behind_switch = None
        self._fields = []
        self._reason = b""
        self._ended = False
        self._reusable = False
        self._to_close = False
        self._extra = False
        self._answered = False
        self._expired = False
        self.transport.write(data)

    def set_deadline(self, expires: float | None) -> None:
        """The answer's head must come by loop time ``expires`` (None: no deadline); past it,
        the wait for it ends in TimeoutError."""
        self._deadline = expires
        if expires is None:
            return
        timer = self._timer
        if timer is not None and self._timer_at <= expires:
            return  # it fires first and re-arms for this deadline
        if timer is not None:
            timer.cancel()
        self._timer_at = expires
        self._timer = self._loop.call_at(expires, self._check_deadline)

    def _check_deadline(self) -> None:
        self._timer = None
        expires = self._deadline
        if expires is None:
            return
        if self._loop.time() < expires:
            self._timer_at = expires
            self._timer = self._loop.call_at(expires, self._check_deadline)
            return
        self._deadline = None
        if self._head is None:  # the wait for it ends in TimeoutError
            self._expired = True
            self._wake()

    async def head(self) -> ResponseHead:
        while self._head is None:
            if self._error is not None:
                raise self._error
            if self._expired:
                raise TimeoutError
            await self._wait()
        return self._head

    @property
    def complete(self) -> bool:
        """The whole body has arrived."""
        return self._ended

    def take_all(self) -> bytes:
        """Every body byte that arrived and was not yet taken."""
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self._consumed(self._buffered)
        return data

    def take_parts(self) -> list[bytes]:
        """Every body part that arrived and was not yet taken, as llhttp handed them over."""
        parts = list(self._chunks)
        self._chunks.clear()
        self._consumed(self._buffered)
        return parts

    async def next_parts(self) -> list[bytes] | None:
        """The parts of the body that arrived and were not taken yet (at least one), or None
        at its end. An apiserver writes a watch's events one HTTP chunk each: a reader that
        takes them by the thousand takes a read's worth at once, each part as it came (not
        joined: joining copied every byte of a cold key's watch-list once more, into fresh
        pages, a fifth of the relay's CPU)."""
        if not await self._arrived():
            return None
        return self.take_parts()

    async def next_chunk(self) -> bytes | None:
        """The next part of the body, or None at its end."""
        if not await self._arrived():
            return None
        chunk = self._chunks.popleft()
        self._consumed(len(chunk))
        return chunk

    async def _arrived(self) -> bool:
        """Until a part of the body is there to take (True) or the body has ended (False)."""
        while not self._chunks:
            if self._ended:
                return False
            if self._error is not None:
                raise self._error
            await self._wait()
        return True

    @property
    def reusable(self) -> bool:
        """The answer ended and the connection may carry another request."""
        return self._ended and self._reusable and self.usable

    def take_stream(self, limit: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """After a 101: the connection as a byte stream (asyncio's public stream classes over
        this transport), with the bytes that came after the head first. The caller owns it from
        here: this connection never touches the transport again."""
        assert self._upgraded and self._head is not None, "not an upgraded connection"
        reader = asyncio.StreamReader(limit=limit, loop=self._loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=self._loop)
        data = self.take_all()
        if data:
            reader.feed_data(data)
        transport, self.transport = self.transport, None
        if not self.closed.done():
            # The pool's part in this connection is over: its new owner closes it.
            self.closed.set_result(None)
        if transport is None:
            # The apiserver closed it before the hand-over: what came is all there is.
            reader.feed_eof()
            return reader, _ClosedWriter.make(reader, protocol, self._loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._paused:
            self._paused = False
            transport.resume_reading()
        return reader, asyncio.StreamWriter(transport, protocol, reader, self._loop)

    def close(self) -> None:
        """Close the connection (its TLS shutdown ends in ``connection_lost``)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _keep(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._buffered += len(data)

    def _consumed(self, size: int) -> None:
        self._buffered -= size
        if self._paused and self._buffered <= HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _break(self, error: Broken) -> None:
        self._error = error
        self._parser = None
        self._wake()
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _ClosedWriter:
    """A writer for an upgraded connection the apiserver closed before the hand-over."""

    @staticmethod
    def make(
        reader: asyncio.StreamReader,
        protocol: asyncio.StreamReaderProtocol,
        loop: asyncio.AbstractEventLoop,
    ) -> asyncio.StreamWriter:
        transport = _GoneTransport()
        protocol.connection_made(transport)
        protocol.connection_lost(None)
        return asyncio.StreamWriter(transport, protocol, reader, loop)


class _GoneTransport(asyncio.Transport):
    """A transport already closed: writes go nowhere (the peer is gone)."""

    def __init__(self) -> None:
        super().__init__()

    def is_closing(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass
