"""One shared upstream watch: list, watch, resume, relist — and the state it feeds.

The upstream side is a small explicit state machine (``listing`` → ``watching`` →
``backing-off`` / ``waiting-for-upstream`` → ...), run by one task that the SharedWatch owns.
Events go into a :class:`~watchproxy.hub.watchcache.WatchCache`; subscribers read that cache's
history through cursors and are woken by :meth:`SharedWatch.changed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import urllib.parse
from collections.abc import Callable
from enum import Enum
from typing import Any

import aiohttp

from watchproxy.config import HubConfig, UpstreamConfig
from watchproxy.errors import ProxyError, UpstreamUnavailable
from watchproxy.hub.watchcache import ListRegressed, WatchCache
from watchproxy.hub.watchkey import WatchKey
from watchproxy.kube.representation import Representation
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import Backoff, BackoffPolicy
from watchproxy.upstream.client import LineTooLong, Upstream, read_lines
from watchproxy.upstream.connectivity import Connectivity

log = logging.getLogger("watchproxy.hub")

LIST_PAGE_SIZE = 500
# An upstream watch that ends cleanly this soon with nothing in it counts as a failure.
QUICK_END_SECONDS = 1.0


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class State(Enum):
    LISTING = "listing"
    WATCHING = "watching"
    BACKING_OFF = "backing-off"
    WAITING_FOR_UPSTREAM = "waiting-for-upstream"
    FAILED = "failed"
    CLOSED = "closed"


class UpstreamRefused(Exception):
    """The apiserver answered the initial list with an error: clients get that same answer."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


class Relist(Exception):
    """The upstream watch said 410 Expired: the cache must be brought up to date by a list."""


