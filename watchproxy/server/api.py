"""The API port: what clients' KUBECONFIG points at. Routes each request to the hub or through.

Every error is turned into a Kubernetes ``Status`` response here, at the edge.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from watchproxy.errors import BadRequest, ProxyError, TooManyRequests, UpstreamUnavailable
from watchproxy.kube.apipath import ApiPath, parse_api_path
from watchproxy.kube.watchquery import WatchQuery, parse_watch_query
from watchproxy.metrics import Metrics
from watchproxy.policy.access import AccessPolicy, HostNotAllowed, host_allowed
from watchproxy.policy.ratelimit import ErroredWatchLimiter
from watchproxy.server.listener import ConnectionGuard
from watchproxy.server.passthrough import Forwarder
from watchproxy.server.upgrade import WebSocketRelay

log = logging.getLogger("watchproxy.server")

UPGRADE_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})

# A watch that ends sooner than this (and was not asked to) counts as ended in an error: the
# client sees no difference between it and an in-stream ERROR, and re-watches at once.
QUICK_END_SECONDS = 1.0
# A client over its errored-watch budget is held this long at most, then told 429.
MAX_ERROR_HOLD_SECONDS = 5.0
# Set on a watch request: its errored-watch key, and whether it asked for a short timeout.
_ERRORS_KEY = web.RequestKey("watchproxy.errored_watch", tuple[tuple[str, str, str], bool])


class WatchServer(Protocol):
    """The hub, as the server sees it: serve a watch, or return None to pass it through."""

    async def serve(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.StreamResponse | None: ...

    def serve_list(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.Response | None: ...


def status_response(error: ProxyError) -> web.Response:
    response = web.Response(
        status=error.code, body=json.dumps(error.status()).encode(), content_type="application/json"
    )
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response


def verb_of(method: str, api_path: ApiPath, watch: bool) -> str:
    """The Kubernetes verb of a request, as the apiserver's audit and metrics name it."""
    if api_path.kind in ("discovery", "other") or api_path.resource is None:
        return "get" if method in ("GET", "HEAD") else method.lower()
    if api_path.subresource in UPGRADE_SUBRESOURCES or api_path.subresource == "proxy":
        return "connect"
    if method in ("GET", "HEAD"):
        if watch or api_path.legacy_watch:
            return "watch"
        return "list" if api_path.is_collection else "get"
    if method == "DELETE":
        return "deletecollection" if api_path.is_collection else "delete"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def is_streaming(verb: str, api_path: ApiPath, raw_query: str) -> bool:
    if verb == "watch":
        return True
    return api_path.subresource == "log" and "follow=true" in raw_query


