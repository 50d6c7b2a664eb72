"""Upstream connections: one owner per socket, one dial at a time, none while the upstream is down.

**Who owns the socket.** aiohttp's stock connector connects a Python socket with
aiohappyeyeballs and hands it to the loop with ``loop.create_connection(sock=...)``. Under
uvloop that hand-off gives one descriptor two owners, libuv's TCP handle and the Python socket
object, and uvloop reconciles them only on the paths it expects. One it does not (uvloop 0.23,
``Loop.create_connection``, TLS, ``sock=``):

1. uvloop opens a TCP transport on descriptor N and schedules ``connection_made``;
2. the peer has already reset the connection (an apiserver that accepts TCP and resets it, as
   in an outage): the TLS protocol's ``connection_made`` writes its ClientHello, the write fails
   at once, and the transport schedules ``connection_lost`` — *before* ``create_connection``
   resumes from ``await waiter``, whose wake-up was queued after it;
3. ``connection_lost`` closes the transport: libuv closes N. The transport's attached file
   object would be detached here, but none is attached yet;
4. ``create_connection`` resumes and attaches the Python socket to the already closed transport
   (nothing will ever detach it), then fails on the TLS waiter. The Python socket still says
   ``fileno() == N``;
5. later — whenever the exception chain that references it is dropped, or a collection runs —
   the socket object is finalized and closes N *again*. By then the OS has handed N to another
   connection (a pooled keep-alive connection, the probe's, a shared watch's): that live
   transport loses its descriptor, uvloop still has it registered for N, the next socket to get
   N is refused by ``add_writer`` ("File descriptor N is used by transport"), and a connection
   that does get N carries another connection's bytes (TLS "wrong version number", a watch that
   the apiserver sees end at once while the proxy waits on its read).

uvloop 0.23 fixed the neighbouring case (an exception *during* ``await waiter``: MagicStack/uvloop
#645, #738, PR #740) but not this one. Forcing a garbage collection does not help: collecting is
exactly what finalizes stale socket objects and closes reused descriptors.

The fix is to have no hand-off: :class:`SerialConnector` lets the loop create, connect and own
each socket itself (``loop.create_connection(host=..., port=...)``), so libuv is the only owner
and closes each descriptor exactly once. Happy-eyeballs racing is not needed for one apiserver;
addresses are tried in order, one family at a time, as aiohttp itself falls back.

**One dial at a time.** With keep-alive, requests normally reuse pooled connections. When the
apiserver goes away every pooled connection dies at once and each waiting request would dial
anew: N clients, N connection attempts. Dialing one connection at a time means the first
failure is known before the next dial, so the count of attempts follows the prober's single
backoff schedule. Only the connectivity probe may dial while the upstream is known to be down.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import socket
import ssl
import weakref
from collections.abc import Callable
from typing import Any

import aiohttp

log = logging.getLogger("watchproxy.connector")

# Set by the connectivity probe: its dial is the one allowed while the upstream is down.
PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("watchproxy_probing", default=False)

# What uvloop says when asked to watch a descriptor that a live transport still claims: the
# signature of a descriptor closed behind the loop's back and reused (see above).
REUSED_DESCRIPTOR = "is used by transport"


class UpstreamDown(aiohttp.ClientConnectionError):
    """Refused locally: the upstream is known to be unreachable and this is not the probe."""


class SerialConnector(aiohttp.TCPConnector):
    """A TCPConnector that dials one connection at a time, lets the event loop own every
    socket it opens, and reports each dial's outcome."""

    def __init__(
        self,
        *,
        is_down: Callable[[], bool],
        on_failure: Callable[[BaseException], None],
        on_dial: Callable[[], None] = lambda: None,
        on_reused_descriptor: Callable[[], None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._on_dial = on_dial
        self._is_down = is_down
        self._on_failure = on_failure
        self._on_reused_descriptor = on_reused_descriptor
        self._dialing = asyncio.Lock()
        self._dialed: weakref.WeakSet[Any] = weakref.WeakSet()

    def open_connections(self) -> int:
        """Connections this connector opened that are still open (in use or pooled)."""
        return sum(1 for protocol in list(self._dialed) if protocol.is_connected())

    async def wait_closed(self, timeout: float) -> None:
        """After ``close()``: wait until every connection this connector dialed is gone.

        Mechanism: closing a TLS connection starts its shutdown (close_notify both ways); the
        transport lives on until ``connection_lost``. ``close()`` awaits that only for the
        connections still pooled or in use; those aiohttp closed earlier on release (a
        response cut short, ``Connection: close``) are known to nobody, and a peer that is slow
        to answer close_notify (the Go apiserver) leaves them open after the proxy stopped,
        until the loop closes under them. The transport keeps its protocol alive while it
        lives, so the weak set of dialed protocols still holds each of them. After
        ``timeout``, stragglers are aborted (and waited for as long again).
        """
        closing = [
            p.closed for p in list(self._dialed) if p.closed is not None and not p.closed.done()
        ]
        if closing:
            _done, late = await asyncio.wait(closing, timeout=timeout)
            if late:
                for protocol in list(self._dialed):
                    if protocol.transport is not None:
                        protocol.transport.abort()
                await asyncio.wait(late, timeout=timeout)
        for protocol in list(self._dialed):
            closed = protocol.closed
            if closed is not None and closed.done() and not closed.cancelled():
                closed.exception()  # retrieved: a connection lost with an error is expected

    async def dial(
        self,
        factory: Callable[[], asyncio.BaseProtocol],
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        timeout: float,
    ) -> None:
        """Open one connection for ``upstream.pool``, under the same rules as this connector's
        own: one dial at a time, none while the upstream is down (but the probe's), each dial
        counted and its failure reported before the next may start. The loop creates the
        socket itself (no hand-off). Raises DialFailed (or UpstreamDown)."""
        async with self._dialing:
            if self._is_down() and not PROBING.get():
                raise UpstreamDown("the apiserver is unreachable")
            self._on_dial()
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(timeout):
                    await loop.create_connection(factory, host, port, ssl=ssl_context)
            except RuntimeError as error:
                if REUSED_DESCRIPTOR in str(error):
                    self._on_reused_descriptor()
                    log.error("the event loop reports a reused file descriptor: %s", error)
                failure = DialFailed(OSError(str(error)), host, port)
            except (OSError, TimeoutError) as error:  # ssl.SSLError is an OSError
                failure = DialFailed(error, host, port)
            else:
                return
            self._on_failure(failure)
            raise failure

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        async with self._dialing:
            if self._is_down() and not PROBING.get():
                raise UpstreamDown("the apiserver is unreachable")
            self._on_dial()
            try:
                protocol = await super()._create_connection(req, traces, timeout)
            except (OSError, aiohttp.ClientError, TimeoutError) as error:
                # Record it before the next dial may start (still holding the lock).
                self._on_failure(error)
                raise
            self._dialed.add(protocol)
            return protocol

    async def _wrap_create_connection(
        self,
        *args: Any,
        addr_infos: list[Any],
        req: Any,
        timeout: aiohttp.ClientTimeout,
        client_error: type[Exception] = aiohttp.ClientConnectorError,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, aiohttp.client_proto.ResponseHandler]:
        """Replaces aiohttp's: the loop opens the socket (no ``sock=`` hand-off, see above).

        Tries the first address of each family, in order; aiohttp drops exactly those from
        ``addr_infos`` when this fails and calls again with the rest.
        """
        protocol_factory: Callable[[], aiohttp.client_proto.ResponseHandler]
        (protocol_factory,) = args  # aiohttp passes exactly its protocol factory
        loop = asyncio.get_running_loop()
        tried: set[int] = set()
        last: OSError | None = None
        try:
            async with asyncio.timeout(timeout.sock_connect):
                for family, _type, proto, _name, address in addr_infos:
                    if family in tried:
                        continue
                    tried.add(family)
                    try:
                        transport, protocol = await loop.create_connection(
                            protocol_factory,
                            address[0],
                            address[1],
                            family=family,
                            proto=proto,
                            flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                            **kwargs,
                        )
                    except ssl.SSLError:
                        raise  # the apiserver answered: another address will not do better
                    except OSError as error:
                        last = error
                        continue
                    except RuntimeError as error:
                        raise self._loop_refused(req, error) from None
                    return transport, protocol
        except ssl.CertificateError as error:
            raise aiohttp.ClientConnectorCertificateError(req.connection_key, error) from error
        except ssl.SSLError as error:
            raise aiohttp.ClientConnectorSSLError(req.connection_key, error) from error
        assert last is not None, "no address to connect to"
        if last.errno is None and isinstance(last, TimeoutError):
            raise last
        raise client_error(req.connection_key, last) from last

    def _loop_refused(self, req: Any, error: RuntimeError) -> Exception:
        """The loop refused a socket it should have accepted. A reused descriptor means some
        socket was closed twice: say so loudly and count it; the dial counts as failed."""
        if REUSED_DESCRIPTOR in str(error):
            self._on_reused_descriptor()
            log.error(
                "the event loop reports a reused file descriptor (a socket closed twice): %s",
                error,
            )
        return aiohttp.ClientConnectorError(req.connection_key, OSError(str(error)))


class DialFailed(Exception):
    """No connection to the apiserver (refused, unreachable, timed out, TLS handshake failed);
    ``str()`` is the cause as an operator should read it."""

    def __init__(self, cause: BaseException, host: str, port: int | None) -> None:
        super().__init__(dial_cause(cause, host, port))
        self.cause = cause


def dial_cause(
    cause: BaseException, host: str, port: int | None, *, resolving: bool = False
) -> str:
    """Why a dial to ``host:port`` failed, in the words logs, the prober and Status messages
    use, whichever client dialled (the pool, aiohttp's connector, an upgrade): an operator
    reads one wording per cause. ``resolving``: it failed looking ``host`` up (aiohttp
    reports that with a plain OSError). Credential-free."""
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {cause.verify_message or cause}"
    if isinstance(cause, ssl.SSLError):
        return f"TLS error: {cause}"
    if resolving or isinstance(cause, socket.gaierror):
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
