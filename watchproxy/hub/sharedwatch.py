"""One shared upstream watch: the I/O driver of its machine, and the pulse that wakes subscribers.

What to do next is decided by :class:`~watchproxy.hub.machine.SharedWatchMachine` (pure);
this module only performs its actions — a LIST or a WATCH (through :mod:`watchproxy.hub.fetcher`
and the hub's ports), a sleep, a wait for the apiserver — and feeds the outcomes back. Events go
into the machine's :class:`~watchproxy.hub.watchcache.WatchCache`; subscribers read it through
cursors and are woken by :meth:`SharedWatch.wait_change`.

Nothing here is awaited inside an ``except``: failures arrive as outcome values. The old
driver slept its back-off inside the ``except`` that caught the failure, which kept the failed
connection (through the exception's traceback) alive for the whole outage (issue 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from watchproxy.config import HubConfig
from watchproxy.errors import UpstreamUnavailable
from watchproxy.hub.fanout import Fanout, FanoutPacing
from watchproxy.hub.fetcher import Fetcher
from watchproxy.hub.historybudget import HistoryBudget
from watchproxy.hub.machine import MachineConfig, Phase, SharedWatchMachine
from watchproxy.hub.outcomes import (
    Elapsed,
    Fail,
    OpenList,
    OpenWatch,
    Outcome,
    ReadOn,
    Refused,
    Sleep,
    Start,
    Step,
    Stop,
    UpstreamBack,
    WaitForUpstream,
)
from watchproxy.hub.ports import UpstreamHealth, WatchSource
from watchproxy.hub.watchcache import WatchCache
from watchproxy.hub.watchkey import WatchKey
from watchproxy.kube.representation import Representation
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import Backoff, BackoffPolicy

log = logging.getLogger("watchproxy.hub")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class UpstreamRefused(Exception):
    """The apiserver refused the key's first LIST (``of_list``) or its WATCH with an error."""

    def __init__(self, status: int, body: bytes, content_type: str, *, of_list: bool) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type
        self.of_list = of_list


