"""The API port: what clients' KUBECONFIG points at. Routes each request to the hub or through.

Each request is classified first, from values alone (``routes.classify``); then the handlers of
its route kinds run in order, each small, until one answers. Every error is turned into a
Kubernetes ``Status`` response here, at the edge.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from aiohttp import web

from watchproxy.errors import FaultyFraming, ProxyError, TooManyRequests
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.watchquery import QUICK_END_SECONDS, WatchQuery
from watchproxy.lists.answers import StreamedAnswer, stream
from watchproxy.lists.batch import Answer
from watchproxy.lists.ports import ListRequest
from watchproxy.metrics import Metrics
from watchproxy.policy.access import AccessPolicy
from watchproxy.policy.clientlimits import ErroredWatchLimiter
from watchproxy.policy.fairqueue import flow
from watchproxy.server.clientgone import CLIENT_CLOSED_REQUEST, STARTED, EndsWithClient
from watchproxy.server.listener import ConnectionGuard
from watchproxy.server.passthrough import Forwarder
from watchproxy.server.requesthead import faulty_framing, last_on_connection
from watchproxy.server.routes import Refusal, Route, RouteKind, Routing, classify
from watchproxy.server.upgrade import UpgradeRelay

log = logging.getLogger("watchproxy.server")

# A client over its errored-watch budget is held this long at most, then told 429.
MAX_ERROR_HOLD_SECONDS = 5.0
# Distinct (refused upgrade, client) pairs remembered so that each is logged once.
MAX_REFUSALS_LOGGED = 1024
# Set on a watch request: its errored-watch key, and whether it asked for a short timeout.
_ERRORS_KEY = web.RequestKey("watchproxy.errored_watch", tuple[tuple[str, str, str], bool])

Handler = Callable[[web.Request, Route], Awaitable[web.StreamResponse | None]]


class WatchServer(Protocol):
    """The hub, as the server sees it: serve a watch, or return None to pass it through."""

    async def serve(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.StreamResponse | None: ...

    async def serve_websocket(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.StreamResponse | None:
        """The same for a watch asked for over WebSocket: None to relay the upgrade."""

    async def serve_list(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> web.Response | StreamedAnswer | None: ...


class ConsistentListServer(Protocol):
    """Answers a LIST without a resourceVersion from the hub once its state is current, or
    returns None to let the route's next kind answer."""

    async def serve(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> web.Response | StreamedAnswer | None: ...


class BatchedListServer(Protocol):
    """Answers identical LISTs in flight together with one upstream LIST, or returns None
    (an answer too big to share) to let the route's next kind answer."""

    async def serve(self, request: web.Request) -> web.StreamResponse | None: ...

    async def answer(self, request: ListRequest) -> Answer | StreamedAnswer | None:
        """The same answer as it came, for the fast lane to write (no aiohttp response)."""


class Declines:
    """Stands in for a service that is not configured: it serves nothing. The router never
    routes to one (see :class:`~watchproxy.server.routes.Routing`); it keeps the handlers'
    collaborators typed as always present."""

    async def serve(self, request: ListRequest, *args: object) -> None:
        return None

    async def serve_websocket(self, request: web.Request, *args: object) -> None:
        return None

    async def serve_list(self, request: ListRequest, *args: object) -> None:
        return None

    async def answer(self, request: ListRequest) -> None:
        return None


def flow_key(
    remote: str, headers: Mapping[str, str], forward_identity: bool
) -> tuple[str, str, str]:
    """Who gets a fair share of the upstream budget: one program, told apart by its source
    address (one pod in node-local mode) and its User-Agent (in a sidecar every program comes
    from 127.0.0.1, and client-go, kubectl and the other clients each send their own), and by
    credential when clients' credentials are forwarded. Shared watches are the proxy's own
    work and are not charged to any client."""
    credential = ""
    if forward_identity:
        auth = headers.get("Authorization", "")
        # The client's bytes: a value aiohttp parsed may hold surrogate escapes (obs-text).
        raw = auth.encode("utf-8", "surrogateescape")
        credential = hashlib.sha256(raw).hexdigest()[:16] if auth else ""
    return remote, headers.get("User-Agent", ""), credential


def status_response(error: ProxyError) -> web.Response:
    response = web.Response(
        status=error.code, body=json.dumps(error.status()).encode(), content_type="application/json"
    )
    seconds = error.retry_after_seconds()
    if seconds is not None:
        response.headers["Retry-After"] = str(seconds)
    return response


def no_client_limit(remote: str) -> float:
    return 0.0


class ApiHandler:
    """The catch-all handler of the API port."""

    def __init__(
        self,
        *,
        forwarder: Forwarder,
        metrics: Metrics,
        policy: AccessPolicy,
        allowed_hosts: tuple[str, ...],
        guard: ConnectionGuard,
        relay: UpgradeRelay,
        watch_errors: ErroredWatchLimiter,
        hub: WatchServer | None = None,
        client_limit: Callable[[str], float] = no_client_limit,
        list_batcher: BatchedListServer | None = None,
        consistent_lists: ConsistentListServer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.guard = guard
        self.relay = relay
        self.forwarder = forwarder
        self.metrics = metrics
        self.watch_errors = watch_errors
        self.client_limit = client_limit
        self.routing = Routing.of(
            allowed_hosts,
            policy,
            hub=hub is not None,
            consistent_lists=hub is not None and consistent_lists is not None,
            list_batching=list_batcher is not None,
        )
        self.hub: WatchServer = hub or Declines()
        self.list_batcher: BatchedListServer = list_batcher or Declines()
        self.consistent_lists: ConsistentListServer = consistent_lists or Declines()
        self._clock = clock
        self._streams = metrics.in_flight_by("stream")
        # Every request in flight, read by its gauge at scrape time (no lock per request).
        self.in_flight = 0
        metrics.in_flight.labels("request").set_function(lambda: self.in_flight)
        self._handlers: dict[RouteKind, Handler] = {
            RouteKind.UPGRADE: self._upgrade,
            RouteKind.HUB_WATCH: self._hub_watch,
            RouteKind.HUB_WEBSOCKET_WATCH: self._hub_websocket_watch,
            RouteKind.CACHED_LIST: self._cached_list,
            RouteKind.CONSISTENT_LIST: self._consistent_list,
            RouteKind.BATCHED_LIST: self._batched_list,
            RouteKind.PASSTHROUGH_STREAM: self._passthrough_stream,
            RouteKind.PASSTHROUGH: self._passthrough,
        }
        # Set at shutdown. Watches, streams and upgrades still arriving on open keep-alive
        # connections (clients re-watching at once) are refused, so no watch starts upstream
        # after the signal; one-shot requests are still answered, so a client in the middle of
        # its work loses nothing. Every answer then closes its connection, and the client
        # reconnects to the next instance.
        self.draining = False
        # (what was refused, from whom) already logged: an upgrade refused is logged once per
        # kind and client, not per request (fabric8 retries its watches for ever).
        self._refusals_logged: set[tuple[str, str, str, str]] = set()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        started = self._clock()
        self.in_flight += 1
        transport = request.transport
        self.guard.request_started(transport, request.content)
        response: web.StreamResponse | None = None
        try:
            route = classify(
                request.method,
                request.raw_path,
                request.query,
                request.headers,
                self.routing,
                draining=self.draining,
            )
            # Whatever the request waits on upstream ends when its client's connection does.
            with EndsWithClient(self.guard.lost_signal(transport)) as scope:
                response = await self._serve(request, route)
        except ProxyError as error:
            response = status_response(error)
            if error.closes_connection:
                response.force_close()
        finally:
            self.in_flight -= 1
            self.guard.request_finished(transport)
        finished = self._clock()
        if scope.client_left:
            # Nobody reads this answer: it is for the metrics (the status the client saw, if
            # any). Leaving is the client's choice, not a watch that failed.
            response = request.get(STARTED) or web.Response(status=CLIENT_CLOSED_REQUEST)
        else:
            assert response is not None
            if route.verb == "watch":
                self._count_errored_watch(request, response, finished - started)
        if self.draining or (response.status != 101 and last_on_connection(request.headers)):
            response.force_close()
        stream = route.streaming or response.status == 101
        self.metrics.request_done(route.verb, response.status, finished - started, stream=stream)
        return response

    async def _serve(self, request: web.Request, route: Route) -> web.StreamResponse:
        faulty = faulty_framing(request.method, request.version, request.headers)
        if faulty is not None:
            self.metrics.rejected.labels("malformed").inc()
            raise FaultyFraming(faulty)
        if route.refusal is not None:
            return self._refuse(request, route, route.refusal)
        verb = route.verb
        if verb == "watch" or verb == "list":
            self.check_client_limit(request.remote or "", verb)
            if verb == "watch" and route.query is not None:
                await self._hold_errored_client(request, route.query)
        handlers = self._handlers
        for kind in route.kinds:
            response = await handlers[kind](request, route)
            if response is not None:
                return response
        raise AssertionError(f"no handler answered {route.kinds}")  # the last never declines

    def _refuse(self, request: web.Request, route: Route, why: Refusal) -> web.StreamResponse:
        assert route.error is not None
        if why.counted:
            self.metrics.rejected.labels(why.value).inc()
        if why is Refusal.HOST:
            log.warning("refused Host %r from %s", request.host, request.remote)
        elif why is Refusal.PATH:
            raw_path = request.raw_path.partition("?")[0]
            log.warning("refused non-canonical path %r from %s", raw_path[:200], request.remote)
        elif why is Refusal.UPGRADE_NOT_RELAYED:
            self._log_refused_upgrade(request, route)
        elif why.counted:
            raw_path = request.raw_path.partition("?")[0]
            log.info(
                "refused (%s) %s %s from %s",
                why.value,
                request.method,
                raw_path[:200],
                request.remote,
            )
        return status_response(route.error)

    def _log_refused_upgrade(self, request: web.Request, route: Route) -> None:
        upgrade = request.headers.get("Upgrade", "")[:40]
        client = (request.remote or "", request.headers.get("User-Agent", "")[:200])
        seen = (upgrade.lower(), route.verb, *client)
        if seen in self._refusals_logged:
            return
        if len(self._refusals_logged) >= MAX_REFUSALS_LOGGED:
            self._refusals_logged.clear()  # bounded; at worst a client is logged again
        self._refusals_logged.add(seen)
        log.warning(
            "refused an upgrade (%r, %s %s) from %s (%s): watchproxy does not relay it; "
            "further ones of this kind from this client are counted, not logged",
            upgrade,
            route.verb,
            request.raw_path.partition("?")[0][:200],
            *client,
        )

    def check_client_limit(self, remote: str, verb: str) -> None:
        """Raises TooManyRequests when the client at ``remote`` is over its LIST/WATCH rate."""
        wait = self.client_limit(remote)
        if wait > 0:
            self.metrics.throttled.labels("client").inc()
            raise TooManyRequests(
                f"client {remote} exceeds its {verb} rate limit", retry_after=wait
            )

    def _count_errored_watch(
        self, request: web.Request, response: web.StreamResponse, took: float
    ) -> None:
        noted = request.get(_ERRORS_KEY)
        if noted is None:
            return
        key, short_timeout = noted
        if response.status >= 400 or (took < QUICK_END_SECONDS and not short_timeout):
            self.watch_errors.record_error(key, self._clock())

    async def _hold_errored_client(self, request: web.Request, query: WatchQuery) -> None:
        """A client whose watches keep ending in errors waits before the next one is served,
        so that a library re-watching in a tight loop costs little (and nothing upstream)."""
        raw_path = request.raw_path.partition("?")[0]
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

    def _flow_of(self, request: web.Request) -> tuple[str, str, str]:
        return flow_key(request.remote or "", request.headers, self.forwarder.forward_identity)

    # The handlers, one per route kind: an answer, or None to let the route's next kind answer.

    async def _upgrade(self, request: web.Request, route: Route) -> web.StreamResponse:
        self._streams.inc()
        try:
            with flow(self._flow_of(request)):
                return await self.relay.relay(request)
        finally:
            self._streams.dec()

    async def _hub_watch(self, request: web.Request, route: Route) -> web.StreamResponse | None:
        assert route.api_path is not None and route.query is not None
        self._streams.inc()
        try:
            return await self.hub.serve(request, route.api_path, route.query)
        finally:
            self._streams.dec()

    async def _hub_websocket_watch(
        self, request: web.Request, route: Route
    ) -> web.StreamResponse | None:
        assert route.api_path is not None and route.query is not None
        self._streams.inc()
        try:
            return await self.hub.serve_websocket(request, route.api_path, route.query)
        finally:
            self._streams.dec()

    async def _cached_list(self, request: web.Request, route: Route) -> web.StreamResponse | None:
        assert route.api_path is not None and route.query is not None
        answer = await self.hub.serve_list(request, route.api_path, route.query)
        if isinstance(answer, StreamedAnswer):
            return await stream(request, answer)
        return answer

    async def _consistent_list(
        self, request: web.Request, route: Route
    ) -> web.StreamResponse | None:
        assert route.api_path is not None and route.query is not None
        # Its probe is charged like a batched LIST: to the client that starts it.
        with flow(self._flow_of(request)):
            answer = await self.consistent_lists.serve(request, route.api_path, route.query)
        if isinstance(answer, StreamedAnswer):
            return await stream(request, answer)
        return answer

    async def _batched_list(self, request: web.Request, route: Route) -> web.StreamResponse | None:
        with flow(self._flow_of(request)):
            return await self.list_batcher.serve(request)

    async def _passthrough_stream(self, request: web.Request, route: Route) -> web.StreamResponse:
        if route.unshared is not None:
            self.metrics.passthrough_watches.labels(route.unshared).inc()
        self._streams.inc()
        try:
            with flow(self._flow_of(request)):
                return await self.forwarder.forward(request, verb=route.verb, streaming=True)
        finally:
            self._streams.dec()

    async def _passthrough(self, request: web.Request, route: Route) -> web.StreamResponse:
        with flow(self._flow_of(request)):
            return await self.forwarder.forward(request, verb=route.verb, streaming=False)


def build_api_app(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]], *, max_body_bytes: int
) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app
