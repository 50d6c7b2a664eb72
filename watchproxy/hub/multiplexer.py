"""The watch hub: identical client watches share one upstream watch; each client gets its stream.

``Hub.serve`` is what the API handler calls (through ``watchproxy.server.watchsink``) for every
watch request. It returns None for a watch it cannot serve faithfully (the handler passes it
through unchanged), a :class:`Refusal` when the apiserver refused the key's list, and otherwise
streams the client's answer from the key's shared state: synthetic ADDEDs or a replay from the
history ring, then live events, all from one upstream watch per key.

A resourceVersion older than the key's history is not refused here: the apiserver may still
have that history, and a made-up 410 would send the client to relist for nothing. Before the
key's first list, the shared watch starts its history at the oldest RV its clients ask for;
after it, such a watch is passed through, and the apiserver answers it (its events, or its own
410). The hub writes a 410 only for an RV that a relist made ambiguous (see ``watchcache``).

A key the hub will not share (:class:`~watchproxy.hub.outcomes.NotShared`: the cache budget,
an encoding the kind lacks) is a named reason, never an HTTP status: its clients pass through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from watchproxy.config import HubConfig
from watchproxy.errors import (
    ProxyError,
    TooManyRequests,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from watchproxy.hub.cachetypes import StartPlan
from watchproxy.hub.firstsync import FirstSync, Relay
from watchproxy.hub.freshwatch import not_current
from watchproxy.hub.historybudget import HistoryBudget
from watchproxy.hub.outcomes import NotShared
from watchproxy.hub.ports import UpstreamHealth, WatchSink, WatchSource, WatchStarter
from watchproxy.hub.sharedwatch import KeyNotShared, SharedWatch, UpstreamRefused
from watchproxy.hub.subscriber import Subscriber, SubscriberOptions
from watchproxy.hub.watchkey import Unservable, WatchKey, identity_of, watch_key
from watchproxy.hub.watchlists import WatchListSupport
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.headers import Headers, forwarded_credential
from watchproxy.kube.representation import Representation
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import BackoffPolicy

# A key that did not fit in hub.cache_max_bytes is passed through this long before a new
# client's watch tries to list it again (each try costs the apiserver part of a LIST).
OVER_BUDGET_RETRY_SECONDS = 60.0

log = logging.getLogger("watchproxy.hub")

# How long a new key's first client waits for the initial upstream list.
INITIAL_SYNC_TIMEOUT = 30.0
# How long a client's too-new resourceVersion may wait for the cache (as the apiserver: 3 s).
TOO_LARGE_RV_WAIT = 3.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """The apiserver refused the key's list: the client gets that same answer."""

    status: int
    body: bytes
    content_type: str


STREAMED = "streamed"  # Hub.serve wrote the client's whole watch stream
NOT_RELAYED = "not relayed"  # a cold key's first client is served the ordinary way
INITIAL_EVENTS_END_MARK = b'"k8s.io/initial-events-end":"true"'


