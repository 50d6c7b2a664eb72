"""Upstream TCP connections are opened one at a time, and not at all while the apiserver is down.

With keep-alive, requests normally reuse pooled connections. When the apiserver goes away
every pooled connection dies at once and each waiting request would dial anew: N clients,
N connection attempts. Opening new connections one at a time means the first failure is known
before the next dial, so the count of attempts follows the prober's single backoff schedule.
Only the connectivity probe may dial while the upstream is known to be down.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import weakref
from collections.abc import Callable
from typing import Any

import aiohttp

log = logging.getLogger("watchproxy.connector")

# Set by the connectivity probe: its dial is the one allowed while the upstream is down.
PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("watchproxy_probing", default=False)


class UpstreamDown(aiohttp.ClientConnectionError):
    """Refused locally: the upstream is known to be unreachable and this is not the probe."""


class SerialConnector(aiohttp.TCPConnector):
    """A TCPConnector that dials one connection at a time and reports each dial's outcome."""

    def __init__(
        self,
        *,
        is_down: Callable[[], bool],
        on_failure: Callable[[BaseException], None],
        on_dial: Callable[[], None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._on_dial = on_dial
        self._is_down = is_down
        self._on_failure = on_failure
        self._dialing = asyncio.Lock()
        self._dialed: weakref.WeakSet[Any] = weakref.WeakSet()

    def open_connections(self) -> int:
        """Connections this connector opened that are still open (in use or pooled)."""
        return sum(1 for protocol in list(self._dialed) if protocol.is_connected())

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        async with self._dialing:
            if self._is_down() and not PROBING.get():
                raise UpstreamDown("the apiserver is unreachable")
            self._on_dial()
            try:
                protocol = await self._dial(req, traces, timeout)
            except (OSError, aiohttp.ClientError, TimeoutError) as error:
                # Record it before the next dial may start (still holding the lock).
                self._on_failure(error)
                raise
            self._dialed.add(protocol)
            return protocol

    async def _dial(self, req: Any, traces: Any, timeout: Any) -> Any:
        try:
            return await super()._create_connection(req, traces, timeout)
        except RuntimeError as error:
            if "is used by transport" not in str(error):
                raise
            # uvloop (MagicStack/uvloop#653) can keep a dead transport registered for a file
            # descriptor the OS has already reused; it is forgotten once collected. Collect,
            # try once more, and otherwise report an ordinary connection failure.
            log.warning("uvloop kept a stale transport for a reused socket; collecting it")
            gc.collect()
            try:
                return await super()._create_connection(req, traces, timeout)
            except RuntimeError as again:
                raise aiohttp.ClientConnectionError(
                    f"event loop refused the socket: {again}"
                ) from None
