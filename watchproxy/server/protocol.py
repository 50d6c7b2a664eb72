"""One client connection on the API port: one asyncio Protocol over one parser (llhttp).

Every byte a client sends goes through :class:`HttpProtocol`: to llhttp (through httptools),
which hands back each request's head and body, or, once a request has switched protocols (an
exec relay, a watch over WebSocket), to that request's handler alone. No byte is parsed twice
and nothing else parses HTTP on this port.

Requests are served in the order they arrive, by one server task per connection (made for its
first request, woken for each next; a task per request cost more than the rest of the
connection's own work on it). A pipelining client's later requests wait, parsed, until the
answers before them are written; past :data:`MAX_PIPELINED` of them the socket stops being read.

The connection keeps the state its guard sheds by (``head``, ``body``, ``active``, ``idle``; see
``server.listener``) and its deadlines: a whole request head within ``header_timeout``, a body
that keeps arriving (``body_timeout``, ``body_min_rate``, ``server.deadlines``), and a
keep-alive idle timeout. A late head or body gets a 408 Status and its connection is closed.

Each request gets a :class:`Response`: the one writer of its answer (a whole answer, a head
then a body of a declared length or chunked, a body given as an async iterator), with write
backpressure from ``pause_writing``/``resume_writing``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from typing import Literal, NamedTuple, Protocol, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from watchproxy.errors import BadRequest, BodyTimeout, PayloadTooLarge, ProxyError
from watchproxy.kube.headers import impersonates
from watchproxy.lists.answers import Answer
from watchproxy.metrics import Metrics
from watchproxy.server.deadlines import BodyClock, DeadlineTimer
from watchproxy.server.http import (
    HEADER_BLOCK_BYTES_KEPT,
    HEADER_BLOCKS_KEPT,
    Request,
    reason_phrase,
    response_head,
    status_answer,
)

log = logging.getLogger("watchproxy.listener")

State = Literal["head", "body", "idle", "active"]

# A keep-alive connection idle this long is closed.
IDLE_TIMEOUT_SECONDS = 3630.0
# After a last answer (a 408, a refusal of a malformed request) the connection reads (and
# drops) what the client still sends, and closes once the client has sent nothing for
# LINGER_SECONDS, or LINGER_MAX_SECONDS after the answer: closing a socket that then receives
# data makes the kernel send a reset, and a reset can overtake the answer at the client, which
# then reads only "connection reset" (a client still sending its body has not read the answer
# yet). A fixed second was not enough for a client that sends while it is slow to read (the
# suite's trickling client under load); nginx's lingering close works the same way.
LINGER_SECONDS = 2.0
LINGER_MAX_SECONDS = 30.0
# Limits of a request head (those aiohttp's parser had: a longer line or field, or more
# fields, is refused with a 400).
MAX_LINE = 8190
MAX_HEADERS = 128
# Bytes of a head without its end after which it is refused.
MAX_HEAD_BYTES = 65536
# Parsed requests waiting behind the one being served before the socket stops being read.
MAX_PIPELINED = 16
# Body bytes held for a request whose handler has not claimed its body yet (it may refuse it
# first: the body budget, a 413) before the socket stops being read.
UNCLAIMED_BODY_BYTES = 65536
# A chunk at least this large is written beside its framing rather than copied into it.
_FRAME_BY_COPY_BELOW = 16 * 1024
_LAST_CHUNK = b"0\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Answers that never have a body (RFC 9112 section 6.3).
_NO_BODY = frozenset({204, 304})

Handler = Callable[[Request, "Response"], Awaitable[None]]


class Guard(Protocol):
    """What a connection needs of its guard (``server.listener.ConnectionGuard`` fits): the
    port's limits, the books of connection states, the server tasks it owns."""

    header_timeout: float
    body_timeout: float
    body_min_rate: float
    max_body_bytes: int
    draining: bool
    metrics: Metrics
    tasks: set[asyncio.Task[None]]
    busy: set[HttpProtocol]

    def opened(self, protocol: HttpProtocol) -> None: ...

    def closed(self, protocol: HttpProtocol) -> None: ...

    def moved(self, protocol: HttpProtocol, old: State | None, new: State | None) -> None: ...

    def progressed(self, protocol: HttpProtocol) -> None: ...


