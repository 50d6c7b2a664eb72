"""One client connection on the API port: its guard's states, and who parses its requests.

:class:`GuardedProtocol` wraps aiohttp's protocol for the connection and keeps the state the
guard sheds by (``head``, ``active``, ``idle``; see ``server.listener``). It also decides, one
request at a time, who serves it:

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
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final, Literal, cast

from watchproxy.errors import status_bytes
from watchproxy.server.requesthead import NotSimple, RequestHead, parse_request_head
from watchproxy.server.routes import Route

if TYPE_CHECKING:
    from watchproxy.server.listener import ConnectionGuard

log = logging.getLogger("watchproxy.listener")

State = Literal["head", "idle", "active"]

_SNIFF: Final = 0
_FAST: Final = 1
_ONE: Final = 2
_ALL: Final = 3

# Bytes a client may pipeline behind a request the fast lane is serving before the connection
# stops reading from it (it resumes once they are served).
MAX_PIPELINED_BYTES = 1 << 20
# A keep-alive connection idle this long is closed (aiohttp's own default, which the fast lane
# replaces: aiohttp's timer does not see the requests it serves).
IDLE_TIMEOUT_SECONDS = 3630.0


def status_reply(code: int, phrase: str, reason: str, message: str) -> bytes:
    body = status_bytes(code, reason, message)
    head = (
        f"HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedProtocol(asyncio.Protocol):
    """Delegates to aiohttp's protocol what the fast lane does not serve; adds the head deadline,
    the idle timeout and the state the guard sheds by."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None  # loop time; see _start_timer
        self._state: State | None = None
        self._got_bytes = False
        self._shed = False
        self._loop = loop = asyncio.get_running_loop()  # once: each lookup is a getpid() on 3.11
        self.lost: asyncio.Future[None] = loop.create_future()
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
        # Counted from here, not from connection_made: the loop may accept a whole batch of
        # connections (calling this factory for each) before any of them is "made".
        self._move("head")

    def _move(self, state: State | None) -> None:
        if state != self._state:
            self._guard.moved(self, self._state, state)
            self._state = state

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._inner.connection_made(transport)
        if self._shed:  # shed between accept and now
            self._transport.close()
            return
        self._guard.by_transport[transport] = self
        peer = transport.get_extra_info("peername")
        # As aiohttp's request.remote: the address of an IP peer, the name of another.
        self.remote = str(peer[0]) if isinstance(peer, list | tuple) else str(peer or "")
        self._start_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self._move(None)
        if self._transport is not None:
            self._guard.by_transport.pop(self._transport, None)
        self._inner.connection_lost(exc)
        if not self.lost.done():
            self.lost.set_result(None)  # a fast-lane request in flight ends with it
        self._wake_writer()
        ready = self._ready
        if ready is not None and not ready.done():
            ready.set_result(None)  # the idle server task finds the connection gone and ends

    def data_received(self, data: bytes) -> None:
        if self._state == "idle":
            # The next request on a keep-alive connection: its head has a deadline too.
            self._move("head")
            self._got_bytes = False
            self._start_timer()
        self._got_bytes = True
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
        else:
            self._buffer += data
            if mode == _SNIFF:
                self._sniff()
            elif len(self._buffer) > MAX_PIPELINED_BYTES and self._transport is not None:
                self._transport.pause_reading()
                self._reading_paused = True

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()
        if self._writable is None:
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
        self._wake_writer()

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
                # Its head is in: from here its body may take as long as aiohttp lets one.
                self.request_started()
            head, route = self._admitted
            end = head.head_length + head.body_length
            if len(self._buffer) < end:
                return  # the body is still arriving
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
                self.request_finished()
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

    # The guard's states

    def request_started(self) -> None:
        self._cancel_timer()
        if self._state is not None:
            self._move("active")

    def request_finished(self) -> None:
        closing = self._transport is None or self._transport.is_closing()
        if self._state is not None and not closing:
            self._move("idle")
            self._start_timer(IDLE_TIMEOUT_SECONDS)
        if self._mode == _ONE and not self._to_inner:
            self._mode = _SNIFF  # aiohttp's parser ended the message; the next is ours

    def shed(self) -> None:
        """Close this (idle or unfinished) connection to make room for a new one."""
        self._stop_timer()
        # Out of the books now: the loop reports the loss only later, and the new connection
        # being accepted must find the room already made.
        self._move(None)
        self._shed = True
        if self._transport is not None:
            self._transport.close()

    def _start_timer(self, seconds: float | None = None) -> None:
        """Set the connection's deadline: its head's (``header_timeout``) or an idle one.

        Lazy, because every request sets a deadline twice (its head's, then the idle one after
        its answer) and clears one: one timer stays armed and, when it fires, compares the
        deadline then in force. It is armed at most ``_recheck`` ahead, never later than a
        head deadline set afterwards could fall, so a new deadline never needs it re-armed."""
        timeout = self._guard.header_timeout if seconds is None else seconds
        if timeout <= 0:
            self._deadline = None
            return
        loop = self._loop
        now = loop.time()
        self._deadline = now + timeout
        if self._timer is None:
            self._timer = loop.call_at(min(self._deadline, now + self._recheck()), self._timed_out)

    def _recheck(self) -> float:
        """How far ahead the timer is armed at most: the shorter of the two deadlines."""
        head = self._guard.header_timeout
        return min(head, IDLE_TIMEOUT_SECONDS) if head > 0 else IDLE_TIMEOUT_SECONDS

    def _cancel_timer(self) -> None:
        self._deadline = None  # the armed timer, if any, finds nothing due

    def _stop_timer(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return  # cleared since: the next deadline arms a timer again
        loop = self._loop
        now = loop.time()
        if now < deadline:
            self._timer = loop.call_at(min(deadline, now + self._recheck()), self._timed_out)
            return
        self._deadline = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._state == "idle":
            transport.close()
            return
        if self._state != "head":
            return
        self._guard.metrics.rejected.labels("header-timeout").inc()
        if self._got_bytes:
            # Part of a head arrived: say why. A connection that sent nothing just closes.
            transport.write(
                status_reply(
                    408,
                    "Request Timeout",
                    "Timeout",
                    f"request headers not received within {self._guard.header_timeout:g}s",
                )
            )
        transport.close()
