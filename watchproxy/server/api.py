"""The API port: what clients' KUBECONFIG points at. Routes each request to the hub or through.

Every error is turned into a Kubernetes ``Status`` response here, at the edge.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from watchproxy.errors import BadRequest, ProxyError, TooManyRequests, UpstreamUnavailable
from watchproxy.kube.apipath import ApiPath, parse_api_path
from watchproxy.kube.headers import impersonates
from watchproxy.kube.watchquery import QUICK_END_SECONDS, WatchQuery, parse_watch_query
from watchproxy.metrics import Metrics
from watchproxy.policy.access import (
    AccessPolicy,
    HostNotAllowed,
    ImpersonationRefused,
    PolicyDenied,
    ReadOnlyRefused,
    host_allowed,
)
from watchproxy.policy.clientlimits import ErroredWatchLimiter
from watchproxy.policy.fairqueue import flow
from watchproxy.server.clientgone import CLIENT_CLOSED_REQUEST, STARTED, EndsWithClient
from watchproxy.server.consistentlist import ConsistentLists
from watchproxy.server.listbatch import ListBatcher
from watchproxy.server.listener import ConnectionGuard
from watchproxy.server.passthrough import Forwarder
from watchproxy.server.upgrade import UpgradeRelay

log = logging.getLogger("watchproxy.server")

UPGRADE_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})
# Set by the handler once it knows whether the answer is a stream (for the duration metrics).
STREAM = web.RequestKey("watchproxy_stream", bool)
VERB = web.RequestKey("watchproxy_verb", str)
_METHOD_VERBS = {"HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}

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


def reads_list_options(method: str, api_path: ApiPath) -> bool:
    """Whether the apiserver decodes this request's query as ListOptions (list, watch,
    deletecollection, the legacy ``/watch/`` paths). Elsewhere it ignores those parameters:
    ``GET .../configmaps/NAME?watch=1&limit=abc`` is a plain GET, answered 200."""
    if api_path.resource is None or api_path.subresource is not None:
        return False
    if method == "GET":
        return api_path.is_collection or api_path.legacy_watch
    return method == "DELETE" and api_path.is_collection and not api_path.legacy_watch


def verb_of(method: str, api_path: ApiPath, watch: bool) -> str:
    """The Kubernetes verb of a request, as the apiserver's audit and metrics name it.

    ``watch`` is the decoded ``watch`` parameter; it matters only on a collection."""
    if api_path.kind in ("discovery", "other") or api_path.resource is None:
        return "get" if method in ("GET", "HEAD") else method.lower()
    if api_path.subresource in UPGRADE_SUBRESOURCES or api_path.subresource == "proxy":
        return "connect"
    if method in ("GET", "HEAD"):
        if api_path.legacy_watch or (watch and api_path.is_collection):
            return "watch"
        return "list" if api_path.is_collection else "get"
    if method == "DELETE":
        return "deletecollection" if api_path.is_collection else "delete"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def refused_verb(request: web.Request) -> str:
    """The verb of a request that was refused before it was routed (for the metrics' labels):
    from its path and query when they parse, else from its method alone."""
    try:
        api_path = parse_api_path(request.raw_path.partition("?")[0])
        reads = reads_list_options(request.method, api_path)
        watch = reads and parse_watch_query(request.rel_url.query).watch
    except ProxyError:
        return _METHOD_VERBS.get(request.method, request.method.lower())
    return verb_of(request.method, api_path, watch)


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
        relay: UpgradeRelay | None = None,
        list_batcher: ListBatcher | None = None,
        consistent_lists: ConsistentLists | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.guard = guard
        self.list_batcher = list_batcher
        self.consistent_lists = consistent_lists
        self.relay = relay
        self.forwarder = forwarder
        self.metrics = metrics
        self.policy = policy
        self.allowed_hosts = allowed_hosts
        self.hub = hub
        self.client_limit = client_limit
        self.watch_errors = watch_errors
        self._clock = clock
        # Set at shutdown. Watches, streams and upgrades still arriving on open keep-alive
        # connections (clients re-watching at once) are refused, so no watch starts upstream
        # after the signal; one-shot requests are still answered, so a client in the middle of
        # its work loses nothing. Every answer then closes its connection, and the client
        # reconnects to the next instance.
        self.draining = False
        # Every request in flight, read by its gauge at scrape time (no lock per request).
        self.in_flight = 0
        metrics.in_flight.labels("request").set_function(lambda: self.in_flight)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        started = self._clock()
        self.in_flight += 1
        lost = None
        if self.guard is not None:
            self.guard.request_started(request.transport)
            lost = self.guard.lost_signal(request.transport)
        response: web.StreamResponse | None = None
        verb: str | None = None
        try:
            # Whatever the request waits on upstream ends when its client's connection does.
            with EndsWithClient(lost) as scope:
                verb, response = await self._handle(request)
        except ProxyError as error:
            if isinstance(error, HostNotAllowed):
                self.metrics.rejected.labels("host").inc()
                log.warning("refused Host %r from %s", request.host, request.remote)
            verb = refused_verb(request)
            response = status_response(error)
        finally:
            self.in_flight -= 1
            if self.guard is not None:
                self.guard.request_finished(request.transport)
        finished = self._clock()
        if scope.client_left:
            # Nobody reads this answer: it is for the metrics (the status the client saw, if
            # any). Leaving is the client's choice, not a watch that failed.
            verb = request.get(VERB) or refused_verb(request)
            response = request.get(STARTED) or web.Response(status=CLIENT_CLOSED_REQUEST)
        else:
            assert response is not None and verb is not None
            self._count_errored_watch(request, response, finished - started)
        if self.draining:
            response.force_close()
        stream = request.get(STREAM, False) or response.status == 101
        self.metrics.request_done(verb, response.status, finished - started, stream=stream)
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

    def _flow_of(self, request: web.Request) -> tuple[str, str, str]:
        """Who gets a fair share of the upstream budget: one program, told apart by its source
        address (one pod in node-local mode) and its User-Agent (in a sidecar every program
        comes from 127.0.0.1, and client-go, kubectl and the other clients each send their
        own), and by credential when clients' credentials are forwarded. Shared watches are
        the proxy's own work and are not charged to any client."""
        credential = ""
        if self.forwarder.forward_identity:
            auth = request.headers.get("Authorization", "")
            credential = hashlib.sha256(auth.encode()).hexdigest()[:16] if auth else ""
        return request.remote or "", request.headers.get("User-Agent", ""), credential

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
        if reads_list_options(request.method, api_path):
            query = parse_watch_query(request.rel_url.query)
        watch = bool(query and query.watch)
        verb = verb_of(request.method, api_path, watch)
        request[VERB] = verb
        try:
            # The apiserver serves "x/" as "x": so must every rule written for "x" apply to it.
            self.policy.check(
                request.method, raw_path[:-1] if api_path.trailing_slash else raw_path
            )
            self.policy.check_impersonation(request.headers.keys())
        except (ReadOnlyRefused, PolicyDenied, ImpersonationRefused) as refused:
            reason = (
                "read-only"
                if isinstance(refused, ReadOnlyRefused)
                else "impersonation"
                if isinstance(refused, ImpersonationRefused)
                else "policy"
            )
            self.metrics.rejected.labels(reason).inc()
            log.info(
                "refused (%s) %s %s from %s", reason, request.method, raw_path[:200], request.remote
            )
            raise
        streaming = is_streaming(verb, api_path, raw_query)
        request[STREAM] = streaming
        if self.draining and (streaming or request.headers.get("Upgrade")):
            raise UpstreamUnavailable("watchproxy is shutting down", retry_after=1)
        if request.headers.get("Upgrade") or api_path.subresource in UPGRADE_SUBRESOURCES:
            if self.relay is None or api_path.subresource not in UPGRADE_SUBRESOURCES:
                raise BadRequest(f"watchproxy does not relay upgrades on {raw_path}")
            upgrades = self.metrics.in_flight_by("stream")
            upgrades.inc()
            try:
                with flow(self._flow_of(request)):
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
        # Someone else's view (impersonation forwarded): the hub's state is not theirs to serve.
        hub = None if impersonates(request.headers) else self.hub
        if verb == "list" and hub is not None and query is not None:
            cached = hub.serve_list(request, api_path, query)
            if cached is None and self.consistent_lists is not None and request.method == "GET":
                # Its probe is charged like a batched LIST: to the client that starts it.
                with flow(self._flow_of(request)):
                    cached = await self.consistent_lists.serve(request, api_path, query)
            if cached is not None:
                return verb, cached
        # A negative timeoutSeconds is valid and ends the watch at once: the apiserver's call.
        shareable = query is not None and (query.timeout_seconds or 0) >= 0
        if verb == "watch" and hub is None and self.hub is not None:
            self.metrics.passthrough_watches.labels("impersonation").inc()
        if verb == "watch" and hub is not None and query is not None and shareable:
            hub_streams = self.metrics.in_flight_by("stream")
            hub_streams.inc()
            try:
                served = await hub.serve(request, api_path, query)
            finally:
                hub_streams.dec()
            if served is not None:
                return verb, served
        if (
            verb == "list"
            and self.list_batcher is not None
            and request.method == "GET"
            and query is not None
            and not query.resource_version
            and not query.continue_token
        ):
            with flow(self._flow_of(request)):
                batched = await self.list_batcher.serve(request)
            if batched is not None:
                return verb, batched
        gauge = self.metrics.in_flight_by("stream") if streaming else None
        if gauge is not None:
            gauge.inc()
        try:
            with flow(self._flow_of(request)):
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