class SharedWatch:
    """The single upstream watch for one key, its cache, and the pulse that wakes subscribers."""

    def __init__(
        self,
        key: WatchKey,
        representation: Representation,
        *,
        upstream: Upstream,
        connectivity: Connectivity,
        hub_config: HubConfig,
        upstream_config: UpstreamConfig,
        backoff_policy: BackoffPolicy,
        metrics: Metrics,
        rng: random.Random,
        forwarded_auth: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = key
        self.representation = representation
        self.upstream = upstream
        self.connectivity = connectivity
        self.hub_config = hub_config
        self.upstream_config = upstream_config
        self.metrics = metrics
        self.rng = rng
        self.forwarded_auth = forwarded_auth
        self.clock = clock
        self.cache = WatchCache(
            representation,
            capacity=hub_config.history_size,
            max_age=hub_config.history_max_age_seconds,
            clock=clock,
        )
        self.backoff = Backoff(backoff_policy, rng, clock)
        self.state = State.LISTING
        self.subscribers = 0
        self.cursors: dict[int, int] = {}  # id(subscriber) -> its next seq, for lag and /debug
        self.failure: UpstreamRefused | None = None
        self.upstream_attempts = 0
        self.relists = 0
        self._waiters: set[asyncio.Future[None]] = set()
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.Task[None] | None = None
        self.on_idle: Callable[[SharedWatch], None] | None = None

    # ---- subscriber side -------------------------------------------------------------------

    async def wait_change(self, timeout: float) -> None:
        """Return at the next change (new events, a bookmark, the end) or after ``timeout``.

        A future per waiter and a timer handle, no task: this runs once per event batch for
        every subscriber, so it must stay cheap.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        timer = loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            _wake(waiter)

    async def wait_synced(self, timeout: float) -> None:
        """Wait for the first list; raise UpstreamRefused / UpstreamUnavailable if it fails."""
        if not self._synced.is_set():
            try:
                await asyncio.wait_for(self._synced.wait(), timeout)
            except TimeoutError:
                raise UpstreamUnavailable(
                    "the apiserver did not answer the initial list in time",
                    retry_after=self.connectivity.retry_after(),
                ) from None
        if self.failure is not None:
            raise self.failure

    @property
    def closed(self) -> bool:
        return self.state in (State.CLOSED, State.FAILED)

    def attach(self) -> None:
        self.subscribers += 1
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def detach(self) -> None:
        self.subscribers -= 1
        if self.subscribers == 0 and not self.closed:
            self._linger = asyncio.create_task(self._linger_then_stop(), name="watchproxy-linger")

    async def _linger_then_stop(self) -> None:
        await asyncio.sleep(self.hub_config.linger_seconds)
        self._linger = None
        if self.subscribers == 0 and self.on_idle is not None:
            self.on_idle(self)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(
            self._run(), name=f"watchproxy-watch {self.key.collection_path}"
        )

    async def close(self) -> None:
        """Stop the upstream watch and wake every subscriber so that it ends its stream."""
        if self.state is not State.FAILED:
            self.state = State.CLOSED
        for task in (self._task, self._linger):
            if task is not None:
                task.cancel()
        for task in (self._task, self._linger):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._linger = None
        self._synced.set()
        self._notify()

    # ---- upstream side --------------------------------------------------------------------

    def _query(self, **extra: str) -> str:
        params: dict[str, str] = {}
        if self.key.label_selector:
            params["labelSelector"] = self.key.label_selector
        if self.key.field_selector:
            params["fieldSelector"] = self.key.field_selector
        if self.key.include_object:
            params["includeObject"] = self.key.include_object
        params.update(self.representation.query_params)
        params.update(extra)
        return urllib.parse.urlencode(params, quote_via=urllib.parse.quote, safe="")

    def _headers(self, verb: str) -> dict[str, str]:
        rep = self.representation
        accept = rep.list_accept_header if verb == "list" else rep.watch_accept_header
        return {"Accept": accept, "User-Agent": "watchproxy"}

    async def _run(self) -> None:
        try:
            while True:
                try:
                    if not self.cache.synced or self.state is State.LISTING:
                        self.state = State.LISTING
                        await self._list()
                    self.state = State.WATCHING
                    started = self.clock()
                    lines = await self._watch()
                    if lines == 0 and self.clock() - started < QUICK_END_SECONDS:
                        # An upstream that ends watches at once must not pull us into a loop.
                        await self._back_off("the upstream watch ended at once")
                    else:
                        self.backoff.success()
                except Relist:
                    self.relists += 1
                    self.metrics.relists.inc()
                    self.state = State.LISTING
                except UpstreamRefused as refused:
                    if not self.cache.synced:
                        self._fail(refused)
                        return
                    await self._back_off(f"upstream answered {refused.status}")
                except (UpstreamUnavailable, ProxyError) as error:
                    await self._back_off(error.message)
                except (aiohttp.ClientError, TimeoutError, LineTooLong, ValueError) as error:
                    await self._back_off(f"{type(error).__name__}: {error}")
                except Exception as error:
                    # Not a failure we know: keep the subscribers' streams and the state, log
                    # it with its traceback, and retry on the same backoff schedule.
                    log.exception("shared watch %s: unexpected error", self.key.collection_path)
                    await self._back_off(f"unexpected {type(error).__name__}")
        except asyncio.CancelledError:
            raise

    def _fail(self, refused: UpstreamRefused) -> None:
        self.failure = refused
        self.state = State.FAILED
        self._synced.set()
        self._notify()
        if self.on_idle is not None:
            self.on_idle(self)

    async def _back_off(self, why: str) -> None:
        if self.connectivity.down:
            # The apiserver is unreachable: the one connectivity prober does the retrying.
            self.state = State.WAITING_FOR_UPSTREAM
            log.info("shared watch %s waits for the upstream (%s)", self.key.collection_path, why)
            await self.connectivity.wait_up()
            # Spread the reconnects of many shared watches a little.
            await asyncio.sleep(self.rng.uniform(0, min(1.0, self.backoff.policy.initial)))
            return
        delay = self.backoff.failure()
        self.state = State.BACKING_OFF
        log.info("shared watch %s retries in %.2fs (%s)", self.key.collection_path, delay, why)
        self.metrics.backoff_delay.set(delay)
        await asyncio.sleep(delay)
        self.metrics.backoff_seconds.inc(delay)

    async def _open(self, path_qs: str, *, verb: str, streaming: bool) -> aiohttp.ClientResponse:
        self.upstream_attempts += 1
        self.metrics.watch_upstream_opens.inc()
        return await self.upstream.open(
            "GET",
            path_qs,
            headers=self._headers(verb),
            verb=verb,
            streaming=streaming,
            read_timeout=self.upstream_config.watch_read_timeout_seconds if streaming else None,
            wait=True,
            forwarded_auth=self.forwarded_auth,
        )

    async def _list(self) -> None:
        """A full paginated list; the cache diffs it against what subscribers already have."""
        items: list[dict[str, Any]] = []
        list_rv: str | None = None
        token = ""
        while True:
            extra = {"limit": str(LIST_PAGE_SIZE)}
            if token:
                extra["continue"] = token
            response = await self._open(
                f"{self.key.collection_path}?{self._query(**extra)}", verb="list", streaming=False
            )
            try:
                body = await response.read()
                if response.status == 410 and token:
                    # The continue token expired mid-list: start over.
                    items, list_rv, token = [], None, ""
                    continue
                if response.status != 200:
                    raise UpstreamRefused(
                        response.status,
                        body,
                        response.headers.get("Content-Type", "application/json"),
                    )
            finally:
                response.release()
            document = json.loads(body)
            page_items, page_rv = self.representation.list_items(document)
            items.extend(page_items)
            if list_rv is None:
                list_rv = page_rv
            token = (document.get("metadata") or {}).get("continue") or ""
            if not token:
                break
        assert list_rv is not None
        first = not self.cache.synced
        try:
            events = self.cache.replace(items, list_rv)
        except ListRegressed:
            # The list went back in time (a stale read, an etcd restore): start over. Every
            # subscriber is ended and re-watches, which is what the apiserver would force too.
            log.warning(
                "shared watch %s: list went back in time; resetting", self.key.collection_path
            )
            self.cache.reset(items, list_rv)
            events = []
        if first:
            self._synced.set()
            log.info(
                "shared watch %s listed %d objects at resourceVersion %s",
                self.key.collection_path,
                len(items),
                list_rv,
            )
        elif events:
            log.info(
                "shared watch %s relisted: %d changes sent to subscribers",
                self.key.collection_path,
                len(events),
            )
        if not first:
            # Wake subscribers even when nothing changed: a relist may have ended cursors.
            self._notify()

    async def _watch(self) -> int:
        """One upstream watch from the cache's RV; returns the number of lines it carried."""
        lifetime = self.rng.uniform(
            self.hub_config.upstream_watch_min_seconds, self.hub_config.upstream_watch_max_seconds
        )
        query = self._query(
            watch="true",
            allowWatchBookmarks="true",
            resourceVersion=self.cache.resource_version_str or "0",
            timeoutSeconds=str(int(lifetime)),
        )
        response = await self._open(
            f"{self.key.collection_path}?{query}", verb="watch", streaming=True
        )
        try:
            if response.status == 410:
                raise Relist()
            if response.status != 200:
                body = await response.read()
                raise UpstreamRefused(
                    response.status, body, response.headers.get("Content-Type", "")
                )
            received = self.metrics.events_received.labels(self.key.resource_label)
            lines = 0
            async for line in read_lines(response, self.upstream_config.max_event_bytes):
                if not line.strip():
                    continue
                lines += 1
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "BOOKMARK":
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.cache.bookmark(rv)
                        self._notify()  # a client waiting for a newer RV may go on
                    continue
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Relist()
                    raise ValueError(f"upstream watch error: {obj.get('message')}")
                received.inc()
                if self.cache.apply(kind, obj) is not None:
                    self._notify()
                # A watch that delivered events is healthy.
                self.backoff.success()
            return lines
        finally:
            response.close()

    def debug(self) -> dict[str, Any]:
        newest = self.cache.next_seq
        lags = [newest - cursor for cursor in self.cursors.values()]
        return {
            "key": self.key.describe(),
            "state": self.state.value,
            "subscribers": self.subscribers,
            "resourceVersion": self.cache.resource_version_str,
            "maxSubscriberLag": max(lags, default=0),
            "upstreamAttempts": self.upstream_attempts,
            "relists": self.relists,
            "cache": self.cache.stats(),
        }
