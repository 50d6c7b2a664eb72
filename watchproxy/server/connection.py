"""One client connection on the API port: its guard's states and deadlines.

:class:`GuardedProtocol` keeps the state the guard sheds by (``head``, ``body``, ``active``,
``idle``; see ``server.listener``) and the connection's deadlines: a whole request head within
``header_timeout``, a body that keeps arriving (``body_timeout``, ``body_min_rate``), and a
keep-alive idle timeout. Who parses each request, the fast lane or aiohttp, is
``server.lanes``'s to decide; every byte passes through here first.

A body is in its ``body`` state from the end of its head until its last byte: in the fast lane
while the connection buffers it, on aiohttp's path while aiohttp's reader of it
(``request.content``) has not reached its end. A late body gets a 408 and its connection is
closed: written here for the fast lane (nothing of the request has been answered), raised as
:class:`~watchproxy.errors.BodyTimeout` from the handler's read on aiohttp's path (so the edge
answers it), or, if the handler has answered already, the connection just closes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal, Protocol, cast

from watchproxy.errors import BodyTimeout, status_bytes
from watchproxy.server.deadlines import BodyClock, DeadlineTimer
from watchproxy.server.lanes import Lanes

if TYPE_CHECKING:
    from watchproxy.server.listener import ConnectionGuard

State = Literal["head", "body", "idle", "active"]

# A keep-alive connection idle this long is closed (aiohttp's own default, which the fast lane
# replaces: aiohttp's timer does not see the requests it serves).
IDLE_TIMEOUT_SECONDS = 3630.0
# After a 408 the connection reads (and drops) what the client still sends for this long before
# closing: closing a socket that then receives data makes the kernel send a reset, and a reset
# can overtake the 408 at the client, which then reads only "connection reset".
LINGER_SECONDS = 1.0


def status_reply(code: int, phrase: str, reason: str, message: str) -> bytes:
    body = status_bytes(code, reason, message)
    head = (
        f"HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class Payload(Protocol):
    """A request body as aiohttp's parser fills it (``web.Request.content``)."""

    def is_eof(self) -> bool: ...

    def set_exception(self, exc: BaseException) -> None: ...

    def feed_eof(self) -> None: ...


