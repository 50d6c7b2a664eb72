"""The proxy as one object: builds the components from the config and owns their lifetimes."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from watchproxy.config import Config
from watchproxy.hub.multiplexer import Hub
from watchproxy.kube.credentials import UpstreamTarget
from watchproxy.metrics import Metrics
from watchproxy.policy.access import AccessPolicy
from watchproxy.policy.backoff import BackoffPolicy
from watchproxy.policy.ratelimit import ClientRateLimiter, UpstreamLimiter
from watchproxy.server.admin import build_admin_app
from watchproxy.server.api import ApiHandler, build_api_app
from watchproxy.server.listener import ConnectionGuard, status_server_factory
from watchproxy.server.passthrough import Forwarder
from watchproxy.server.upgrade import WebSocketRelay
from watchproxy.upstream.client import Upstream
from watchproxy.upstream.connectivity import Connectivity

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
        self.limiter = UpstreamLimiter(rl.qps, rl.burst, rl.max_concurrent)
        self.upstream = Upstream(
            target,
            config.upstream,
            limiter=self.limiter,
            metrics=self.metrics,
            max_wait=rl.max_wait_seconds,
        )
        self.connectivity = Connectivity(
            self.upstream.probe, backoff_policy(config), self.metrics, rng=self.rng
        )
        self.upstream.connectivity = self.connectivity
        self.client_limiter: ClientRateLimiter | None = None
        if rl.per_client_qps > 0:
            self.client_limiter = ClientRateLimiter(rl.per_client_qps, rl.per_client_burst)
        self.forwarder = Forwarder(
            self.upstream,
            max_body_bytes=config.limits.max_body_bytes,
            forward_identity=config.security.identity == "forward",
            watch_read_timeout=config.upstream.watch_read_timeout_seconds,
        )
        self.hub: Hub | None = None
        if config.hub.enabled:
            self.hub = Hub(
                upstream=self.upstream,
                connectivity=self.connectivity,
                hub_config=config.hub,
                upstream_config=config.upstream,
                backoff_policy=backoff_policy(config),
                metrics=self.metrics,
                forward_identity=config.security.identity == "forward",
                max_watches=config.limits.max_watches,
                rng=self.rng,
            )
        self.api_port = 0
        self.admin_port = 0
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.Server] = []

    def _client_limit(self, key: str) -> float:
        assert self.client_limiter is not None
        return self.client_limiter.check(key, time.monotonic())

    def ready(self) -> bool:
        return self.connectivity.up

    def debug_watches(self) -> list[dict[str, Any]]:
        if self.hub is None:
            return []
        return self.hub.debug()

    async def start(self) -> None:
        self.metrics.start()
        await self.upstream.start()
        self.connectivity.start()
        guard = ConnectionGuard(
            asyncio.Protocol,
            max_connections=self.config.limits.max_connections,
            header_timeout=self.config.limits.header_timeout_seconds,
            metrics=self.metrics,
        )
        handler = ApiHandler(
            guard=guard,
            relay=WebSocketRelay(
                self.upstream, forward_identity=self.config.security.identity == "forward"
            ),
            forwarder=self.forwarder,
            metrics=self.metrics,
            policy=AccessPolicy(
                self.config.security.rules, read_only=self.config.security.read_only
            ),
            allowed_hosts=self.config.listen.allowed_hosts,
            hub=self.hub,
            client_limit=self._client_limit if self.client_limiter is not None else None,
        )
        api_app = build_api_app(handler, max_body_bytes=self.config.limits.max_body_bytes)
        admin_app = build_admin_app(
            metrics=self.metrics, ready=self.ready, debug_watches=self.debug_watches
        )
        self.api_port = await self._serve(
            api_app, self.config.listen.host, self.config.listen.port, guard=handler.guard
        )
        self.admin_port = await self._serve(
            admin_app, self.config.admin.host, self.config.admin.port
        )
        log.info(
            "serving the Kubernetes API on %s:%d (upstream %s), admin on %s:%d",
            self.config.listen.host,
            self.api_port,
            self.upstream.target.server,
            self.config.admin.host,
            self.admin_port,
        )

    async def _serve(
        self, app: web.Application, host: str, port: int, *, guard: ConnectionGuard | None = None
    ) -> int:
        # Bind the socket here so that port 0 tells its real number, whatever the event loop.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host.strip("[]"), port), family=family, backlog=512)
        except OSError as error:  # one line that names the port (the CLI prints strerror)
            reason = os.strerror(error.errno).lower() if error.errno else str(error)
            raise OSError(error.errno, f"cannot listen on {host}:{port}: {reason}") from None
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        self._runners.append(runner)
        assert runner.server is not None
        factory: Callable[[], asyncio.Protocol] = runner.server
        if guard is not None:
            guard.inner_factory = status_server_factory(runner.server, self.metrics)
            factory = guard
        # create_server listens again, with its own backlog (100) unless told: keep ours.
        server = await asyncio.get_running_loop().create_server(factory, sock=sock, backlog=512)
        self._servers.append(server)
        bound: int = sock.getsockname()[1]
        return bound

    async def stop(self) -> None:
        if self.hub is not None:
            await self.hub.close()
        for server in self._servers:
            server.close()  # stop accepting first
        self.forwarder.close_streams()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        await self.connectivity.close()
        await self.upstream.close()
        await self.metrics.stop()
        log.info("stopped")
