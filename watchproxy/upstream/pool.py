"""The connections to one apiserver: the one dial path, and the idle keep-alive connections.

Every request the proxy sends upstream — one-shot, streamed (a watch, ``logs -f``) or an upgrade
(exec, attach, port-forward) — goes through :meth:`ConnectionPool.request`, which takes an idle
connection or dials one, writes the request, and waits for the head of its answer.

**One dial at a time.** With keep-alive, requests normally reuse pooled connections. When the
apiserver goes away every pooled connection dies at once and each waiting request would dial
anew: N clients, N connection attempts. Dialing one connection at a time means the first
failure is known before the next dial, so the count of attempts follows the prober's single
backoff schedule. Only the connectivity probe may dial while the upstream is known to be down.

**Who owns the socket.** The loop creates, connects and owns each socket itself
(``loop.create_connection(host=..., port=...)``): no socket is connected by one library and
handed to another. Under uvloop 0.23 such a hand-off (``create_connection(sock=...)``) gives one
descriptor two owners when the peer resets the connection between the TCP connect and the TLS
handshake: libuv closes the descriptor, the Python socket object still holds its number, and
when that object is finalized it closes whatever connection the OS has given the number since
(a live watch then carries another connection's bytes; uvloop#645, #738 fixed a neighbouring
case only). Happy-eyeballs racing is not needed for one apiserver: the loop tries the addresses
in order.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import collections
import contextvars
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from watchproxy.upstream.connection import Broken, Connection, ResponseHead
from watchproxy.upstream.response import UpstreamResponse

log = logging.getLogger("watchproxy.upstream")

# An idle connection is closed after this long. The apiserver closes idle connections after
# 90 s (its http.Server IdleTimeout); closing well before that means a request is never sent on
# a connection the apiserver is closing at that moment.
MAX_IDLE_SECONDS = 30.0
# Idle connections kept at most; more concurrent requests dial more, and the rest close.
MAX_IDLE = 64

# Set by the connectivity probe: its dial is the one allowed while the upstream is down.
PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("watchproxy_probing", default=False)

# What uvloop says when asked to watch a descriptor that a live transport still claims: the
# signature of a descriptor closed behind the loop's back and reused (see above).
REUSED_DESCRIPTOR = "is used by transport"


class UpstreamDown(Exception):
    """Refused locally: the upstream is known to be unreachable and this is not the probe."""


class DialFailed(Exception):
    """No connection to the apiserver (refused, unreachable, timed out, TLS handshake failed);
    ``str()`` is the cause as an operator should read it."""

    def __init__(self, cause: BaseException, host: str, port: int | None) -> None:
        super().__init__(dial_cause(cause, host, port))
        self.cause = cause


def dial_cause(cause: BaseException, host: str, port: int | None) -> str:
    """Why a dial to ``host:port`` failed, in the words logs, the prober and Status messages
    use: an operator reads one wording per cause. Credential-free."""
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {cause.verify_message or cause}"
    if isinstance(cause, ssl.SSLError):
        return f"TLS error: {cause}"
    if isinstance(cause, socket.gaierror):
        return f"DNS lookup failed for {host}"
    if isinstance(cause, TimeoutError):
        return f"cannot connect to {host}:{port}: timed out"
    if isinstance(cause, OSError):
        return f"cannot connect to {host}:{port}: {cause.strerror or cause}"
    return f"{type(cause).__name__}: {cause}"


def reports_reused_descriptor(context: dict[str, Any]) -> bool:
    """Whether an event-loop exception context reports a descriptor closed twice: a transport
    that still claims a reused descriptor, or one whose attached socket was already closed."""
    error = context.get("exception")
    if isinstance(error, RuntimeError) and REUSED_DESCRIPTOR in str(error):
        return True
    return "could not close attached file object" in str(context.get("message", ""))


class ConnectionPool:
    """Idle keep-alive connections to one apiserver, and the dials that make new ones: one at
    a time, none while the upstream is down (but the probe's), each counted and its failure
    reported before the next may start."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        is_down: Callable[[], bool] = lambda: False,
        on_failure: Callable[[DialFailed], None] = lambda _error: None,
        on_dial: Callable[[], None] = lambda: None,
        on_reused_descriptor: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host = host
        self._port = port
        self._is_down = is_down
        self._on_failure = on_failure
        self._on_dial = on_dial
        self._on_reused_descriptor = on_reused_descriptor
        self._clock = clock
        self._dialing = asyncio.Lock()
        self._idle: collections.deque[Connection] = collections.deque()
        self._open: set[Connection] = set()
        self._ssl_context: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dials = 0

    def open_connections(self) -> int:
        """Connections this pool dialed that are still open (in use, idle, or upgraded)."""
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
        upgrade: bool = False,
    ) -> UpstreamResponse:
        """Send one request (its encoded head and body) and wait for the head of its answer.
        ``read_timeout``: the longest silence while the answer's body is read (None: none);
        ``deadline``: seconds for the head to come (None: no limit), else TimeoutError.

        A reused connection the apiserver closed just as the request went out fails before any
        byte of an answer; ``may_resend`` (an idempotent request) sends it once more on a fresh
        connection. ``upgrade``: a new connection, never an idle one (an upgrade keeps its
        connection for as long as its session lasts, and is never sent twice), with the TLS
        layer of :func:`_dial_byte_stream`. Raises Broken, DialFailed or UpstreamDown.
        """
        if ssl_context is not self._ssl_context:
            # A rotated CA or client certificate: connections made with the old ones are not
            # kept for new requests.
            self._ssl_context = ssl_context
            self._drop_idle()
        loop = self._loop
        if loop is None:  # once: each lookup is a getpid() on 3.11
            loop = self._loop = asyncio.get_running_loop()
        expires = None if deadline is None else loop.time() + deadline
        for attempt in range(2):
            connection = None if upgrade else self._take_idle()
            if connection is None:
                connection = await self._dial(ssl_context, connect_timeout, byte_stream=upgrade)
            try:
                head = await _exchange(connection, data, head_request, expires)
            except Broken as broken:
                if attempt == 0 and connection.reused and broken.before_answer and may_resend:
                    continue
                raise
            return UpstreamResponse(connection, head, read_timeout, self._put)
        raise AssertionError("unreachable")  # pragma: no cover

    def close_idle(self) -> None:
        self._drop_idle()

    async def close(self, timeout: float) -> None:
        """Close every connection; wait up to ``timeout`` for their TLS shutdown, then abort
        the stragglers (a peer slow to answer close_notify, as the Go apiserver is)."""
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

    def _put(self, connection: Connection) -> None:
        if len(self._idle) >= MAX_IDLE:
            connection.close()
            return
        connection.idle_since = self._clock()
        connection.reused = True
        self._idle.append(connection)

    def _take_idle(self) -> Connection | None:
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
        self, ssl_context: ssl.SSLContext | None, connect_timeout: float, *, byte_stream: bool
    ) -> Connection:
        """One new connection, under the lock; the loop creates the socket itself."""
        async with self._dialing:
            if self._is_down() and not PROBING.get():
                raise UpstreamDown("the apiserver is unreachable")
            self.dials += 1
            self._on_dial()
            connection = Connection()
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(connect_timeout):
                    if byte_stream and ssl_context is not None:
                        await _dial_byte_stream(
                            loop, connection, self._host, self._port, ssl_context
                        )
                    else:
                        await loop.create_connection(
                            lambda: connection, self._host, self._port, ssl=ssl_context
                        )
            except RuntimeError as error:
                if REUSED_DESCRIPTOR in str(error):
                    self._on_reused_descriptor()
                    log.error(
                        "the event loop reports a reused file descriptor (a socket closed "
                        "twice): %s",
                        error,
                    )
                failure = DialFailed(OSError(str(error)), self._host, self._port)
            except (OSError, TimeoutError) as error:  # ssl.SSLError is an OSError
                failure = DialFailed(error, self._host, self._port)
            else:
                self._open.add(connection)
                connection.closed.add_done_callback(lambda _: self._open.discard(connection))
                return connection
            # Recorded before the next dial may start (still holding the lock).
            self._on_failure(failure)
            raise failure