class ApiHandler:
    """The catch-all handler of the API port."""

    def __init__(
        self,
        *,
        forwarder: Forwarder,
        metrics: Metrics,
        policy: AccessPolicy,
        allowed_hosts: tuple[str, ...],
        hub: WatchServer | None = None,
        client_limit: Callable[[str], float] | None = None,
        watch_errors: ErroredWatchLimiter | None = None,
        guard: ConnectionGuard | None = None,
        relay: WebSocketRelay | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.guard = guard
        self.relay = relay
        self.forwarder = forwarder
        self.metrics = metrics
        self.policy = policy
        self.allowed_hosts = allowed_hosts
        self.hub = hub
        self.client_limit = client_limit
        self.watch_errors = watch_errors
        self._clock = clock
        # Set at shutdown: watches and streams still arriving on open keep-alive connections
        # (clients re-watching at once) are refused, so nothing new starts upstream after the
        # signal.
        self.draining = False

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        started = self._clock()
        verb = "unknown"
        kind = "request"
        gauge = self.metrics.in_flight.labels(kind)
        gauge.inc()
        if self.guard is not None:
            self.guard.request_started(request.transport)
        response: web.StreamResponse
        try:
            verb, response = await self._handle(request)
        except ProxyError as error:
            if isinstance(error, HostNotAllowed):
                self.metrics.rejected.labels("host").inc()
                log.warning("refused Host %r from %s", request.host, request.remote)
            response = status_response(error)
            if self.draining:
                response.force_close()  # the client reconnects, to the next instance
        finally:
            gauge.dec()
            if self.guard is not None:
                self.guard.request_finished(request.transport)
        finished = self._clock()
        self._count_errored_watch(request, response, finished - started)
        self.metrics.requests.labels(verb, str(response.status)).inc()
        self.metrics.request_duration.labels(verb).observe(finished - started)
        return response

    def _count_errored_watch(
        self, request: web.Request, response: web.StreamResponse, took: float
    ) -> None:
        noted = request.get(_ERRORS_KEY)
        if noted is None or self.watch_errors is None:
            return
        key, short_timeout = noted
        if response.status >= 400 or (took < QUICK_END_SECONDS and not short_timeout):
            self.watch_errors.record_error(key, self._clock())

    async def _hold_errored_client(
        self, request: web.Request, raw_path: str, query: WatchQuery
    ) -> None:
        """A client whose watches keep ending in errors waits before the next one is served,
        so that a library re-watching in a tight loop costs little (and nothing upstream)."""
        if self.watch_errors is None:
            return
        key = (request.remote or "", request.headers.get("User-Agent", ""), raw_path)
        timeout = query.timeout_seconds
        request[_ERRORS_KEY] = (key, timeout is not None and 0 < timeout <= QUICK_END_SECONDS)
        delay = self.watch_errors.wait(key, self._clock())
        if delay <= 0:
            return
        self.metrics.throttled.labels("client-errors").inc()
        if delay > MAX_ERROR_HOLD_SECONDS:
            raise TooManyRequests(
                f"client {request.remote}: too many watches of {raw_path} ended in errors",
                retry_after=delay,
            )
        await asyncio.sleep(delay)

    async def _handle(self, request: web.Request) -> tuple[str, web.StreamResponse]:
        if not host_allowed(request.headers.get("Host"), self.allowed_hosts):
            raise HostNotAllowed(f"Host {request.headers.get('Host')!r} is not allowed")
        raw_path, _, raw_query = request.raw_path.partition("?")
        try:
            api_path = parse_api_path(raw_path)
        except BadRequest:
            self.metrics.rejected.labels("path").inc()
            log.warning("refused non-canonical path %r from %s", raw_path[:200], request.remote)
            raise
        query: WatchQuery | None = None
        if api_path.resource is not None:
            query = parse_watch_query(request.rel_url.query)
        watch = bool(query and query.watch)
        verb = verb_of(request.method, api_path, watch)
        self.policy.check(request.method, raw_path)
        if self.draining and (
            verb in ("watch", "connect") or is_streaming(verb, api_path, raw_query)
        ):
            # Nothing long-lived starts after the signal (no new upstream watch); one-shot
            # requests are still answered while the upstream is open.
            raise UpstreamUnavailable("watchproxy is shutting down", retry_after=1)
        if request.headers.get("Upgrade") or api_path.subresource in UPGRADE_SUBRESOURCES:
            if self.relay is None or api_path.subresource not in UPGRADE_SUBRESOURCES:
                raise BadRequest(f"watchproxy does not relay upgrades on {raw_path}")
            upgrades = self.metrics.in_flight.labels("stream")
            upgrades.inc()
            try:
                return verb, await self.relay.relay(request)
            finally:
                upgrades.dec()
        if verb in ("watch", "list") and self.client_limit is not None:
            wait = self.client_limit(request.remote or "")
            if wait > 0:
                self.metrics.throttled.labels("client").inc()
                raise TooManyRequests(
                    f"client {request.remote} exceeds its {verb} rate limit", retry_after=wait
                )
        if verb == "watch" and query is not None:
            await self._hold_errored_client(request, raw_path, query)
        if verb == "list" and self.hub is not None and query is not None:
            cached = self.hub.serve_list(request, api_path, query)
            if cached is not None:
                return verb, cached
        if verb == "watch" and self.hub is not None and query is not None:
            served = await self.hub.serve(request, api_path, query)
            if served is not None:
                return verb, served
        streaming = is_streaming(verb, api_path, raw_query)
        gauge = self.metrics.in_flight.labels("stream") if streaming else None
        if gauge is not None:
            gauge.inc()
        try:
            return verb, await self.forwarder.forward(request, verb=verb, streaming=streaming)
        finally:
            if gauge is not None:
                gauge.dec()


def build_api_app(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]], *, max_body_bytes: int
) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app
