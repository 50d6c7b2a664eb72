"""The watch hub: identical client watches share one upstream watch; each client gets its stream.

``Hub.serve`` is what the API handler calls for every watch request. It returns None for a
watch it cannot serve faithfully (the handler passes it through unchanged), and otherwise
answers the client from the key's shared state: synthetic ADDEDs, a replay from the history
ring, or an in-stream 410 Expired — then live events, all from one upstream watch per key.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from watchproxy.config import HubConfig, UpstreamConfig
from watchproxy.errors import TooManyRequests, UpstreamTimeout, UpstreamUnavailable
from watchproxy.hub.sharedwatch import SharedWatch, UpstreamRefused
from watchproxy.hub.subscriber import Subscriber, SubscriberOptions
from watchproxy.hub.watchcache import StartPlan
from watchproxy.hub.watchkey import Unservable, WatchKey, identity_of, watch_key
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.headers import forwarded_credential
from watchproxy.kube.representation import Representation, encode_json
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import BackoffPolicy
from watchproxy.upstream.client import Upstream
from watchproxy.upstream.connectivity import Connectivity

log = logging.getLogger("watchproxy.hub")

# How long a new key's first client waits for the initial upstream list.
INITIAL_SYNC_TIMEOUT = 30.0
# How long a client's too-new resourceVersion may wait for the cache (as the apiserver: 3 s).
TOO_LARGE_RV_WAIT = 3.0


class Hub:
    """Owns every SharedWatch; each is started on first use and stopped after its linger."""

    def __init__(
        self,
        *,
        upstream: Upstream,
        connectivity: Connectivity,
        hub_config: HubConfig,
        upstream_config: UpstreamConfig,
        backoff_policy: BackoffPolicy,
        metrics: Metrics,
        forward_identity: bool = False,
        max_watches: int = 1000,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self.connectivity = connectivity
        self.config = hub_config
        self.upstream_config = upstream_config
        self.backoff_policy = backoff_policy
        self.metrics = metrics
        self.forward_identity = forward_identity
        self.max_watches = max_watches
        self.rng = rng or random.Random()
        self.clock = clock
        self.watches: dict[WatchKey, SharedWatch] = {}
        self._retired: set[asyncio.Task[None]] = set()
        self._clients: set[asyncio.Task[Any]] = set()
        self.active_clients = 0
        metrics.shared_watches.set_function(lambda: len(self.watches))
        metrics.history_events.set_function(
            lambda: sum(w.cache.history_len() for w in self.watches.values())
        )

    def _shared(
        self, key: WatchKey, representation: Representation, auth: str | None
    ) -> SharedWatch:
        shared = self.watches.get(key)
        if shared is not None and not shared.closed:
            return shared
        shared = SharedWatch(
            key,
            representation,
            upstream=self.upstream,
            connectivity=self.connectivity,
            hub_config=self.config,
            upstream_config=self.upstream_config,
            backoff_policy=self.backoff_policy,
            metrics=self.metrics,
            rng=self.rng,
            forwarded_auth=auth,
            clock=self.clock,
        )
        shared.on_idle = self._retire
        self.watches[key] = shared
        shared.start()
        log.info("new shared watch %s %s", key.collection_path, key.describe())
        return shared

    def _retire(self, shared: SharedWatch) -> None:
        """Called from the shared watch's own tasks: close it from a task the hub owns."""
        if self.watches.get(shared.key) is shared:
            del self.watches[shared.key]
        task = asyncio.create_task(shared.close(), name="watchproxy-retire")
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    def _deadline(self, query: WatchQuery) -> float:
        if query.timeout_seconds:
            return float(query.timeout_seconds)
        # timeoutSeconds=0 means "the server's default", as in the apiserver.
        # Randomized so that clients do not all come back at the same moment.
        return self.rng.uniform(
            self.config.client_watch_min_seconds, self.config.client_watch_max_seconds
        )

    def _key(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> tuple[str | None, tuple[WatchKey, Representation] | Unservable]:
        """The credential the request runs as (forward mode only) and its watch key."""
        auth = forwarded_credential(request.headers, self.forward_identity)
        found = watch_key(
            api_path,
            query,
            accept=request.headers.get("Accept"),
            identity=identity_of(auth, self.forward_identity),
        )
        return auth, found

    async def serve(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.StreamResponse | None:
        auth, found = self._key(request, api_path, query)
        if isinstance(found, Unservable):
            self.metrics.passthrough_watches.labels(found.reason).inc()
            return None
        key, representation = found
        if self.active_clients >= self.max_watches:
            raise TooManyRequests(
                f"watchproxy serves at most {self.max_watches} watches", retry_after=5
            )
        shared = self.watches.get(key)
        if (shared is None or not shared.cache.synced) and self.connectivity.down:
            raise UpstreamUnavailable(
                "the apiserver is unreachable and this watch has no shared state yet",
                retry_after=self.connectivity.retry_after(),
            )
        shared = self._shared(key, representation, auth)
        shared.attach()
        self.active_clients += 1
        gauge = self.metrics.subscribers.labels(key.resource_label)
        gauge.inc()
        try:
            try:
                await shared.wait_synced(INITIAL_SYNC_TIMEOUT)
            except UpstreamRefused as refused:
                answer = web.Response(status=refused.status, body=refused.body)
                answer.headers["Content-Type"] = refused.content_type or "application/json"
                return answer
            plan = await self._plan(shared, query)
            response = web.StreamResponse(status=200)
            response.content_type = "application/json"
            response.enable_chunked_encoding()
            response.headers["Cache-Control"] = "no-cache, private"
            try:
                await response.prepare(request)
                if plan.expired:
                    self.metrics.expired.inc()
                    self.metrics.events_sent.labels(key.resource_label).inc()
                    await response.write(shared.cache.expired_line(query.resource_version or ""))
                    await response.write_eof()
                    return response
            except ConnectionError:
                return response  # the client left while its watch was being set up
            if query.resource_version not in (None, "", "0") and not query.send_initial_events:
                self.metrics.replays.inc()
            subscriber = Subscriber(
                shared,
                response,
                request,
                SubscriberOptions(
                    deadline_seconds=self._deadline(query),
                    bookmarks=bool(query.allow_watch_bookmarks),
                    bookmark_interval=self.config.bookmark_interval_seconds,
                    max_lag=self.config.max_subscriber_lag,
                    write_timeout=self.config.slow_subscriber_timeout_seconds,
                ),
                self.metrics,
                clock=self.clock,
            )
            await subscriber.run(plan)
            return response
        finally:
            gauge.dec()
            self.active_clients -= 1
            shared.detach()

    def serve_list(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.Response | None:
        """A LIST with resourceVersion=0 ("any state") from a synced shared watch, if one fits.

        Like the apiserver's watch cache, this answers without an upstream request — and keeps
        answering while the apiserver is unreachable. ``limit`` is ignored, as the cache does.
        """
        if query.resource_version != "0" or query.continue_token:
            return None
        _auth, found = self._key(request, api_path, query)
        if isinstance(found, Unservable):
            return None
        shared = self.watches.get(found[0])
        if shared is None or shared.closed or not shared.cache.synced:
            return None
        rv = shared.cache.resource_version_str or "0"
        body = shared.representation.list_body(shared.cache.objects_snapshot(), rv)
        self.metrics.lists_from_cache.inc()
        return web.Response(body=encode_json(body), content_type="application/json")

    async def _plan(self, shared: SharedWatch, query: WatchQuery) -> StartPlan:
        """The client's start point; for an RV newer than the cache, wait for it (bounded)."""
        initial = bool(query.send_initial_events)
        plan = shared.cache.plan(query.resource_version, send_initial_events=initial)
        deadline = self.clock() + TOO_LARGE_RV_WAIT
        while plan.wait_rv is not None:
            current = shared.cache.resource_version
            if current is not None and current >= plan.wait_rv:
                plan = shared.cache.plan(query.resource_version, send_initial_events=initial)
                continue
            remaining = deadline - self.clock()
            if remaining <= 0 or shared.closed:
                raise UpstreamTimeout(
                    f"Too large resource version: {query.resource_version}, "
                    f"current: {shared.cache.resource_version_str}",
                    retry_after=1,
                )
            await shared.wait_change(remaining)
        return plan

    async def close(self) -> None:
        """End every shared watch; their subscribers finish their streams cleanly."""
        watches = list(self.watches.values())
        self.watches.clear()
        await asyncio.gather(*(w.close() for w in watches), return_exceptions=True)
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)

    def debug(self) -> list[dict[str, Any]]:
        return [w.debug() for w in self.watches.values()]
