"""One keep-alive HTTP/1.1 connection to the apiserver, carrying one request at a time.

:class:`PooledConnection` is the protocol of a connection that ``upstream.pool`` dialed: it
writes a request as one ``write()``, feeds what it reads to
:class:`~watchproxy.upstream.http1.ResponseParser`, and keeps the answer's head and body parts
until the request's owner takes them. It owns its transport and is the only one that closes it;
the pool owns the connection while it is idle.
"""

from __future__ import annotations

import asyncio
import collections
from typing import cast

from watchproxy.upstream.http1 import (
    Broken,
    EndOfMessage,
    ProtocolError,
    ResponseHead,
    ResponseParser,
)

# Reading pauses when this much of a body waits unread (a big LIST to a slow consumer).
HIGH_WATER = 1 << 18
# What a connection reads at most at once (its own buffer): most answers in one read.
READ_BUFFER_BYTES = 65536


class PooledConnection(asyncio.BufferedProtocol):
    """One connection; carries one request and its answer at a time.

    Buffered: the TLS transport reads into this connection's own buffer. For a protocol that is
    not, uvloop's TLS transport allocates 256 KiB for every read, which glibc serves with mmap,
    mremap and munmap: three system calls and fresh pages for every answer (seen with strace
    on a busy controller's proxy).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()  # once: each lookup is a getpid() on 3.11
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self.idle_since = 0.0
        self.reused = False
        self._parser = ResponseParser()
        self._head: ResponseHead | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._end: EndOfMessage | None = None
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

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        self._answered = True
        try:
            events = self._parser.feed(data)
        except ProtocolError as error:
            self._break(Broken(f"the apiserver's answer is not HTTP/1.1: {error}"))
            return
        self._take(events)

    def eof_received(self) -> bool:
        try:
            events = self._parser.feed_eof()
        except ProtocolError as error:
            self._break(Broken(str(error), before_answer=not self._answered))
            return False
        self._take(events)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._end is None and self._error is None and not self._parser.idle:
            reason = (
                f"the connection broke: {exc}" if exc else "the apiserver closed the connection"
            )
            self._error = Broken(reason, before_answer=not self._answered)
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    # the exchange

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, data: bytes, *, head_request: bool) -> None:
        assert self.transport is not None and self._parser.idle
        self._head = None
        self._end = None
        self._error = None
        self._answered = False
        self._expired = False
        self._parser.expect(head_request=head_request)
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
        return self._end is not None

    def take_all(self) -> bytes:
        """Every body byte that arrived and was not yet taken."""
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self._consumed(self._buffered)
        return data

    async def next_chunk(self) -> bytes | None:
        """The next part of the body, or None at its end."""
        while not self._chunks:
            if self._end is not None:
                return None
            if self._error is not None:
                raise self._error
            await self._wait()
        chunk = self._chunks.popleft()
        self._consumed(len(chunk))
        return chunk

    @property
    def reusable(self) -> bool:
        """The answer ended and the connection may carry another request."""
        return self._end is not None and self._end.reusable and self.usable

    def close(self) -> None:
        """Close the connection (its TLS shutdown ends in ``connection_lost``)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _take(self, events: list[ResponseHead | bytes | EndOfMessage]) -> None:
        for event in events:
            if isinstance(event, bytes):
                if event:
                    self._chunks.append(event)
                    self._buffered += len(event)
            elif isinstance(event, ResponseHead):
                self._head = event
            else:
                self._end = event
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _consumed(self, size: int) -> None:
        self._buffered -= size
        if self._paused and self._buffered <= HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _break(self, error: Broken) -> None:
        self._error = error
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