async def _dial_byte_stream(
    loop: asyncio.AbstractEventLoop,
    connection: Connection,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
) -> None:
    """A TLS connection for an upgrade, with asyncio's own TLS layer (``asyncio.sslproto``)
    over the loop's TCP transport instead of uvloop's.

    uvloop 0.23's TLS layer, when the TCP FIN arrives while its reading is paused (the reader
    is behind: an exec session's output to a slow client), drops the bytes it has received but
    not yet decrypted and reports a clean end (``uvloop/sslproto.pyx``, ``eof_received``; an
    open pull request, MagicStack/uvloop#661, proposes to read them first). The apiserver, like
    any Go server, sends its last bytes, close_notify and its FIN at once when the kubelet ends a
    session, so through watchproxy the tail of a large exec output went missing, up to the
    layer's read buffer (about 200 kB of 2.9 MB, 1 session in 5 to 20; kubectl 1.27 then exits
    0 with the output cut, kubectl 1.37 sees WebSocket close 1006). asyncio's layer keeps a FIN
    that comes while it is paused until its reader resumes, then hands over every byte that
    came before it. Only upgrades dial this way: their answer ends with the connection's
    close, and they are few; every other answer ends in its own framing."""
    waiter: asyncio.Future[None] = loop.create_future()
    layer = asyncio.sslproto.SSLProtocol(
        loop, connection, ssl_context, waiter, server_side=False, server_hostname=host
    )
    transport, _ = await loop.create_connection(lambda: layer, host, port)
    try:
        await waiter  # the handshake
    except BaseException:
        transport.abort()
        raise


async def _exchange(
    connection: Connection, data: bytes, head_request: bool, expires: float | None
) -> ResponseHead:
    """Send on ``connection`` and wait for the answer's head until loop time ``expires``; a
    connection whose exchange failed in any way is aborted (its state is unknown)."""
    connection.send(data, head_request=head_request)
    connection.set_deadline(expires)
    try:
        return await connection.head()
    except BaseException:
        connection.abort()  # broken, cancelled or timed out mid-request
        raise
    finally:
        connection.set_deadline(None)
