"""The API port's handler: what clients' KUBECONFIG points at. Routes each request to the hub,
a LIST service or through.

Each request is classified first, from values alone (``routes.classify``; a decision is
remembered per method, target and Host, see :class:`RouteMemo`); then the handlers of its route
kinds run in order, each small, until one answers. Every error is turned into a Kubernetes
``Status`` answer here, at the edge (``Response.send_error``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from watchproxy.errors import FaultyFraming, ProxyError, TooManyRequests
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.watchquery import QUICK_END_SECONDS, WatchQuery
from watchproxy.lists.answers import (
    PACED_BODY_BYTES,
    Answer,
    ReaderCut,
    StreamedAnswer,
    paced_chunks,
)
from watchproxy.lists.batch import BatchAnswer
from watchproxy.lists.ports import ListRequest
from watchproxy.metrics import Metrics
from watchproxy.policy.access import AccessPolicy
from watchproxy.policy.clientlimits import ErroredWatchLimiter
from watchproxy.policy.fairqueue import flow
from watchproxy.server.clientgone import CLIENT_CLOSED_REQUEST, EndsWithClient
from watchproxy.server.http import Request, faulty_framing
from watchproxy.server.passthrough import Forwarder
from watchproxy.server.protocol import Response
from watchproxy.server.routes import (
    Refusal,
    Route,
    RouteKind,
    Routing,
    classify,
    page_shape,
    with_continue,
)
from watchproxy.server.upgrade import UpgradeRelay

log = logging.getLogger("watchproxy.server")

# A client over its errored-watch budget is held this long at most, then told 429.
MAX_ERROR_HOLD_SECONDS = 5.0
# Distinct (refused upgrade, client) pairs remembered so that each is logged once.
MAX_REFUSALS_LOGGED = 1024
# Route decisions remembered, by (method, target, Host). A controller sends the same few
# targets over and over, and deciding one anew (decoding its query, parsing its path, checking
# the policy) was a tenth of the proxy's CPU per request. Bounded in entries and in the length
# of a target it keeps (a client making up targets costs it about a megabyte at most).
ROUTE_MEMO_SIZE = 1024
ROUTE_MEMO_TARGET_CHARS = 512

# An answer a LIST service gives: a whole one (a batch's, with the apiserver's head, or the
# hub's or a refusal's value), or one streamed: a batch's to its members, or the hub's.
Listed = Answer | BatchAnswer | StreamedAnswer
# An answer, or None to let the route's next kind answer.
Handler = Callable[[Request, Response, Route], Awaitable[bool]]


class WatchServer(Protocol):
    """The hub, as the server sees it: serve a watch (True), or decline it (False: pass it
    through)."""

    async def serve(
        self, request: Request, response: Response, api_path: ApiPath, query: WatchQuery
    ) -> bool: ...

    async def serve_websocket(
        self, request: Request, response: Response, api_path: ApiPath, query: WatchQuery
    ) -> bool:
        """The same for a watch asked for over WebSocket: False to relay the upgrade."""

    async def serve_list(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> Answer | StreamedAnswer | None: ...


class ConsistentListServer(Protocol):
    """Answers a LIST without a resourceVersion from the hub once its state is current, or
    returns None to let the route's next kind answer."""

    async def serve(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> Answer | StreamedAnswer | None: ...


class BatchedListServer(Protocol):
    """Answers identical LISTs in flight together with one upstream LIST, or returns None
    (an answer too big to share) to let the route's next kind answer."""

    async def answer(self, request: ListRequest) -> BatchAnswer | StreamedAnswer | None: ...


class Declines:
    """Stands in for a service that is not configured: it serves nothing. The router never
    routes to one (see :class:`~watchproxy.server.routes.Routing`); it keeps the handlers'
    collaborators typed as always present."""

    async def serve(self, request: object, *args: object) -> bool:
        return False

    async def serve_websocket(self, request: object, *args: object) -> bool:
        return False

    async def serve_list(self, request: ListRequest, *args: object) -> None:
        return None

    async def answer(self, request: ListRequest) -> None:
        return None


class _ListDeclines:
    async def serve(self, request: ListRequest, *args: object) -> None:
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
        # The client's bytes: a parsed value may hold surrogate escapes (obs-text).
        raw = auth.encode("utf-8", "surrogateescape")
        credential = hashlib.sha256(raw).hexdigest()[:16] if auth else ""
    return remote, headers.get("User-Agent", ""), credential


def no_client_limit(remote: str) -> float:
    return 0.0


_MemoKey = tuple[str, str, str | None]  # (method, target or page shape, Host)


class RouteMemo:
    """:func:`~watchproxy.server.routes.classify`'s decisions, remembered where they depend on
    nothing but the method, the target and the Host: not for a request that impersonates
    (its verdict depends on every header name) or asks to switch protocols, nor while the
    proxy drains. Every page of one paged LIST takes its first page's route with its own
    token (``routes.page_shape``)."""

    def __init__(self, routing: Routing) -> None:
        self.routing = routing
        self._routes: dict[_MemoKey, Route] = {}
        # Apart from the targets: a shape reads like the target of a first page that sends an
        # empty continue.
        self._pages: dict[_MemoKey, Route] = {}

    def route(self, request: Request, *, draining: bool) -> Route:
        target = request.target
        if (
            draining
            or request.impersonating
            or request.upgrade
            or len(target) > ROUTE_MEMO_TARGET_CHARS
        ):
            return self._classify(request, target, draining)
        key = (request.method, target, request.headers.get("Host"))
        route = self._routes.get(key)
        if route is not None:
            return route
        page = page_shape(target)
        if page is not None:
            key = (request.method, page[0], key[2])
            route = self._pages.get(key)
            if route is not None:
                return with_continue(route, page[1])
            return self._remember(self._pages, key, self._classify(request, target, False))
        return self._remember(self._routes, key, self._classify(request, target, False))

    def _classify(self, request: Request, target: str, draining: bool) -> Route:
        return classify(
            request.method, target, request.query, request.headers, self.routing,
            draining=draining,
        )  # fmt: skip

    @staticmethod
    def _remember(memo: dict[_MemoKey, Route], key: _MemoKey, route: Route) -> Route:
        if len(memo) >= ROUTE_MEMO_SIZE:
            memo.clear()
        memo[key] = route
        return route


class ApiHandler:
    """The handler of every request on the API port (``server.protocol`` calls it)."""

    def __init__(
        self,
        *,
        forwarder: Forwarder,
        metrics: Metrics,
        policy: AccessPolicy,
        allowed_hosts: tuple[str, ...],
        relay: UpgradeRelay,
        watch_errors: ErroredWatchLimiter,
        hub: WatchServer | None = None,
        client_limit: Callable[[str], float] = no_client_limit,
        list_batcher: BatchedListServer | None = None,
        consistent_lists: ConsistentListServer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        self.routes = RouteMemo(self.routing)
        self.hub: WatchServer = hub or Declines()
        self.list_batcher: BatchedListServer = list_batcher or Declines()
        self.consistent_lists: ConsistentListServer = consistent_lists or _ListDeclines()
        self._clock = clock
        self._streams = metrics.in_flight_by("stream")
        # Every request in flight, read by its gauge at scrape time (no lock per request).
        self.in_flight = 0
        self.served = 0  # requests answered (or left by their clients)
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
        # its work loses nothing. Every answer then closes its connection (the connection
        # guard's ``draining``), and the client reconnects to the next instance.
        self.draining = False
        # (what was refused, from whom) already logged: an upgrade refused is logged once per
        # kind and client, not per request (fabric8 retries its watches for ever).
        self._refusals_logged: set[tuple[str, str, str, str]] = set()

    async def __call__(self, request: Request, response: Response) -> None:
        started = self._clock()
        self.in_flight += 1
        route = self.routes.route(request, draining=self.draining)
        try:
            # Whatever the request waits on upstream ends when its client's connection does.
            with EndsWithClient(response.lost, response.task) as scope:
                await self._serve(request, response, route)
        except ProxyError as error:
            if response.status:
                response.abort()  # an answer begun cannot become a Status
            else:
                response.send_error(error)
        finally:
            self.in_flight -= 1
            self.served += 1
        finished = self._clock()
        status = response.status
        if scope.client_left:
            # Nobody reads this answer: it is for the metrics (the status the client saw, if
            # any). Leaving is the client's choice, not a watch that failed.
            status = status or CLIENT_CLOSED_REQUEST
        elif route.verb == "watch":
            self._count_errored_watch(request, status, finished - started)
        stream = route.streaming or status == 101
        self.metrics.request_done(route.verb, status, finished - started, stream=stream)

    async def _serve(self, request: Request, response: Response, route: Route) -> None:
        if (
            request.version != (1, 1)
            or request.hosts != 1
            or request.chunked
            or request.method == "CONNECT"
        ):  # http.may_be_faulty, written out: once per request
            faulty = faulty_framing(request.method, request.version, request.headers)
            if faulty is not None:
                self.metrics.rejected.labels("malformed").inc()
                raise FaultyFraming(faulty)
        if route.refusal is not None:
            self._refuse(request, response, route, route.refusal)
            return
        verb = route.verb
        if verb == "watch" or verb == "list":
            self.check_client_limit(request.remote, verb)
            if verb == "watch" and route.query is not None:
                await self._hold_errored_client(request, route.query)
        handlers = self._handlers
        for kind in route.kinds:
            if await handlers[kind](request, response, route):
                return
        raise AssertionError(f"no handler answered {route.kinds}")  # the last never declines

    def _refuse(self, request: Request, response: Response, route: Route, why: Refusal) -> None:
        assert route.error is not None
        if why.counted:
            self.metrics.rejected.labels(why.value).inc()
        if why is Refusal.HOST:
            log.warning("refused Host %r from %s", request.headers.get("Host"), request.remote)
        elif why is Refusal.PATH:
            log.warning("refused non-canonical path %r from %s", request.path[:200], request.remote)
        elif why is Refusal.UPGRADE_NOT_RELAYED:
            self._log_refused_upgrade(request, route)
        elif why.counted:
            log.info(
                "refused (%s) %s %s from %s",
                why.value,
                request.method,
                request.path[:200],
                request.remote,
            )
        response.send_error(route.error)

    def _log_refused_upgrade(self, request: Request, route: Route) -> None:
        upgrade = request.headers.get("Upgrade", "")[:40]
        client = (request.remote, request.headers.get("User-Agent", "")[:200])
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
            request.path[:200],
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

    def _count_errored_watch(self, request: Request, status: int, took: float) -> None:
        noted = request.errored_watch
        if noted is None:
            return
        key, short_timeout = noted
        if status >= 400 or (took < QUICK_END_SECONDS and not short_timeout):
            self.watch_errors.record_error(key, self._clock())

    async def _hold_errored_client(self, request: Request, query: WatchQuery) -> None:
        """A client whose watches keep ending in errors waits before the next one is served,
        so that a library re-watching in a tight loop costs little (and nothing upstream)."""
        raw_path = request.path
        key = (request.remote, request.headers.get("User-Agent", ""), raw_path)
        timeout = query.timeout_seconds
        request.errored_watch = (key, timeout is not None and 0 < timeout <= QUICK_END_SECONDS)
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

    def _flow_of(self, request: Request) -> tuple[str, str, str]:
        key = request.flow
        if key is None:
            key = request.flow = flow_key(
                request.remote, request.headers, self.forwarder.forward_identity
            )
        return key

    # The handlers, one per route kind: True when it answered, False to let the route's next
    # kind answer.

    async def _upgrade(self, request: Request, response: Response, route: Route) -> bool:
        self._streams.inc()
        try:
            with flow(self._flow_of(request)):
                await self.relay.relay(request, response)
        finally:
            self._streams.dec()
        return True

    async def _hub_watch(self, request: Request, response: Response, route: Route) -> bool:
        assert route.api_path is not None and route.query is not None
        self._streams.inc()
        try:
            return await self.hub.serve(request, response, route.api_path, route.query)
        finally:
            self._streams.dec()

    async def _hub_websocket_watch(
        self, request: Request, response: Response, route: Route
    ) -> bool:
        assert route.api_path is not None and route.query is not None
        self._streams.inc()
        try:
            return await self.hub.serve_websocket(request, response, route.api_path, route.query)
        finally:
            self._streams.dec()

    async def _cached_list(self, request: Request, response: Response, route: Route) -> bool:
        assert route.api_path is not None and route.query is not None
        listed = await self.hub.serve_list(request, route.api_path, route.query)
        return await self._write_listed(listed, response)

    async def _consistent_list(self, request: Request, response: Response, route: Route) -> bool:
        assert route.api_path is not None and route.query is not None
        # Its probe is charged like a batched LIST: to the client that starts it.
        with flow(self._flow_of(request)):
            listed = await self.consistent_lists.serve(request, route.api_path, route.query)
        return await self._write_listed(listed, response)

    async def _batched_list(self, request: Request, response: Response, route: Route) -> bool:
        with flow(self._flow_of(request)):
            listed = await self.list_batcher.answer(request)
        return await self._write_listed(listed, response)

    @staticmethod
    async def _write_listed(listed: Listed | None, response: Response) -> bool:
        """Write a LIST service's answer: a streamed batch answer at the client's pace
        (chunked), a large whole one from the shared bytes in pieces, each once the client took
        the last (one write would hand the transport a copy per slow client), any other in one
        write."""
        if listed is None:
            return False
        if isinstance(listed, StreamedAnswer):
            try:
                await response.send_stream(
                    listed.status, listed.reason, listed.headers, listed.chunks()
                )
            except ReaderCut as cut:  # the connection is closed: it cannot look whole
                log.info("a streamed batch LIST was cut: %s", cut)
            return True
        if (
            isinstance(listed, BatchAnswer)
            and listed.raw_head is not None
            and response.passes_raw
            and len(listed.body) <= PACED_BODY_BYTES
        ):
            # Nothing in the apiserver's head is hop-by-hop: it goes on as it came.
            response.send_raw(listed.status, listed.raw_head + listed.body)
            return True
        answer = listed if isinstance(listed, Answer) else listed.whole()
        if len(answer.body) > PACED_BODY_BYTES:
            await response.send_stream(
                answer.status,
                answer.reason,
                answer.headers,
                paced_chunks(answer.body),
                length=len(answer.body),
            )
            return True
        response.send_answer(answer)
        return True

    async def _passthrough_stream(self, request: Request, response: Response, route: Route) -> bool:
        if route.unshared is not None:
            self.metrics.passthrough_watches.labels(route.unshared).inc()
        self._streams.inc()
        try:
            with flow(self._flow_of(request)):
                await self.forwarder.forward(request, response, verb=route.verb, streaming=True)
        finally:
            self._streams.dec()
        return True

    async def _passthrough(self, request: Request, response: Response, route: Route) -> bool:
        with flow(self._flow_of(request)):
            await self.forwarder.forward(request, response, verb=route.verb, streaming=False)
        return True
