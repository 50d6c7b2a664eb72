"""The proxy as one object: builds the components from the config and owns their lifetimes."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from watchproxy.config import Config
from watchproxy.hub.multiplexer import Hub
from watchproxy.lists.batch import ListBatcher
from watchproxy.lists.cached import CachedLists
from watchproxy.lists.consistent import ConsistentLists
from watchproxy.lists.sharedaccess import SharedAccess
from watchproxy.metrics import Metrics
from watchproxy.policy.access import AccessPolicy
from watchproxy.policy.adaptive import AdaptiveLimit, AdaptiveSettings
from watchproxy.policy.backoff import BackoffPolicy
from watchproxy.policy.bodybudget import BodyBudget
from watchproxy.policy.clientlimits import ClientRateLimiter, ErroredWatchLimiter
from watchproxy.policy.ratelimit import UpstreamLimiter
from watchproxy.server.admin import build_admin_app
from watchproxy.server.api import ApiHandler
from watchproxy.server.listener import ConnectionGuard
from watchproxy.server.passthrough import Forwarder
from watchproxy.server.protocol import IDLE_TIMEOUT_SECONDS
from watchproxy.server.upgrade import UpgradeRelay
from watchproxy.server.watchsink import HubEndpoint
from watchproxy.upstream.client import Upstream
from watchproxy.upstream.connectivity import Connectivity
from watchproxy.upstream.credentials import UpstreamTarget, from_kubeconfig
from watchproxy.upstream.pool import reports_reused_descriptor
from watchproxy.upstream.watchsource import UpstreamWatchSource

# The embedding API: a Proxy, and the upstream target it is built with (bench/ and the demo
# embed the proxy through these and nothing else).
__all__ = ["Proxy", "UpstreamTarget", "from_kubeconfig"]

log = logging.getLogger("watchproxy")


def backoff_policy(config: Config) -> BackoffPolicy:
    b = config.backoff
    return BackoffPolicy(
        initial=b.initial_seconds,
        factor=b.factor,
        cap=b.max_seconds,
        jitter=b.jitter,
        reset_after=b.reset_after_seconds,
    )


def probe_policy(config: Config) -> BackoffPolicy:
    """The prober's schedule while the apiserver is down: the same growth, a lower cap and a
    quarter of jitter at the cap.

    The cap trades recovery latency against load on a dead apiserver. With a probe every
    ``g`` seconds at the cap, the first event after the apiserver returns is about ``g / 2``
    late on average, and a 30 s outage costs about ``2 + ramp + 30 / g`` connection attempts
    (two failed dials declare it down, then the probes; the ramp is the probes before the cap).
    The default 8 s (delays in [6, 8] s at the cap) keeps a 30 s outage to 8-10 attempts, with
    the first event about 3.5-4 s after recovery, where the 30 s cap the shared watches use
    made it 10 s (bench.outage: bench/README.md, "Figures behind the code"). A 2 s median would
    need a probe every ~3.5 s: 10 or more attempts per 30 s, which is exactly the load on a
    struggling apiserver that watchproxy exists to remove.
    """
    b = config.backoff
    return BackoffPolicy(
        initial=b.initial_seconds,
        factor=b.factor,
        cap=max(b.initial_seconds, min(b.max_seconds, b.probe_max_seconds)),
        jitter=b.jitter,
        reset_after=b.reset_after_seconds,
        cap_jitter=0.25,
    )


class Proxy:
    """watchproxy: the API port, the admin port, the upstream client and the watch hub.

    ``start()`` binds both ports (port 0 picks a free one; see ``api_port``/``admin_port``);
    ``stop()`` stops accepting, ends open streams cleanly and releases everything it started.
    """

    def __init__(
        self, config: Config, target: UpstreamTarget, *, rng: random.Random | None = None
    ) -> None:
        self.config = config
        self.metrics = Metrics()
        self.rng = rng or random.Random()
        rl = config.ratelimit
        adaptive = (
            AdaptiveLimit(
                AdaptiveSettings(
                    initial=rl.adaptive_initial_limit,
                    minimum=rl.adaptive_min_limit,
                    maximum=rl.adaptive_max_limit,
                )
            )
            if rl.adaptive
            else None
        )
        self.limiter = UpstreamLimiter(rl.qps, rl.burst, rl.max_concurrent, adaptive=adaptive)
        self.upstream = Upstream(
            target,
            config.upstream,
            limiter=self.limiter,
            metrics=self.metrics,
            max_wait=rl.max_wait_seconds,
        )
        self.connectivity = Connectivity(
            self.upstream.probe, probe_policy(config), self.metrics, rng=self.rng
        )
        self.upstream.connectivity = self.connectivity
        # A rate of 0 is unlimited: the limiter then admits every request at once.
        self.client_limiter = ClientRateLimiter(rl.per_client_qps, rl.per_client_burst)
        self.forwarder = Forwarder(
            self.upstream,
            max_body_bytes=config.limits.max_body_bytes,
            body_budget=BodyBudget(config.limits.max_buffered_body_bytes),
            forward_identity=config.security.identity == "forward",
            forward_impersonation=config.security.impersonation == "forward",
            stream_idle_timeout=config.upstream.stream_idle_timeout_seconds,
        )
        self.relay = UpgradeRelay(
            self.upstream,
            forward_identity=config.security.identity == "forward",
            forward_impersonation=config.security.impersonation == "forward",
        )
        self.list_batcher: ListBatcher | None = None
        if config.limits.list_batch_max_bytes:
            self.list_batcher = ListBatcher(
                self.forwarder,
                max_bytes=config.limits.list_batch_max_bytes,
                metrics=self.metrics,
                budget=BodyBudget(config.limits.max_buffered_list_bytes),
            )
        self.hub: Hub | None = None
        if config.hub.enabled:
            self.hub = Hub(
                source=UpstreamWatchSource(
                    self.upstream,
                    config.upstream,
                    # A LIST page that inflates past the whole cache budget could not be kept
                    # anyway: decoding stops there (the key is not shared, see hub/fetcher.py).
                    max_decoded_body=config.hub.cache_max_bytes or None,
                ),
                health=self.connectivity,
                hub_config=config.hub,
                backoff_policy=backoff_policy(config),
                metrics=self.metrics,
                forward_identity=config.security.identity == "forward",
                max_watches=config.limits.max_watches,
                rng=self.rng,
            )
        # Forward identity mode: shared state only for clients the apiserver authorizes now.
        self.shared_access: SharedAccess | None = None
        if self.hub is not None and config.security.identity == "forward":
            self.shared_access = SharedAccess(
                self.upstream,
                ttl=config.security.authorization_cache_seconds,
                metrics=self.metrics,
            )
        self.consistent_lists: ConsistentLists | None = None
        if self.hub is not None and config.hub.consistent_list_wait_seconds > 0:
            self.consistent_lists = ConsistentLists(
                self.hub,
                self.forwarder,
                wait_seconds=config.hub.consistent_list_wait_seconds,
                metrics=self.metrics,
                access=self.shared_access,
            )
        self._handler: ApiHandler | None = None
        # The API port's connections (server.listener); its handler is ``api``.
        self.guard: ConnectionGuard | None = None
        self.api_port = 0
        self.admin_port = 0
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.Server] = []
        self._loop_handler: tuple[asyncio.AbstractEventLoop, Any] | None = None

    @property
    def api(self) -> ApiHandler | None:
        """The API port's handler, once started."""
        return self._handler

    def ready(self) -> bool:
        draining = self._handler is not None and self._handler.draining
        return self.connectivity.up and not draining

    def debug_watches(self) -> list[dict[str, Any]]:
        if self.hub is None:
            return []
        return self.hub.debug()

    def _watch_loop_errors(self) -> None:
        """Count and log at ERROR what the loop reports about descriptors closed twice (see
        upstream/pool.py); everything else goes on to the handler that was there."""
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if reports_reused_descriptor(context):
                self.metrics.reused_descriptors.inc()
                log.error(
                    "the event loop reports a socket closed twice: %s", context.get("message")
                )
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)
        self._loop_handler = (loop, previous)

    async def start(self) -> None:
        self.metrics.start()
        self._watch_loop_errors()
        await self.upstream.start()
        self.connectivity.start()
        handler = ApiHandler(
            relay=self.relay,
            forwarder=self.forwarder,
            list_batcher=self.list_batcher,
            consistent_lists=self.consistent_lists,
            metrics=self.metrics,
            policy=AccessPolicy(
                self.config.security.rules,
                read_only=self.config.security.read_only,
                forward_impersonation=self.config.security.impersonation == "forward",
            ),
            allowed_hosts=self.config.listen.allowed_hosts,
            hub=(
                HubEndpoint(
                    self.hub,
                    CachedLists(self.hub, self.metrics, self.shared_access),
                    self.shared_access,
                )
                if self.hub is not None
                else None
            ),
            client_limit=self.client_limiter.check_now,
            watch_errors=ErroredWatchLimiter(
                self.config.ratelimit.watch_errors_per_second,
                self.config.ratelimit.watch_errors_burst,
            ),
        )
        self._handler = handler
        self.guard = guard = ConnectionGuard(
            handler,
            max_connections=self.config.limits.max_connections,
            header_timeout=self.config.limits.header_timeout_seconds,
            body_timeout=self.config.limits.body_timeout_seconds,
            body_min_rate=self.config.limits.body_min_bytes_per_second,
            max_body_bytes=self.config.limits.max_body_bytes,
            metrics=self.metrics,
        )
        admin_app = build_admin_app(
            metrics=self.metrics,
            ready=self.ready,
            debug_watches=self.debug_watches,
            debug_view=self.config.admin.debug_view,
        )
        self.api_port = await self._serve(guard, self.config.listen.host, self.config.listen.port)
        runner = web.AppRunner(
            admin_app,
            access_log=None,
            shutdown_timeout=self.config.limits.shutdown_grace_seconds / 2,
            keepalive_timeout=IDLE_TIMEOUT_SECONDS,
        )
        await runner.setup()
        self._runners.append(runner)
        assert runner.server is not None
        self.admin_port = await self._serve(
            runner.server, self.config.admin.host, self.config.admin.port
        )
        log.info(
            "serving the Kubernetes API on %s:%d (upstream %s), admin on %s:%d",
            self.config.listen.host,
            self.api_port,
            self.upstream.target.server,
            self.config.admin.host,
            self.admin_port,
        )

    async def _serve(self, factory: Callable[[], asyncio.Protocol], host: str, port: int) -> int:
        # Bind the socket here so that port 0 tells its real number, whatever the event loop.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host.strip("[]"), port), family=family, backlog=512)
        except OSError as error:  # one line that names the port (the CLI prints strerror)
            reason = os.strerror(error.errno).lower() if error.errno else str(error)
            raise OSError(error.errno, f"cannot listen on {host}:{port}: {reason}") from None
        # create_server listens again, with its own backlog (100) unless told: keep ours.
        server = await asyncio.get_running_loop().create_server(factory, sock=sock, backlog=512)
        self._servers.append(server)
        bound: int = sock.getsockname()[1]
        return bound

    async def stop(self) -> None:
        """Shut down in the order that starts nothing new upstream and loses no client's place:
        stop accepting (and refuse new watches on open connections), end every client stream
        cleanly with the hub, then release the upstream; bounded by the shutdown grace."""
        grace = self.config.limits.shutdown_grace_seconds
        if self._handler is not None:
            self._handler.draining = True
        if self.guard is not None:
            self.guard.draining = True
        for server in self._servers:
            server.close()  # stop accepting first
        try:
            if self.hub is not None:
                # Ends every subscriber's stream with a clean end; client re-watches meanwhile
                # are refused above, so no new shared watch (and no upstream watch) starts.
                try:
                    async with asyncio.timeout(grace / 2):
                        await self.hub.close()
                except TimeoutError:
                    log.warning("the hub did not close within half the %gs shutdown grace", grace)
            self.forwarder.close_streams()
            self.relay.close_sessions()
            if self.list_batcher is not None:
                await self.list_batcher.close()
            if self.consistent_lists is not None:
                await self.consistent_lists.close()
            if self.shared_access is not None:
                await self.shared_access.close()
            # The API port waits for the requests still in flight (half the grace), then
            # ends them and closes every connection.
            if self.guard is not None:
                await self.guard.drain(grace / 2)
        finally:
            # Whatever failed above is raised, after everything else is released.
            if self.guard is not None:
                await self.guard.close()
            await self.connectivity.close()
            await self.upstream.close()
            await self.metrics.stop()
            for runner in reversed(self._runners):  # the admin port, last
                await runner.cleanup()
            self._runners.clear()
            for server in self._servers:
                await server.wait_closed()
            self._servers.clear()
            if self._loop_handler is not None:
                loop, previous = self._loop_handler
                loop.set_exception_handler(previous)
                self._loop_handler = None
        log.info("stopped")
