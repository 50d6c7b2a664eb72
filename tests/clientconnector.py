"""The tests' own aiohttp client connector: the real-apiserver tier's clients talk to TLS
kube-apiserver through it.

It was the product's upstream connector until watchproxy's upstream client became its own (one
pool over httptools, ``watchproxy/upstream/pool.py``); the tests keep it for two things a stock
``TCPConnector`` does not give them: the loop owns every socket it opens (no ``sock=``
hand-off, which uvloop 0.23 mishandles on a failed TLS dial: see ``watchproxy/upstream/pool.py``),
and :meth:`SerialConnector.wait_closed` lets a fixture wait for the TLS shutdowns the Go
apiserver answers late, so that no transport outlives a test's loop (a ResourceWarning there is
an error). It overrides aiohttp's private ``_create_connection`` and
``_wrap_create_connection``: test code only, pinned with aiohttp (constraints.txt).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import weakref
from collections.abc import Callable
from typing import Any

import aiohttp

log = logging.getLogger("tests.clientconnector")

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

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        async with self._dialing:
            if self._is_down():
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
