"""Who parses a client connection's requests: the fast lane, or aiohttp's server.

:class:`Lanes` sits inside the connection's :class:`~watchproxy.server.connection.GuardedProtocol`
(which keeps the connection's states and deadlines) and decides, one request at a time, who
serves it:

- ``sniff``: the connection reads the next request's head itself (``server.requesthead``). A
  plain request whose route the fast lane admits (``server.fastlane``) is served there once its
  body is in, by the connection's one server task (woken for each request): mode ``fast``,
  until the answer is written; bytes a pipelining client sends meanwhile wait in the buffer,
  in order.
- ``one``: a plain request the fast lane does not serve (a watch, a stream, an upgrade route,
  a refusal) goes to aiohttp's protocol: exactly its head and its declared body, so aiohttp's
  parser ends the message clean. When the API handler finishes it, the connection sniffs again;
  the client sends its next request only after reading this answer, which aiohttp writes after
  the handler returns, so the two never interleave.
- ``all``: anything not plain (a chunked body, an upgrade, ``Connection: close``, a malformed
  line, bytes pipelined behind a delegated request) and every later byte go to aiohttp's
  protocol for the rest of the connection, exactly as without a fast lane.
- ``drop``: the connection ends after a last answer of its own (a 408): nothing more is parsed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from watchproxy.server.requesthead import NotSimple, RequestHead, parse_request_head
from watchproxy.server.routes import Route

if TYPE_CHECKING:
    from watchproxy.server.connection import GuardedProtocol
    from watchproxy.server.listener import ConnectionGuard

log = logging.getLogger("watchproxy.listener")

_SNIFF: Final = 0
_FAST: Final = 1
_ONE: Final = 2
_ALL: Final = 3
_DROP: Final = 4

# Bytes a client may pipeline behind a request the fast lane is serving before the connection
# stops reading from it (it resumes once they are served).
MAX_PIPELINED_BYTES = 1 << 20


class Lanes:
    """Hands each request of one connection to the fast lane or to aiohttp's protocol, and is
    the connection the fast lane writes its answers through (``fastlane.ClientConnection``)."""

    def __init__(
        self, conn: GuardedProtocol, guard: ConnectionGuard, inner: asyncio.Protocol
    ) -> None:
        self._conn = conn
        self._guard = guard
        self._inner = inner
        self._loop = conn.loop
        self._transport: asyncio.Transport | None = None
        self.lost = conn.lost
        self.remote = ""
        self._mode = _SNIFF if guard.fast_lane is not None else _ALL
        self._buffer = bytearray()
        self._to_inner = 0  # mode one: bytes of the delegated request still to pass on
        self._admitted: tuple[RequestHead, Route] | None = None  # its body still arriving
        # The task that serves this connection's fast-lane requests, one after another: made
        # for its first, then woken for each next. A task per request cost more than the rest
        # of the connection's own work on it (its creation, and on 3.11 the Python of the
        # loop's weak set of tasks, on entry and again on exit).
        self._server: asyncio.Task[None] | None = None
        self._next: tuple[RequestHead, Route, bytes] | None = None  # for the server to serve
        self._ready: asyncio.Future[None] | None = None  # the idle server waits on this
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._reading_paused = False

    # What the connection passes on

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)
        self._wake_writer()
        ready = self._ready
        if ready is not None and not ready.done():
            ready.set_result(None)  # the idle server task finds the connection gone and ends

    def data_received(self, data: bytes) -> None:
        mode = self._mode
        if mode == _ALL:
            self._inner.data_received(data)
        elif mode == _ONE:
            if self._to_inner:
                part = data[: self._to_inner]
                self._to_inner -= len(part)
                self._inner.data_received(part)
                data = data[len(part) :]
            if data:
                # More while aiohttp serves the delegated request: a pipelining client. aiohttp
                # queues what follows in order; the rest of the connection is its.
                self._delegate_all(data)
        elif mode != _DROP:
            self._buffer += data
            if mode == _SNIFF:
                self._sniff()
            elif len(self._buffer) > MAX_PIPELINED_BYTES and self._transport is not None:
                self._transport.pause_reading()
                self._reading_paused = True

    def eof_received(self) -> bool | None:
        if self._mode == _DROP:
            return None  # the client has read the last answer, or gave up: close now
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()
        if self._writable is None:
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
        self._wake_writer()

    def drop(self) -> None:
        """Parse nothing more: the connection closes after its last answer."""
        self._mode = _DROP

    def finished(self) -> None:
        """aiohttp's handler finished a request."""
        if self._mode == _ONE and not self._to_inner:
            self._mode = _SNIFF  # aiohttp's parser ended the message; the next is ours

    # Who parses: the fast lane, or aiohttp

    def _sniff(self) -> None:
        lane = self._guard.fast_lane
        assert lane is not None
        while self._mode == _SNIFF and self._buffer:
            if self._admitted is None:
                try:
                    head = parse_request_head(self._buffer)
                except NotSimple:
                    self._delegate_all(b"")
                    return
                if head is None:
                    return
                route = lane.admit(head)
                if route is None:
                    self._delegate_one(head.head_length + head.body_length)
                    return
                self._admitted = (head, route)
            head, route = self._admitted
            end = head.head_length + head.body_length
            if len(self._buffer) < end:
                self._conn.body_arriving()  # its body has a deadline
                return
            self._conn.request_started()
            body = bytes(self._buffer[head.head_length : end])
            del self._buffer[:end]
            self._admitted = None
            self._mode = _FAST
            self._next = (head, route, body)
            self._wake_server()

    def _wake_server(self) -> None:
        """Hand ``_next`` to the connection's server task: made now for a first request, woken
        if idle, and otherwise running already (its loop takes ``_next`` next)."""
        server = self._server
        if server is None:
            server = self._server = self._loop.create_task(self._serve_requests())
            self._guard.connection_tasks.add(server)
            server.add_done_callback(self._guard.connection_tasks.discard)
        else:
            ready = self._ready
            if ready is not None and not ready.done():
                ready.set_result(None)
        self._guard.fast_tasks.add(server)  # a request in flight (until request_finished)

    def _delegate_one(self, length: int) -> None:
        part = bytes(self._buffer[:length])
        rest = bytes(self._buffer[length:])
        self._buffer.clear()
        self._mode = _ONE
        self._to_inner = length - len(part)
        self._inner.data_received(part)
        if rest:
            self._delegate_all(rest)

    def _delegate_all(self, more: bytes) -> None:
        data = bytes(self._buffer) + more
        self._buffer.clear()
        self._admitted = None
        self._mode = _ALL
        if data:
            self._inner.data_received(data)

    async def _serve_requests(self) -> None:
        """This connection's fast-lane requests, in turn, until it closes or the proxy drains."""
        lane = self._guard.fast_lane
        assert lane is not None
        task = self._server
        while True:
            request, self._next = self._next, None
            if request is None:
                if self._transport is None or self._transport.is_closing():
                    return
                ready = self._ready = self._loop.create_future()
                try:
                    await ready  # set by _wake_server, or by connection_lost
                finally:
                    self._ready = None
                continue
            head, route, body = request
            try:
                await lane.serve(head, route, body, self, task)
            except Exception:  # a defect: the connection cannot be trusted to frame the next one
                log.exception("error serving %s %s", head.method, head.target[:200])
                self.abort()
            finally:
                if task is not None:
                    self._guard.fast_tasks.discard(task)
                self._conn.request_finished()
            transport = self._transport
            if transport is None or transport.is_closing():
                return
            if lane.handler.draining:
                transport.close()  # the answer said Connection: close
                return
            self._mode = _SNIFF
            if self._reading_paused:
                self._reading_paused = False
                transport.resume_reading()
            self._sniff()  # a request pipelined meanwhile becomes _next

    # What the fast lane writes through (server.fastlane.ClientConnection)

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _wake_writer(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)