class SharedWatch:
    """The single upstream watch for one key, its cache, and the pulse that wakes subscribers."""

    def __init__(
        self,
        key: WatchKey,
        representation: Representation,
        *,
        source: WatchSource,
        health: UpstreamHealth,
        hub_config: HubConfig,
        backoff_policy: BackoffPolicy,
        metrics: Metrics,
        rng: random.Random,
        forwarded_auth: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        budget: HistoryBudget | None = None,
        cache_admits: Callable[[int], bool] = lambda _bytes: True,
    ) -> None:
        self.key = key
        self.representation = representation
        self.source = source
        self.health = health
        self.hub_config = hub_config
        self.metrics = metrics
        self.forwarded_auth = forwarded_auth
        self.clock = clock
        self.cache = WatchCache(
            representation,
            capacity=hub_config.history_size,
            max_age=hub_config.history_max_age_seconds,
            clock=clock,
            max_bytes=hub_config.history_max_bytes_per_key,
            budget=budget,
        )
        self.machine = SharedWatchMachine(
            self.cache,
            Backoff(backoff_policy, rng, clock),
            clock=clock,
            rng=rng,
            config=MachineConfig(
                silence=hub_config.upstream_silence_seconds,
                watch_lifetime=(
                    hub_config.upstream_watch_min_seconds,
                    hub_config.upstream_watch_max_seconds,
                ),
                # Spreads the keys' re-watches a little after an outage; the upstream limiter
                # meters them anyway, and every 0.1 s here is 0.05 s of recovery latency.
                recovery_window=min(0.25, backoff_policy.initial),
            ),
        )
        self.fetcher = Fetcher(
            key,
            representation,
            source=source,
            health=health,
            machine=self.machine,
            metrics=metrics,
            forwarded_auth=forwarded_auth,
            clock=clock,
            took=self._took,
            cache_admits=cache_admits,
        )
        pacing = FanoutPacing(hub_config.fanout_max_delay_seconds, hub_config.fanout_cpu_share)
        self.fanout = Fanout(self.cache, metrics, key.resource_label, lambda: self.closed, pacing)
        self.subscribers = 0
        self.cursors: dict[int, int] = {}  # id(subscriber) -> its next seq, for lag and /debug
        self.failure: UpstreamRefused | None = None
        self.upstream_attempts = 0
        self._waiters: set[asyncio.Future[None]] = set()
        # When the state's resourceVersion last moved (an event or a bookmark), by self.clock.
        self.advanced_at: float | None = None
        self._advanced_rv: int | None = None
        self._synced = asyncio.Event()
        self._watch_accepted = False
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
        rv = self.cache.resource_version
        if rv != self._advanced_rv:
            self._advanced_rv = rv
            self.advanced_at = self.clock()
        self.fanout.schedule()
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            _wake(waiter)

    def want(self, resource_version: str) -> None:
        """A client will ask for ``resource_version``: start the history there if not synced."""
        self.machine.want(resource_version)

    async def wait_synced(self, timeout: float) -> None:
        """Wait for the first list; raise UpstreamRefused / UpstreamUnavailable if it fails."""
        if not self._synced.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._synced.wait(), timeout)
        if self.failure is not None:
            raise self.failure
        if not self._synced.is_set() or not self.cache.synced:
            raise UpstreamUnavailable(
                "the apiserver did not answer the initial list in time",
                retry_after=self.health.retry_after(),
            )

    @property
    def state(self) -> Phase:
        return self.machine.phase

    @property
    def closed(self) -> bool:
        return self.machine.phase in (Phase.STOPPED, Phase.FAILED)

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
        self.machine.handle(Stop())
        for task in (self._task, self._linger):
            if task is not None:
                task.cancel()
        for task in (self._task, self._linger):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._linger = None
        self.cache.detach()
        self._synced.set()
        self._notify()

    # ---- the driver -----------------------------------------------------------------------

    async def _run(self) -> None:
        crash: str | None = None
        try:
            await self._drive()
        except Exception as error:
            # A bug, not an upstream failure (those are outcomes): log it with its traceback
            # and end the key, so that its clients re-watch onto a fresh one.
            log.exception("shared watch %s: unexpected error", self.key.collection_path)
            crash = type(error).__name__
        if crash is not None:
            self.machine.handle(Stop())
            self._synced.set()
            self._notify()
            if self.on_idle is not None:
                self.on_idle(self)

    async def _drive(self) -> None:
        step = self.machine.handle(Start())
        while True:
            self._took(step)
            action = step.action
            if isinstance(action, OpenWatch):
                step = await self.fetcher.watch(action)
            elif isinstance(action, Fail):
                self._fail(action.refusal, of_list=action.of_list)
                return
            elif isinstance(action, OpenList | Sleep | WaitForUpstream):
                # No local keeps the outcome: a Listed one holds the whole list's objects
                # (1 MB of references and sizes for 10,000 pods), which would then live on
                # for as long as the watch that follows.
                step = self.machine.handle(await self._outcome(action))
            else:  # Halt
                return

    async def _outcome(self, action: OpenList | Sleep | WaitForUpstream) -> Outcome:
        if isinstance(action, OpenList):
            return await self.fetcher.list(action)
        if isinstance(action, Sleep):
            delay = max(0.0, action.until - self.clock())
            self.metrics.backoff_delay.set(delay)
            await asyncio.sleep(delay)
            self.metrics.backoff_seconds.inc(delay)
            return Elapsed(down=self.health.down)
        await self.health.wait_up()
        return UpstreamBack()

    def _took(self, step: Step) -> None:
        """Bookkeeping for every step the machine takes: wake, log, count."""
        if step.publish:
            self._notify()
        if isinstance(step.action, ReadOn):
            self._watch_accepted = True
        # Clients are answered once the first LIST is in AND the apiserver has accepted the
        # first WATCH: in forward-identity mode an account may list but not watch, and a 200
        # served from the list alone would give it a stream the apiserver refuses it.
        if self.cache.synced and self._watch_accepted and not self._synced.is_set():
            self._synced.set()
            log.info(
                "shared watch %s listed %d objects at resourceVersion %s",
                self.key.collection_path,
                len(self.cache),
                self.cache.resource_version_str,
            )
        action = step.action
        if isinstance(action, OpenList | OpenWatch):
            self.upstream_attempts += 1
            self.metrics.watch_upstream_opens.inc()
            if isinstance(action, OpenList) and action.relist:
                self.metrics.relists.inc()
        if isinstance(action, Sleep | WaitForUpstream | OpenList) or "Silent" in step.note:
            # Outages, relists and dead watches are worth a line; routine re-watches are not.
            log.info("shared watch %s: %s", self.key.collection_path, step.note)

    def _fail(self, refusal: Refused, *, of_list: bool) -> None:
        self.failure = UpstreamRefused(
            refusal.status, refusal.body, refusal.content_type, of_list=of_list
        )
        self._synced.set()
        self._notify()
        if self.on_idle is not None:
            self.on_idle(self)

    def debug(self) -> dict[str, Any]:
        newest = self.cache.next_seq
        lags = [newest - cursor for cursor in self.cursors.values()]
        return {
            "key": self.key.describe(),
            "state": self.machine.phase.value,
            "subscribers": self.subscribers,
            "resourceVersion": self.cache.resource_version_str,
            "maxSubscriberLag": max(lags, default=0),
            "upstreamAttempts": self.upstream_attempts,
            "relists": self.machine.counters.relists,
            "silences": self.machine.counters.silences,
            "cache": self.cache.stats(),
        }