class Tunnel(Protocol):
    """What takes a connection's bytes after its request switched protocols."""

    def feed_data(self, data: bytes) -> None: ...

    def eof_received(self) -> bool:
        """The client's FIN: True keeps the transport open (to write on after a half-close)."""

    def feed_eof(self) -> None:
        """The connection is lost."""


class _Refused(Exception):
    """A request head over the port's limits: answered 400, and the connection closes."""


class _Pending:
    """A parsed request and its body as it arrives."""

    __slots__ = (
        "body",
        "claimed",
        "complete",
        "discard",
        "error",
        "malformed",
        "request",
        "size",
        "waiter",
    )

    def __init__(self, request: Request) -> None:
        self.request = request
        self.body: list[bytes] = []
        self.size = 0
        self.complete = False
        self.claimed = False  # its handler reads the body (else it is held, up to a bound)
        self.discard = False  # answered already: the rest of the body is dropped
        self.error: ProxyError | None = None
        self.malformed = False  # not a request: the refusal of the bytes that came instead
        self.waiter: asyncio.Future[None] | None = None

    def raise_error(self) -> None:
        """Raise what the body's arrival found wrong, if anything. A method, read afresh at
        each call: a check of ``self.error`` inline, after an await, would be narrowed by the
        type checker (and compiled by mypyc) to what an earlier check found."""
        if self.error is not None:
            raise self.error

    def wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


# Header blocks parsed before, by their lines: (headers, impersonating).
_blocks: dict[tuple[tuple[bytes, bytes], ...], _Block] = {}
# Methods and versions as llhttp reports them, decoded once.
_methods: dict[bytes, str] = {}
_versions: dict[str, tuple[int, int]] = {"1.1": (1, 1), "1.0": (1, 0)}


class _Block(NamedTuple):
    """A request's header fields as the protocol reads them, kept per block of lines."""

    headers: CIMultiDictProxy[str]
    impersonating: bool  # an Impersonate-* field among them
    hosts: int  # Host fields
    body_length: int | None  # the declared Content-Length (0: none); None: chunked
    upgrade: bool  # an Upgrade field
    shared: bool  # kept: the same object for later requests with the same lines


def _headers_of(fields: list[tuple[bytes, bytes]]) -> _Block:
    """The headers of ``fields`` (values decoded as UTF-8 with surrogate escapes, so that
    ``kube.headers.wire_value`` gives the client's bytes back) and what the protocol reads of
    them, kept for the next request with the same lines (then never changed).

    A value loses its trailing whitespace: it is not part of the field value (RFC 9110 section
    5.5), llhttp keeps it, and h11 and Go's net/http (the apiserver) drop it (found by the
    parser differential test)."""
    key = tuple(fields)
    kept = _blocks.get(key)
    if kept is not None:
        return kept
    headers = CIMultiDictProxy(
        CIMultiDict(
            [
                (name.decode("latin-1"), value.rstrip(b" \t").decode("utf-8", "surrogateescape"))
                for name, value in fields
            ]
        )
    )
    # llhttp has checked the one Content-Length (digits only) and refused it beside chunked.
    chunked = "Transfer-Encoding" in headers
    block = _Block(
        headers,
        impersonates(headers),
        len(headers.getall("Host", ())),
        None if chunked else int(headers.get("Content-Length") or 0),
        "Upgrade" in headers,
        sum(len(n) + len(v) for n, v in fields) <= HEADER_BLOCK_BYTES_KEPT,
    )
    if block.shared:
        if len(_blocks) >= HEADER_BLOCKS_KEPT:
            _blocks.clear()
        _blocks[key] = block
    return block