class Hub:
    """Owns every SharedWatch; each is started on first use and stopped after its linger."""

    def __init__(
        self,
        *,
        source: WatchSource,
        health: UpstreamHealth,
        hub_config: HubConfig,
        backoff_policy: BackoffPolicy,
        metrics: Metrics,
        forward_identity: bool = False,
        max_watches: int = 1000,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.health = health
        self.config = hub_config
        self.backoff_policy = backoff_policy
        self.metrics = metrics
        self.forward_identity = forward_identity
        self.max_watches = max_watches
        self.rng = rng or random.Random()
        self.clock = clock
        self.watches: dict[WatchKey, SharedWatch] = {}
        # (resource, representation) pairs the apiserver cannot encode (NotShared.UNENCODABLE):
        # passed through from then on, without another LIST each time.
        self.unencodable: set[tuple[str, str]] = set()
        self._retired: set[asyncio.Task[None]] = set()
        self.active_clients = 0
        metrics.shared_watches.set_function(lambda: len(self.watches))
        metrics.history_events.set_function(
            lambda: sum(w.cache.history_len() for w in self.watches.values())
        )
        self.history_budget = HistoryBudget(hub_config.history_max_bytes)
        metrics.history_budget_bytes.set(hub_config.history_max_bytes)
        metrics.cache_bytes.set_function(self.cache_bytes)
        metrics.cache_budget_bytes.set(hub_config.cache_max_bytes)
        self._over_budget_logged: set[str] = set()
        # Resources whose watchproxy_history_bytes series exists (it stays, at 0 when idle).
        self._history_resources: set[str] = set()
        # Keys that did not fit, until when their watches pass through without another try.
        self._over_budget: dict[WatchKey, float] = {}
        # Bytes listed so far by keys whose first list is under way (see _cache_admits).
        self._listing: dict[WatchKey, int] = {}
        self.watch_lists = WatchListSupport(source, clock)

    def _shared(
        self,
        key: WatchKey,
        representation: Representation,
        auth: str | None,
        first_sync: FirstSync | None = None,
    ) -> SharedWatch:
        shared = self.watches.get(key)
        if shared is not None and not shared.closed:
            return shared
        shared = SharedWatch(
            key,
            representation,
            source=self.source,
            health=self.health,
            hub_config=self.config,
            backoff_policy=self.backoff_policy,
            metrics=self.metrics,
            rng=self.rng,
            forwarded_auth=auth,
            clock=self.clock,
            budget=self.history_budget,
            cache_admits=lambda listing_bytes: self._cache_admits(key, listing_bytes),
            first_sync=first_sync,
            watch_lists_refused=lambda: self.watch_lists.refused(key),
        )
        resource = key.resource_label
        if resource not in self._history_resources:
            self._history_resources.add(resource)
            self.metrics.history_bytes.labels(resource).set_function(
                lambda: self.history_bytes_of(resource)
            )
        shared.on_idle = self._retire
        self.watches[key] = shared
        shared.start()
        log.info("new shared watch %s %s", key.collection_path, key.describe())
        return shared

    def history_bytes_of(self, resource: str) -> int:
        """Bytes of history the shared watches of ``resource`` hold together."""
        return sum(
            w.cache.history_bytes for w in self.watches.values() if w.key.resource_label == resource
        )

    def cache_bytes(self) -> int:
        """Bytes of cached objects across every shared watch."""
        return sum(w.cache.state_bytes for w in self.watches.values())

    def _cache_admits(self, key: WatchKey, listing_bytes: int) -> bool:
        """Whether ``key``'s first list, ``listing_bytes`` so far, fits ``hub.cache_max_bytes``
        beside what is cached and the first lists of other keys under way: each of two lists
        that run at once would fit alone, but not both."""
        self._listing[key] = listing_bytes
        limit = self.config.cache_max_bytes
        if not limit:
            return True
        others = 0
        for other, size in list(self._listing.items()):
            shared = self.watches.get(other)
            if shared is None or shared.closed or shared.cache.synced:
                if other != key:
                    del self._listing[other]  # listed (now counted as cached), or gone
            elif other != key:
                others += size
        return self.cache_bytes() + others + listing_bytes <= limit

    def _retire(self, shared: SharedWatch) -> None:
        """Called from the shared watch's own tasks: close it from a task the hub owns."""
        if self.watches.get(shared.key) is shared:
            del self.watches[shared.key]
        task = asyncio.create_task(self._close_one(shared), name="watchproxy-retire")
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
        self, headers: Headers, api_path: ApiPath, query: WatchQuery
    ) -> tuple[str | None, tuple[WatchKey, Representation] | Unservable]:
        """The credential the request runs as (forward mode only) and its watch key."""
        auth = forwarded_credential(headers, self.forward_identity)
        found = watch_key(
            api_path,
            query,
            accept=headers.get("Accept"),
            identity=identity_of(auth, self.forward_identity),
        )
        return auth, found

    async def serve(
        self, api_path: ApiPath, query: WatchQuery, headers: Headers, starter: WatchStarter
    ) -> Refusal | str | None:
        """Serve one client watch: None = pass it through, a Refusal, or STREAMED."""
        auth, found = self._key(headers, api_path, query)
        if isinstance(found, Unservable):
            self.metrics.passthrough_watches.labels(found.reason).inc()
            return None
        key, representation = found
        if (key.resource_label, representation.identity) in self.unencodable:
            self.metrics.passthrough_watches.labels("representation").inc()
            return None
        asks_watch_list = query.send_initial_events is not None or query.watch_list
        if asks_watch_list and not await self.watch_lists.served(key, auth):
            self.metrics.passthrough_watches.labels("watch-list-refused").inc()
            return None  # the apiserver refuses it: the client falls back as it would
        until = self._over_budget.get(key)
        if until is not None:
            if until > self.clock():
                self.metrics.passthrough_watches.labels("cache-budget").inc()
                return None
            del self._over_budget[key]  # its 60 s are over: this client tries again
        if self.active_clients >= self.max_watches:
            raise TooManyRequests(
                f"watchproxy serves at most {self.max_watches} watches", retry_after=5
            )
        shared = self.watches.get(key)
        if (shared is None or not shared.cache.synced) and self.health.down:
            # No Retry-After, as for every request refused while the upstream is known down
            # (upstream/client.py): client-go retries a 503 that has one up to 10 times.
            raise UpstreamUnavailable(
                "the apiserver is unreachable and this watch has no shared state yet; "
                f"watchproxy checks again in {self.health.retry_after():.0f}s"
            )
        relay: FirstSync | None = None
        if (shared is None or shared.closed) and self._relayable(key, representation, query):
            relay = FirstSync(
                initial_events_end=query.watch_list, bookmarks=bool(query.allow_watch_bookmarks)
            )
        # A shared watch whose first LIST is yet to be sent will list a state that is current.
        existed = shared is not None and not shared.closed and shared.upstream_attempts > 0
        if shared is not None and not shared.closed:
            relay = None  # only the client that starts the key is relayed its initial events
        shared = self._shared(key, representation, auth, relay)
        resuming = query.resource_version not in (None, "", "0") and not query.send_initial_events
        if resuming and query.resource_version is not None:
            shared.want(query.resource_version)
        shared.attach()
        self.active_clients += 1
        gauge = self.metrics.subscribers.labels(key.resource_label)
        gauge.inc()
        sink: WatchSink | None = None
        try:
            if relay is not None:
                relayed = await self._relay(
                    relay, starter, representation, key, self._deadline(query)
                )
                if relayed == STREAMED:
                    return STREAMED  # the client left, or the relay broke: its stream ended
                if not isinstance(relayed, str):
                    sink = relayed  # else nothing was relayed: served the ordinary way
            try:
                await shared.wait_synced(INITIAL_SYNC_TIMEOUT)
            except KeyNotShared as unshared:
                self._not_shared(key, representation, unshared.reason)
                self.metrics.passthrough_watches.labels(unshared.reason.value).inc()
                return await _end(sink) if sink is not None else None
            except UpstreamRefused as refused:
                if sink is not None:
                    return await _end(sink)
                if refused.of_list and refused.status == 403:
                    # RBAC refused the LIST; this client asked to WATCH, and the apiserver's
                    # answer to that differs (its message names the verb): let it answer.
                    # A 401 or 404 reads the same for both verbs and is served from the key.
                    self.metrics.passthrough_watches.labels("list-refused").inc()
                    return None
                return Refusal(refused.status, refused.body, refused.content_type)
            except UpstreamUnavailable:
                if sink is not None:
                    return await _end(sink)
                raise
            if sink is not None and relay is not None:
                # It has the state at the watch-list's end: it goes on from there.
                plan = shared.cache.plan(relay.end_rv)
                if plan.outside_window or plan.expired:
                    return await _end(sink)
            else:
                fresh = self.config.consistent_list_wait_seconds
                if existed and await not_current(shared, query.resource_version, fresh, self.clock):
                    self.metrics.passthrough_watches.labels("not-current").inc()
                    return None  # the apiserver answers it consistently
                plan = await self._plan(shared, query)
                if plan.outside_window:
                    # Older than this key's history: only the apiserver knows.
                    self.metrics.passthrough_watches.labels("outside-window").inc()
                    return None
                try:
                    sink = await starter.start(representation.stream_content_type)
                    if plan.expired:
                        self.metrics.expired.inc()
                        self.metrics.events_sent.labels(key.resource_label).inc()
                        await sink.write(shared.cache.expired_line(query.resource_version or ""))
                        await sink.write_eof()
                        return STREAMED
                except ConnectionError:
                    return STREAMED  # the client left while its watch was being set up
                if resuming:
                    self.metrics.replays.inc()
            subscriber = Subscriber(
                shared,
                sink,
                SubscriberOptions(
                    deadline_seconds=self._deadline(query),
                    bookmarks=bool(query.allow_watch_bookmarks),
                    bookmark_interval=self.config.bookmark_interval_seconds,
                    max_lag=self.config.max_subscriber_lag,
                    write_timeout=self.config.slow_subscriber_timeout_seconds,
                    started=relay is not None and relay.state is Relay.ENDED,
                ),
                self.metrics,
                clock=self.clock,
            )
            await subscriber.run(plan)
            return STREAMED
        finally:
            gauge.dec()
            self.active_clients -= 1
            shared.detach()

    def _relayable(self, key: WatchKey, representation: Representation, query: WatchQuery) -> bool:
        """Whether a cold key's first client may be relayed its initial events (firstsync.py):
        plain JSON, a watch from now, and an apiserver not known to refuse watch-lists (the
        first list tries one, and a 422 falls back to pages and is remembered)."""
        if representation.identity != "json" or query.send_initial_events is False:
            return False
        if query.resource_version not in (None, "", "0"):
            return False
        return self.watch_lists.known(key) is not False

    async def _relay(
        self,
        relay: FirstSync,
        starter: WatchStarter,
        representation: Representation,
        key: WatchKey,
        deadline: float,
    ) -> WatchSink | str:
        """Write the relayed initial events to the client: its sink once they are all written;
        STREAMED when its stream has ended (the client left, or the watch-list broke after
        lines were relayed: it re-watches, as after the apiserver's own cut); NOT_RELAYED when
        the hub lists the ordinary way."""
        try:
            return await self._relay_lines(relay, starter, representation, key, deadline)
        except BaseException:
            # Cancelled, or a bug: nothing more is queued for it, and a stream handed to it
            # is closed here (a ConnectionError, the client leaving, ends the same way).
            stream = relay.leave()
            if stream is not None:
                await stream.close()
            raise

    async def _relay_lines(
        self,
        relay: FirstSync,
        starter: WatchStarter,
        representation: Representation,
        key: WatchKey,
        deadline: float,
    ) -> WatchSink | str:
        try:
            opened = await asyncio.wait_for(relay.opened(), INITIAL_SYNC_TIMEOUT)
        except TimeoutError:
            relay.abandon()
            opened = relay.state is not Relay.ABANDONED
        if not opened:
            return NOT_RELAYED
        try:
            sink = await starter.start(representation.stream_content_type)
            while True:
                lines, size = await relay.take()  # one event each: a WebSocket message each
                if not lines:
                    break
                if not sink.send_lines(lines, size):
                    await sink.drain()
            relay.all_written()
            if relay.stream is not None:
                self._not_shared(key, representation, NotShared.CACHE_FULL)
                self.metrics.passthrough_watches.labels(NotShared.CACHE_FULL.value).inc()
                await _pass_on(relay, sink, deadline)
                return STREAMED
        except ConnectionError:
            stream = relay.leave()
            if stream is not None:
                await stream.close()
            return STREAMED
        if relay.state is not Relay.ENDED:
            return await _end(sink)
        return sink

    def _not_shared(self, key: WatchKey, representation: Representation, why: NotShared) -> None:
        """Remember a key the hub cannot share, so that its next watches pass through at once."""
        if why is NotShared.UNENCODABLE:
            # No such encoding for this kind (protobuf for a custom resource): the client's
            # own Accept may allow another, which the apiserver picks.
            self.unencodable.add((key.resource_label, representation.identity))
            return
        # hub.cache_max_bytes: this key would not fit; its clients pass through until a later
        # client finds room (keys come and go).
        if key.resource_label not in self._over_budget_logged:
            self._over_budget_logged.add(key.resource_label)
            log.warning(
                "not sharing watches of %s: the cache is full "
                "(hub.cache_max_bytes=%d); they pass through to the apiserver",
                key.collection_path,
                self.config.cache_max_bytes,
            )
        self._over_budget[key] = self.clock() + OVER_BUDGET_RETRY_SECONDS

    def key_of(
        self, api_path: ApiPath, query: WatchQuery, headers: Headers
    ) -> tuple[WatchKey, Representation] | Unservable:
        """The key a watch of ``api_path`` would share (``watchproxy.lists`` finds the shared
        watch that covers a LIST by it)."""
        return self._key(headers, api_path, query)[1]

    async def _plan(self, shared: SharedWatch, query: WatchQuery) -> StartPlan:
        """The client's start point; for an RV newer than the cache, wait for it (bounded)."""
        initial = query.watch_list  # ends its initial events with the annotated bookmark
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
        # Concurrently, and every one to the end: _close_one reports a failure with its key
        # instead of raising, so one broken watch cannot leave the others' tasks unawaited.
        await asyncio.gather(*(self._close_one(w) for w in watches), *self._retired)

    @staticmethod
    async def _close_one(shared: SharedWatch) -> None:
        """Close one shared watch; a failure is a bug, logged once with the key it hit."""
        try:
            await shared.close()
        except Exception:
            log.exception(
                "closing the shared watch %s %s failed",
                shared.key.collection_path,
                shared.key.describe(),
            )

    def debug(self) -> list[dict[str, Any]]:
        return [w.debug() for w in self.watches.values()]


async def _pass_on(relay: FirstSync, sink: WatchSink, deadline: float) -> None:
    """The rest of a watch-list handed over to its first client (its key is not shared): its
    lines as they come, the bookmarks the client asked for only, until the client's deadline
    or the stream's end. Its own, to close."""
    stream = relay.stream
    assert stream is not None
    relay.stream = None
    lines = stream.lines()
    try:
        async with asyncio.timeout(deadline):
            async for line in lines:
                if line.startswith(b'{"type":"BOOKMARK"'):
                    end = INITIAL_EVENTS_END_MARK in line
                    if not relay.wants(line, end=end):
                        continue
                await sink.write(line)
    except (TimeoutError, ProxyError):
        pass  # the client's deadline, or the upstream stream broke: both end it cleanly
    finally:
        await lines.aclose()
        await stream.close()
    await _end(sink)


async def _end(sink: WatchSink) -> str:
    """End a stream that has started: the client re-watches, as after the apiserver's cut."""
    with contextlib.suppress(ConnectionError):
        await sink.write_eof()
    return STREAMED
