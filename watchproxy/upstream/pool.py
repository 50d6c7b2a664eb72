"""Keep-alive HTTP/1.1 connections to the apiserver for requests that are not streams.

A controller sends thousands of small requests a second (GET, PATCH, a LIST page). Through
aiohttp's client each cost the proxy more CPU than the apiserver's own work on it: a request
object, a response object, a stream reader, a timer and a trace per request, the head and the
body written as separate TLS records. Here a request is one ``write()`` of its head and body,
and the answer is parsed by :class:`~watchproxy.upstream.http1.ResponseParser` as it arrives; a
small answer is usually complete after one read and is handed on whole.

Who owns what: the event loop creates and owns every socket (``loop.create_connection`` with a
host and port, never a socket handed over: see ``upstream.connector``); each
:class:`PooledConnection` owns its transport and is the only one that closes it; the
:class:`ConnectionPool` owns the idle connections and, at :meth:`ConnectionPool.close`, every
connection it ever dialed that is still open. Dials go through the :class:`Dialer` the aiohttp
connector also uses, so there is still one dial at a time and none while the upstream is down.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterable, Callable
from typing import Protocol, cast

from watchproxy.upstream.http1 import (
    Broken,
    EndOfMessage,
    ProtocolError,
    ResponseHead,
    ResponseParser,
)
from watchproxy.upstream.response import PooledAnswer

# Reading pauses when this much of a body waits unread (a big LIST to a slow consumer).
HIGH_WATER = 1 << 18
# An idle connection is closed after this long. The apiserver closes idle connections after
# 90 s (its http.Server IdleTimeout); closing well before that means a request is never sent on
# a connection the apiserver is closing at that moment.
MAX_IDLE_SECONDS = 30.0
# Idle connections kept at most; more concurrent requests dial more, and the rest close.
MAX_IDLE = 64
# What a connection reads at most at once (its own buffer): most answers in one read.
READ_BUFFER_BYTES = 65536


class Dialer(Protocol):
    """Opens connections: one at a time, none while the upstream is down (the connector)."""

    async def dial(
        self,
        factory: Callable[[], asyncio.BaseProtocol],
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        timeout: float,
    ) -> None: ...


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
        self._writable: asyncio.Future[None] | None = None  # set while the socket buffer is full
        self._expired = False  # the request's deadline passed before its answer's head came

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
        if self._end is None and self._error is None and not self._parser.idle:
            reason = (
                f"the connection broke: {exc}" if exc else "the apiserver closed the connection"
            )
            self._error = Broken(reason, before_answer=not self._answered)
        self._wake()
        self.resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

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

    def expire(self) -> None:
        """The caller's deadline for the answer's head has passed: its wait ends in TimeoutError
        (a timer of the loop's calls this; cheaper per request than an asyncio.timeout)."""
        if self._head is None:
            self._expired = True
            self._wake()
            self.resume_writing()

    async def send_body(self, body: AsyncIterable[bytes], *, chunked: bool) -> None:
        """Write a request body as it comes, at the pace the apiserver reads it. An answer that
        comes before the end (a refusal) stops the writing; the answer is what counts."""
        async for part in body:
            if self._head is not None or self._error is not None:
                return
            if self.transport is None:
                raise Broken("the connection closed while the request body was sent")
            if part:
                self.transport.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            if self._writable is not None:
                await self._writable
            if self._expired:
                raise TimeoutError
        if chunked and self.transport is not None and self._head is None:
            self.transport.write(b"0\r\n\r\n")

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


class ConnectionPool:
    """Idle keep-alive connections to one apiserver, and the dials that make new ones."""

    def __init__(
        self,
        dialer: Dialer,
        host: str,
        port: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dialer = dialer
        self._host = host
        self._port = port
        self._clock = clock
        self._idle: collections.deque[PooledConnection] = collections.deque()
        self._open: set[PooledConnection] = set()
        self._ssl_context: ssl.SSLContext | None = None

    def open_connections(self) -> int:
        return len(self._open)

    async def request(
        self,
        data: bytes,
        *,
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float,
        head_request: bool = False,
        may_resend: bool,
        body: AsyncIterable[bytes] | None = None,
        chunked: bool = False,
        read_timeout: float | None = None,
        deadline: float | None = None,
    ) -> PooledAnswer:
        """Send one request (its encoded head, and its body when it is bytes) and wait for the
        head of its answer. ``body``: a body streamed after the head (``chunked``: framed in
        chunks, its length unknown). ``read_timeout``: the longest silence while its body is read.

        A reused connection the apiserver closed just as the request went out fails before any
        byte of an answer; ``may_resend`` (an idempotent request whose body is in ``data``) sends
        it once more on a fresh connection. Raises Broken, or whatever the dialer raises.
        """
        if body is not None:
            may_resend = False  # a streamed body cannot be sent twice
        if ssl_context is not self._ssl_context:
            # A rotated CA: connections made with the old trust are not kept for new requests.
            self._ssl_context = ssl_context
            self._drop_idle()
        loop = asyncio.get_running_loop()
        expires = None if deadline is None else loop.time() + deadline
        for attempt in range(2):
            connection = self._take_idle()
            if connection is None:
                connection = await self._dial(ssl_context, connect_timeout)
            connection.send(data, head_request=head_request)
            timer = None if expires is None else loop.call_at(expires, connection.expire)
            resend = False
            try:
                if body is not None:
                    await connection.send_body(body, chunked=chunked)
                head = await connection.head()
            except Broken as broken:
                connection.abort()
                resend = attempt == 0 and connection.reused and broken.before_answer and may_resend
                if not resend:
                    raise
            except BaseException:
                connection.abort()  # cancelled or timed out mid-request: the state is unknown
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if resend:  # (a `continue` inside the try would not compile with mypyc)
                continue
            return PooledAnswer(self, connection, head, read_timeout)
        raise AssertionError("unreachable")  # pragma: no cover

    def put(self, connection: PooledConnection) -> None:
        if len(self._idle) >= MAX_IDLE:
            connection.close()
            return
        connection.idle_since = self._clock()
        connection.reused = True
        self._idle.append(connection)

    def close_idle(self) -> None:
        self._drop_idle()

    async def close(self, timeout: float) -> None:
        """Close every connection; wait up to ``timeout`` for their TLS shutdown, then abort
        the stragglers (a peer slow to answer close_notify)."""
        self._drop_idle()
        for connection in list(self._open):
            connection.close()
        pending = [c.closed for c in self._open if not c.closed.done()]
        if pending:
            _done, late = await asyncio.wait(pending, timeout=timeout)
            if late:
                for connection in list(self._open):
                    connection.abort()
                await asyncio.wait(late, timeout=timeout)

    def _take_idle(self) -> PooledConnection | None:
        now = self._clock()
        while self._idle:
            connection = self._idle.pop()  # the most recent: the least likely to time out
            if connection.usable and now - connection.idle_since < MAX_IDLE_SECONDS:
                self._expire(now)
                return connection
            connection.close()
        return None

    def _expire(self, now: float) -> None:
        while self._idle and now - self._idle[0].idle_since >= MAX_IDLE_SECONDS:
            self._idle.popleft().close()

    def _drop_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _dial(
        self, ssl_context: ssl.SSLContext | None, connect_timeout: float
    ) -> PooledConnection:
        connection = PooledConnection()
        await self._dialer.dial(
            lambda: connection, self._host, self._port, ssl_context, connect_timeout
        )
        self._open.add(connection)
        connection.closed.add_done_callback(lambda _: self._open.discard(connection))
        return connection