class GuardedProtocol(asyncio.Protocol):
    """One connection's states and deadlines around the protocol that parses its requests
    (``server.lanes``): a request's head and body each have a deadline, and an idle
    keep-alive connection is closed in time."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._state: State | None = None
        self._got_bytes = False
        self._shed = False
        self.loop = loop = asyncio.get_running_loop()  # once: each lookup is a getpid() on 3.11
        timeouts = [t for t in (guard.header_timeout, guard.body_timeout) if t > 0]
        self._timer = DeadlineTimer(
            loop, min([IDLE_TIMEOUT_SECONDS, *timeouts]), self._due, self._timed_out
        )
        self.lost: asyncio.Future[None] = loop.create_future()
        self.remote = ""
        # The body phase (state "body"): aiohttp's reader of the body (None in the fast lane,
        # which buffers the body), and how it arrives.
        self._payload: Payload | None = None
        self._body = BodyClock(guard.body_timeout, guard.body_min_rate)
        # aiohttp's handler answered while the body was still arriving (aiohttp then reads
        # the rest and discards it, under the body's deadline still).
        self._answered = False
        self._closer: asyncio.TimerHandle | None = None  # see LINGER_SECONDS
        self._lanes = Lanes(self, guard, inner)
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
        self._lanes.connection_made(self._transport)
        if self._shed:  # shed between accept and now
            self._transport.close()
            return
        self._guard.by_transport[transport] = self
        peer = transport.get_extra_info("peername")
        # As aiohttp's request.remote: the address of an IP peer, the name of another.
        self.remote = self._lanes.remote = (
            str(peer[0]) if isinstance(peer, list | tuple) else str(peer or "")
        )
        self._start_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        self._move(None)
        if self._transport is not None:
            self._guard.by_transport.pop(self._transport, None)
        self._lanes.connection_lost(exc)
        if not self.lost.done():
            self.lost.set_result(None)  # a fast-lane request in flight ends with it

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state == "idle":
            # The next request on a keep-alive connection: its head has a deadline too.
            self._move("head")
            self._got_bytes = False
            self._start_timer()
        elif state == "body":
            self._body.progress(self.loop.time(), len(data))
            self._guard.progressed(self)
        self._got_bytes = True
        self._lanes.data_received(data)
        if state == "body":
            self._check_body()

    def eof_received(self) -> bool | None:
        return self._lanes.eof_received()

    def pause_writing(self) -> None:
        self._lanes.pause_writing()

    def resume_writing(self) -> None:
        self._lanes.resume_writing()

    # The guard's states

    def request_started(self, payload: Payload | None = None) -> None:
        """A request's head is in and it is being served; ``payload``: aiohttp's reader of
        its body, which has a deadline of its own while it is still arriving."""
        if payload is not None and self._state is not None and not payload.is_eof():
            self._begin_body(payload)
            return
        self._cancel_timer()
        if self._state is not None:
            self._move("active")

    def request_finished(self) -> None:
        closing = self._transport is None or self._transport.is_closing()
        if self._state == "body" and not closing:
            # Answered before its body was in: aiohttp reads the rest (and drops it) before
            # the next request, and the body's deadline still holds.
            self._answered = True
        elif self._state is not None and not closing:
            self._move("idle")
            self._start_timer(IDLE_TIMEOUT_SECONDS)
        self._lanes.finished()

    def body_arriving(self) -> None:
        """The fast lane has a request's head and waits for its body."""
        if self._state != "body":
            self._begin_body(None)

    def _begin_body(self, payload: Payload | None) -> None:
        self._move("body")
        self._payload = payload
        self._answered = False
        self._body.start(self.loop.time())
        self._start_timer(self._guard.body_timeout)

    def _check_body(self) -> None:
        """After bytes went to aiohttp's parser: the body phase ends with the body."""
        payload = self._payload
        if payload is None or not payload.is_eof() or self._state != "body":
            return
        self._payload = None
        if self._answered:
            self._answered = False
            self._move("idle")
            self._start_timer(IDLE_TIMEOUT_SECONDS)
        else:
            self._cancel_timer()
            self._move("active")

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
        """Set the connection's deadline: its head's (``header_timeout``) unless told."""
        self._timer.set(self._guard.header_timeout if seconds is None else seconds)

    def _cancel_timer(self) -> None:
        self._timer.clear()

    def _stop_timer(self) -> None:
        self._timer.stop()

    def _due(self, deadline: float, now: float) -> float:
        """The deadline in force: a body's moves on with each read."""
        if self._state != "body":
            return deadline
        body = self._body
        due = body.due()
        transport = self._transport
        if now >= due and transport is not None and not transport.is_reading():
            # Reading is paused because the proxy has not taken what came (the body streams
            # upstream no faster than the apiserver reads it): not the client's delay. Its
            # clock starts again.
            body.start(now)
            due = body.due()
        return due

    def _timed_out(self) -> None:
        state = self._state
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if state == "idle":
            transport.close()
            return
        if state == "body":
            self._body_timed_out(transport)
            return
        if state != "head":
            return
        self._guard.metrics.rejected.labels("header-timeout").inc()
        if self._got_bytes:
            # Part of a head arrived: say why. A connection that sent nothing just closes.
            message = f"request headers not received within {self._guard.header_timeout:g}s"
            self._reply_and_close(
                transport, status_reply(408, "Request Timeout", "Timeout", message)
            )
            return
        transport.close()

    def _reply_and_close(self, transport: asyncio.Transport, reply: bytes) -> None:
        """Write a last answer, end the writing side, and close after LINGER_SECONDS (or
        when the client does), dropping what it sends meanwhile."""
        transport.write(reply)
        self._lanes.drop()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._closer = self.loop.call_later(LINGER_SECONDS, transport.close)

    def _body_timed_out(self, transport: asyncio.Transport) -> None:
        guard = self._guard
        guard.metrics.rejected.labels("body-timeout").inc()
        message = f"request body not received: {self._body.why_late(self.loop.time())}"
        payload, self._payload = self._payload, None
        if payload is not None and not self._answered:
            # aiohttp's handler is reading it: its read raises BodyTimeout, and the edge
            # (server.api) answers 408 and closes the connection. The body also ends here, so
            # that aiohttp does not wait for the rest after the answer; the parser gets no
            # more of this connection's bytes.
            self._lanes.drop()
            self._move("active")
            payload.set_exception(BodyTimeout(message))
            payload.feed_eof()
            return
        if payload is None:
            # The fast lane's request: nothing of it has been answered yet.
            self._reply_and_close(
                transport, status_reply(408, "Request Timeout", "Timeout", message)
            )
            return
        transport.close()