def _check_limits(url: list[bytes], fields: list[tuple[bytes, bytes]]) -> None:
    """Raises _Refused for a head over the port's limits (those aiohttp's parser had)."""
    if sum(map(len, url)) > MAX_LINE:
        raise _Refused("the request target is too long")
    if len(fields) > MAX_HEADERS:
        raise _Refused("too many header fields")
    if any(len(name) + len(value) > MAX_LINE for name, value in fields):
        raise _Refused("a header field is too long")


class HttpProtocol(asyncio.Protocol):
    """One connection: parses its requests with llhttp, serves them in order, keeps its
    guard's state and its deadlines."""

    def __init__(self, guard: Guard, handler: Handler) -> None:
        self._guard = guard
        self._handler = handler
        self.loop = loop = asyncio.get_running_loop()  # once: each lookup is a getpid() on 3.11
        self.transport: asyncio.Transport | None = None
        self._state: State | None = None
        self._got_bytes = False
        self._shed = False
        timeouts = [t for t in (guard.header_timeout, guard.body_timeout) if t > 0]
        self._timer = DeadlineTimer(
            loop, min([IDLE_TIMEOUT_SECONDS, *timeouts]), self._due, self._timed_out
        )
        self._body_clock = BodyClock(guard.body_timeout, guard.body_min_rate)
        self.lost: asyncio.Future[None] = loop.create_future()
        self.remote = ""
        self._parser = httptools.HttpRequestParser(self)
        # The message being parsed.
        self._url: list[bytes] = []
        self._fields: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0  # of the head being parsed, before the read being parsed
        self._chunk = 0  # the size of the read being parsed
        self._in_head = False  # between a message's first byte and the end of its head
        self._parsing: _Pending | None = None  # its head is in, its body is not
        self._queue: collections.deque[_Pending] = collections.deque()
        self._current: _Pending | None = None  # being served
        self._server: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None  # the idle server task waits on this
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._paused_for: set[str] = set()  # why reading is paused
        # After a request that asks to switch protocols, nothing more is parsed: the bytes that
        # follow are the new protocol's (``_tail``), or the connection ends after its answer.
        self._upgraded: _Pending | None = None
        self._tail = b""
        self._tail_unknown = False  # bytes after it were parsed as HTTP: no takeover
        self._tunnel: Tunnel | None = None
        self._dead = False  # parse nothing more (a malformed request, a 408)
        self._closer: asyncio.TimerHandle | None = None  # see LINGER_SECONDS
        self._heard_at = 0.0  # when the client last sent bytes (a lingering close reads it)
        self._linger_until = 0.0
        # Counted from here, not from connection_made: the loop may accept a whole batch of
        # connections (calling this factory for each) before any of them is "made".
        self._move("head")

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self._shed:  # shed between accept and now
            self.transport.close()
            return
        peer = transport.get_extra_info("peername")
        # The address of an IP peer, the name of another.
        self.remote = str(peer[0]) if isinstance(peer, list | tuple) else str(peer or "")
        self._guard.opened(self)
        self._timer.set(self._guard.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.stop()
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        self._move(None)
        self._guard.closed(self)
        self._wake_writer()
        for pending in (self._current, self._parsing, *self._queue):
            if pending is not None:
                pending.wake()
        ready = self._ready
        if ready is not None and not ready.done():
            ready.set_result(None)  # the idle server task finds the connection gone and ends
        if self._tunnel is not None:
            self._tunnel.feed_eof()
        if not self.lost.done():
            self.lost.set_result(None)  # a request in flight ends with it (clientgone)

    def data_received(self, data: bytes) -> None:
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.feed_data(data)
            return
        if self._dead:
            self._heard_at = self.loop.time()  # a lingering close waits for its silence
            return
        if self._upgraded is not None and self._upgraded.complete:
            self._tail += data  # the new protocol's, once its handler takes the connection
            return
        state = self._state
        if state == "idle":
            # The next request on a keep-alive connection: its head has a deadline too.
            self._move("head")
            self._got_bytes = False
            self._timer.set(self._guard.header_timeout)
        elif state == "body":
            self._body_clock.progress(self.loop.time(), len(data))
            self._guard.progressed(self)
        self._got_bytes = True
        self._chunk = size = len(data)
        if self._in_head:
            # A head past MAX_HEAD_BYTES without its end is refused (llhttp itself sets no
            # bound); its lines are checked when it ends.
            self._head_bytes += size
            if self._head_bytes > MAX_HEAD_BYTES:
                self._malformed("the request head is too long")
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._tail = data[upgrade.args[0] :]
        except httptools.HttpParserCallbackError as error:
            if isinstance(error.__context__, _AfterUpgrade):
                self._tail_unknown = True
            else:
                self._malformed(str(error.__context__ or error))
        except httptools.HttpParserError as error:
            self._malformed(str(error))
        if len(self._queue) > MAX_PIPELINED:
            self._pause_reading("pipelined")

    def eof_received(self) -> bool | None:
        if self._tunnel is not None:
            return self._tunnel.eof_received() or None
        # The client is done with the connection: close it, and the request in flight ends
        # with it (clientgone).
        return None

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    # httptools' callbacks

    def on_message_begin(self) -> None:
        if self._upgraded is not None:
            raise _AfterUpgrade
        self._url = []
        self._fields = []
        self._head_bytes = 0
        self._in_head = True
        if self._state == "idle":
            self._move("head")
            self._timer.set(self._guard.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # else a chunked body's trailer fields: never any request's headers
            self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_bytes + self._chunk > MAX_LINE:  # only then can a line be over it
            _check_limits(self._url, self._fields)
        parser = self._parser
        version = parser.get_http_version()
        numbers = _versions.get(version)
        if numbers is None:
            major, _, minor = version.partition(".")
            numbers = (int(major or 0), int(minor or 0))
        method_bytes = parser.get_method()
        method = _methods.get(method_bytes)
        if method is None:  # llhttp knows some thirty methods: a bounded dict
            method = _methods[method_bytes] = method_bytes.decode("ascii", "replace")
        block = _headers_of(self._fields)
        request = Request(
            method,
            b"".join(self._url).decode("latin-1"),
            block.headers,
            numbers,
            self.remote,
            shared=block.shared,
            body_length=block.body_length,
            upgrade=block.upgrade,
        )
        request.impersonating = block.impersonating
        request.hosts = block.hosts
        pending = _Pending(request)
        if request.upgrade or not parser.should_keep_alive():
            # Nothing after this request is HTTP for us: a switch of protocols, or its end.
            self._upgraded = pending
        if request.has_body:
            self._parsing = pending
            if self._state in ("head", "idle", None):
                self._begin_body()
        else:
            pending.complete = True
        if not request.has_body and self._state == "head":
            self._timer.clear()
            self._move("active")
        self._queue.append(pending)
        self._serve_next()

    def on_body(self, body: bytes) -> None:
        pending = self._parsing
        if pending is None or pending.discard:
            return
        pending.body.append(body)
        pending.size += len(body)
        limit = self._guard.max_body_bytes
        if limit and pending.size > limit and pending.error is None:
            pending.error = PayloadTooLarge(f"request body exceeds {limit} bytes")
            pending.discard = True
            pending.body.clear()
        elif not pending.claimed and pending.size > UNCLAIMED_BODY_BYTES:
            self._pause_reading("body")
        pending.wake()

    def on_message_complete(self) -> None:
        pending = self._parsing
        if pending is not None:
            self._parsing = None
            pending.complete = True
            pending.wake()
            if self._state == "body":
                self._timer.clear()
                self._move("active")

    # The server task

    def _serve_next(self) -> None:
        """Wake the connection's server task (made now for a first request)."""
        server = self._server
        if server is None:
            server = self._server = self.loop.create_task(self._serve_requests())
            self._guard.tasks.add(server)
            server.add_done_callback(self._guard.tasks.discard)
        else:
            ready = self._ready
            if ready is not None and not ready.done():
                ready.set_result(None)

    async def _serve_requests(self) -> None:
        """This connection's requests, in turn, until it closes."""
        while True:
            transport = self.transport
            if transport is None or transport.is_closing() or self.lost.done():
                return
            if not self._queue:
                ready = self._ready = self.loop.create_future()
                try:
                    await ready  # set by _serve_next, or by connection_lost
                finally:
                    self._ready = None
                continue
            pending = self._current = self._queue.popleft()
            if "pipelined" in self._paused_for and len(self._queue) <= MAX_PIPELINED:
                self._resume_reading("pipelined")
            if pending is self._parsing:
                if self._state != "body":
                    self._begin_body()
            elif self._state != "active":
                self._timer.clear()
                self._move("active")
            self._guard.busy.add(self)
            response = Response(self, pending)
            try:
                if pending.malformed:
                    assert pending.error is not None
                    response.send_error(pending.error)
                    response.close = True
                else:
                    await self._handler(pending.request, response)
            except ConnectionError:  # the client went away while its answer was written
                response.close = True
            except Exception:  # a defect: the connection cannot be trusted to frame the next one
                log.exception(
                    "error serving %s %s", pending.request.method, pending.request.target[:200]
                )
                if response.status == 0:
                    response.send_error(ProxyError("internal error"))
                response.close = True
            finally:
                self._guard.busy.discard(self)
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            if not response.finished or response.close or pending is self._upgraded:
                if pending.complete or pending is self._upgraded:
                    transport.close()  # (a connection taken over: its handler closed it already)
                else:
                    self._close_lingering()  # the client may still be sending its body
                return
            if not pending.complete:
                # Answered before its body was in: the rest is read and dropped before the
                # next request, under the body's deadline still.
                pending.discard = True
                pending.body.clear()
                self._resume_reading("body")
                await self._body_in(pending)
                if not pending.complete:
                    return
            self._current = None
            if self._guard.draining and not self._queue:
                transport.close()  # the answer said Connection: close
                return
            if not self._queue and self._state == "active":
                if self._in_head:
                    self._move("head")
                    self._timer.set(self._guard.header_timeout)
                elif self._parsing is None:
                    self._move("idle")
                    self._timer.set(IDLE_TIMEOUT_SECONDS)

    async def _body_in(self, pending: _Pending) -> None:
        """Until more of ``pending``'s body arrived, it completed, or the connection ended."""
        transport = self.transport
        if pending.complete or transport is None or transport.is_closing() or self.lost.done():
            return
        waiter = pending.waiter = self.loop.create_future()
        await waiter

    async def read_body(self, pending: _Pending, limit: int) -> bytes:
        """The whole body of ``pending`` (the request being served)."""
        request = pending.request
        pending.raise_error()
        if not pending.claimed:
            pending.claimed = True
            expects = request.headers.get("Expect", "").lower() == "100-continue"
            waits = expects and request.version >= (1, 1) and not (pending.complete or pending.size)
            if waits and self.transport is not None:
                self.transport.write(_CONTINUE)  # the client waits for it before its body
            self._resume_reading("body")
        while not pending.complete:
            pending.raise_error()
            if pending.size > limit:
                raise PayloadTooLarge(f"request body exceeds {limit} bytes")
            transport = self.transport
            if transport is None or transport.is_closing() or self.lost.done():
                raise BadRequest("the request body broke off: the client closed its connection")
            await self._body_in(pending)
        pending.raise_error()
        if pending.size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        body = b"".join(pending.body)
        pending.body.clear()
        return body

    def take_over(self, pending: _Pending, tunnel: Tunnel) -> asyncio.Transport:
        """Every byte after ``pending`` (a request that switched protocols) goes to
        ``tunnel`` from now on."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away before the switch")
        if pending is not self._upgraded or self._tail_unknown or self._queue:
            raise BadRequest("bytes followed the upgrade request before its answer")
        self._tunnel = tunnel
        self._timer.stop()
        self._paused_for.clear()
        tail, self._tail = self._tail, b""
        if tail:
            tunnel.feed_data(tail)
        return transport

    # Reading and writing

    def _pause_reading(self, why: str) -> None:
        if not self._paused_for and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused_for.add(why)

    def _resume_reading(self, why: str) -> None:
        if why not in self._paused_for:
            return
        self._paused_for.discard(why)
        transport = self.transport
        if not self._paused_for and transport is not None and not transport.is_closing():
            transport.resume_reading()

    async def drain(self) -> None:
        writable = self._writable
        if writable is not None:
            await writable

    def _wake_writer(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # States and deadlines

    def _move(self, state: State | None) -> None:
        if state != self._state:
            self._guard.moved(self, self._state, state)
            self._state = state

    def _begin_body(self) -> None:
        self._move("body")
        self._body_clock.start(self.loop.time())
        self._timer.set(self._guard.body_timeout)

    def shed(self) -> None:
        """Close this (idle or unfinished) connection to make room for a new one."""
        self._timer.stop()
        # Out of the books now: the loop reports the loss only later, and the new connection
        # being accepted must find the room already made.
        self._move(None)
        self._shed = True
        if self.transport is not None:
            self.transport.close()

    def close_idle(self) -> None:
        """At shutdown: close the connection unless a request is being served on it."""
        if self._current is None and not self._queue and self.transport is not None:
            self.transport.close()

    def _due(self, deadline: float, now: float) -> float:
        """The deadline in force: a body's moves on with each read."""
        if self._state != "body":
            return deadline
        body = self._body_clock
        due = body.due()
        transport = self.transport
        if now >= due and transport is not None and not transport.is_reading():
            # Reading is paused because the proxy has not taken what came: not the client's
            # delay. Its clock starts again.
            body.start(now)
            due = body.due()
        return due

    def _timed_out(self) -> None:
        state = self._state
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        guard = self._guard
        if state == "idle":
            transport.close()
            return
        if state == "body":
            guard.metrics.rejected.labels("body-timeout").inc()
            message = f"request body not received: {self._body_clock.why_late(self.loop.time())}"
            pending = self._parsing
            if pending is not None and pending is self._current and pending.claimed:
                # Its handler is reading it: the read raises, and the edge answers the 408.
                self._dead = True
                pending.error = BodyTimeout(message)
                pending.wake()
                self._move("active")
                return
            if self._current is None:
                self._last_answer(status_answer(BodyTimeout(message)))
                return
            transport.close()  # its handler did not wait for it, or answered already
            return
        if state != "head":
            return
        guard.metrics.rejected.labels("header-timeout").inc()
        if self._got_bytes and self._current is None:
            # Part of a head arrived: say why. A connection that sent nothing just closes.
            message = f"request headers not received within {guard.header_timeout:g}s"
            self._last_answer(status_answer(BodyTimeout(message)))
            return
        transport.close()

    def _malformed(self, why: str) -> None:
        """llhttp refused the bytes (or they are over the head's limits): nothing more is
        parsed; the requests before them are answered, then a 400 Status, then the end."""
        self._dead = True
        detail = (why.strip().splitlines() or ["malformed request"])[0]
        self._guard.metrics.rejected.labels("malformed").inc()
        log.warning("refused a malformed request from %s: %s", self.remote, detail)
        refusal = status_answer(BadRequest(detail))
        parsing = self._parsing
        if parsing is not None:
            # Its body is what llhttp refused: whoever reads it is told, and answers; nothing
            # after it is served.
            self._parsing = None
            parsing.error = BadRequest(detail)
            parsing.complete = True
            parsing.wake()
            self._upgraded = parsing
            if parsing is self._current or parsing in self._queue:
                return
        if self._current is None and not self._queue:
            self._last_answer(refusal)
            return
        # Answered after the requests before it, in order (a pseudo-request that only fails).
        pending = _Pending(Request("", "", _NO_HEADERS, (1, 1), self.remote))
        pending.error = BadRequest(detail)
        pending.complete = pending.malformed = True
        self._queue.append(pending)
        self._upgraded = pending
        self._serve_next()

    def _last_answer(self, answer: Answer) -> None:
        """Write a last answer, then close lingering (see :meth:`_close_lingering`)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        head = response_head(
            answer.status, answer.reason, answer.headers, length=len(answer.body), close=True
        )
        transport.write(head + answer.body)
        self._close_lingering()

    def _close_lingering(self) -> None:
        """End the writing side now and the connection once the client is silent (see
        LINGER_SECONDS), dropping what it still sends."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._dead = True
        self._timer.stop()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        now = self._heard_at = self.loop.time()
        self._linger_until = now + LINGER_MAX_SECONDS
        self._closer = self.loop.call_later(LINGER_SECONDS, self._end_linger)

    def _end_linger(self) -> None:
        """Close once the client has been silent for LINGER_SECONDS (or at the bound)."""
        self._closer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        now = self.loop.time()
        quiet_at = self._heard_at + LINGER_SECONDS
        if now >= quiet_at or now >= self._linger_until:
            transport.close()
            return
        self._closer = self.loop.call_at(min(quiet_at, self._linger_until), self._end_linger)


class _AfterUpgrade(Exception):
    """Bytes after a request that ends HTTP on its connection."""


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class Response:
    """The one writer of one request's answer, on its connection.

    ``status`` is what the client has been sent (0: nothing yet). Write calls after the client
    left are no-ops; the request's work ends then anyway (``clientgone``). ``close``: the
    connection ends after this answer (``Connection: close`` is said in its head)."""

    __slots__ = (
        "_chunked",
        "_conn",
        "_head_only",
        "_pending",
        "close",
        "finished",
        "lost",
        "status",
        "taken_over",
        "task",
    )

    def __init__(self, conn: HttpProtocol, pending: _Pending) -> None:
        self._conn = conn
        self._pending = pending
        self.lost = conn.lost  # resolves when the client's connection is lost
        # The connection's server task, which runs the handler (``clientgone`` cancels it when
        # the client leaves; looking it up is a Python call on 3.11).
        self.task = conn._server
        request = pending.request
        self._head_only = request.method == "HEAD"
        self._chunked = False
        self.status = 0
        self.finished = False
        self.taken_over = False
        self.close = (
            conn._guard.draining
            or request.chunked  # see last_on_connection
            or pending is conn._upgraded
        )

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._conn.transport

    def client_gone(self) -> bool:
        return self._live_transport() is None

    async def body(self, limit: int) -> bytes:
        """The request's whole body, at most ``limit`` bytes (``PayloadTooLarge``); the
        handler claims it by asking (before that, the socket stops being read past
        UNCLAIMED_BODY_BYTES, so that the handler may refuse it unread)."""
        return await self._conn.read_body(self._pending, limit)

    @property
    def body_error(self) -> ProxyError | None:
        """What the parser found wrong with the body before anyone read it (a 413)."""
        return self._pending.error

    def _live_transport(self) -> asyncio.Transport | None:
        """The connection's transport while the client is there to be written to."""
        transport = self._conn.transport
        return None if transport is None or transport.is_closing() else transport

    def _write(self, data: bytes) -> None:
        transport = self._live_transport()
        if transport is not None:
            transport.write(data)

    def start(
        self,
        status: int,
        reason: str,
        headers: Mapping[str, str],
        *,
        length: int | None = None,
        chunked: bool = False,
    ) -> None:
        """Write the head: with ``length`` a body of that many bytes follows, ``chunked`` a
        chunked one; with neither, ``headers`` say (an upstream Content-Length kept, a 101)."""
        if self._head_only or status in _NO_BODY or status < 200:
            chunked = False
        if self._conn._guard.draining:
            self.close = True
        self._chunked = chunked
        self.status = status
        self._write(
            response_head(
                status, reason or reason_phrase(status), headers,
                length=length, chunked=chunked, close=self.close and status != 101,
            )
        )  # fmt: skip

    def write(self, data: bytes) -> None:
        """A piece of the body (framed as a chunk when the answer is chunked)."""
        if not data or self._head_only:
            return
        if not self._chunked:
            self._write(data)
        elif len(data) < _FRAME_BY_COPY_BELOW:
            self._write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            # A large piece (a LIST's paced piece, a relayed body's chunk) is handed over as it
            # is, between its framing: formatted into one frame it would be copied, and the
            # transport holds that copy until the client takes it, twice the piece per slow
            # reader (tests/component/test_hub_list_stream.py measures it).
            transport = self._live_transport()
            if transport is not None:
                transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))

    async def drain(self) -> None:
        """Until the connection's write buffer is under its low-water mark (or it is gone)."""
        await self._conn.drain()

    def end(self) -> None:
        """The answer is complete."""
        if self._chunked and not self._head_only:
            self._write(_LAST_CHUNK)
        self.finished = True

    def send(self, status: int, reason: str, headers: Mapping[str, str], body: bytes) -> None:
        """A whole answer, head and body in one write, with its length."""
        self.status = status
        if self._conn._guard.draining:
            self.close = True
        no_body = self._head_only or status in _NO_BODY
        head = response_head(
            status,
            reason or reason_phrase(status),
            headers,
            length=None if status in _NO_BODY else len(body),
            close=self.close,
        )
        self._write(head if no_body else head + body)
        self.finished = True

    def send_answer(self, answer: Answer) -> None:
        self.send(answer.status, answer.reason, answer.headers, answer.body)

    @property
    def passes_raw(self) -> bool:
        """Whether an upstream answer's head may go to the client as it came (see
        :meth:`send_raw`): this answer neither closes its connection nor is for a HEAD."""
        return not (self.close or self._head_only or self._conn._guard.draining)

    def send_raw(self, status: int, data: bytes) -> None:
        """An upstream answer whose head may go on as it came (nothing hop-by-hop in it)."""
        self.status = status
        self._write(data)
        self.finished = True

    def send_error(self, error: ProxyError) -> None:
        """The one Status answer of a refusal; ``error.closes_connection`` ends it."""
        if error.closes_connection:
            self.close = True
        self.send_answer(status_answer(error))

    async def send_stream(
        self,
        status: int,
        reason: str,
        headers: Mapping[str, str],
        chunks: AsyncIterable[bytes],
        *,
        length: int | None = None,
    ) -> None:
        """A body given as an async iterator of pieces, written at the pace the client reads:
        chunked, or of ``length`` bytes. The iterator raising ends the connection (an answer
        that cannot be completed must not look whole), then the error propagates."""
        self.start(status, reason, headers, length=length, chunked=length is None)
        try:
            async for chunk in chunks:
                self.write(chunk)
                await self._conn.drain()
        except BaseException:
            self.abort()
            raise
        self.end()

    def abort(self) -> None:
        """Close the connection: an answer that cannot be completed must not look whole."""
        self.close = True
        transport = self._conn.transport
        if transport is not None:
            transport.close()

    def take_over(self, tunnel: Tunnel) -> asyncio.Transport:
        """Switch protocols: every later byte of the connection goes to ``tunnel``; the caller
        owns the connection from now on (and closes it)."""
        transport = self._conn.take_over(self._pending, tunnel)
        self.taken_over = True
        self.close = True
        return transport
