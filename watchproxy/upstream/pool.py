"""Keep-alive HTTP/1.1 connections to the apiserver for requests that are not streams.

A controller sends thousands of small requests a second (GET, PATCH, a LIST page). Through
aiohttp's client each cost the proxy more CPU than the apiserver's own work on it: a request
object, a response object, a stream reader, a timer and a trace per request, the head and the
body written as separate TLS records. Here a request is one ``write()`` of its head and body,
and the answer is parsed by :class:`~watchproxy.upstream.http1.ResponseParser` as it arrives; a
small answer is usually complete after one read and is handed on whole.

Who owns what: the event loop creates and owns every socket (``loop.create_connection`` with a
host and port, never a socket handed over: see ``upstream.connector``); each
:class:`~watchproxy.upstream.keepalive.PooledConnection` owns its transport and is the only one
that closes it; the :class:`ConnectionPool` owns the idle connections and, at
:meth:`ConnectionPool.close`, every connection it ever dialed that is still open. Dials go
through the :class:`Dialer` the aiohttp connector also uses, so there is still one dial at a
time and none while the upstream is down.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Callable
from typing import Protocol

from watchproxy.upstream.http1 import Broken
from watchproxy.upstream.keepalive import PooledConnection
from watchproxy.upstream.response import PooledAnswer

# An idle connection is closed after this long. The apiserver closes idle connections after
# 90 s (its http.Server IdleTimeout); closing well before that means a request is never sent on
# a connection the apiserver is closing at that moment.
MAX_IDLE_SECONDS = 30.0
# Idle connections kept at most; more concurrent requests dial more, and the rest close.
MAX_IDLE = 64


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
        self._loop: asyncio.AbstractEventLoop | None = None

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
        read_timeout: float | None = None,
        deadline: float | None = None,
    ) -> PooledAnswer:
        """Send one request (its encoded head and body) and wait for the head of its answer.
        ``read_timeout``: the longest silence while the answer's body is read.

        A reused connection the apiserver closed just as the request went out fails before any
        byte of an answer; ``may_resend`` (an idempotent request) sends
        it once more on a fresh connection. Raises Broken, or whatever the dialer raises.
        """
        if ssl_context is not self._ssl_context:
            # A rotated CA: connections made with the old trust are not kept for new requests.
            self._ssl_context = ssl_context
            self._drop_idle()
        loop = self._loop
        if loop is None:  # once: each lookup is a getpid() on 3.11
            loop = self._loop = asyncio.get_running_loop()
        expires = None if deadline is None else loop.time() + deadline
        for attempt in range(2):
            connection = self._take_idle()
            if connection is None:
                connection = await self._dial(ssl_context, connect_timeout)
            connection.send(data, head_request=head_request)
            connection.set_deadline(expires)
            resend = False
            try:
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
                connection.set_deadline(None)
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
