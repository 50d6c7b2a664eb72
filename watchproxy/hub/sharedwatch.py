"""One shared upstream watch: the I/O driver of its machine, and the pulse that wakes subscribers.

What to do next is decided by :class:`~watchproxy.hub.machine.SharedWatchMachine` (pure);
this module only performs its actions — a LIST or a WATCH (through :mod:`watchproxy.hub.fetcher`
and the hub's ports), a sleep, a wait for the apiserver — and feeds the outcomes back, all in
one loop (:meth:`SharedWatch._run`), the only caller of the machine: its start, every line of
every watch, a failure, the end and even a bug all reach the machine there. Events go into the
machine's :class:`~watchproxy.hub.watchcache.WatchCache`; subscribers read it through cursors
and are woken by :meth:`SharedWatch.wait_change`.

Nothing here is awaited inside an ``except``: failures arrive as outcome values. An ``except``
keeps its exception, and through the traceback the failed connection, alive until it ends: a
back-off slept inside one would hold that connection for the whole outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any, NoReturn

from watchproxy.config import HubConfig
from watchproxy.errors import UpstreamUnavailable
from watchproxy.hub.fanout import Fanout, FanoutPacing, wake
from watchproxy.hub.fetcher import Fetcher, WatchOutcomes
from watchproxy.hub.firstsync import FirstSync
from watchproxy.hub.historybudget import HistoryBudget
from watchproxy.hub.machine import MachineConfig, SharedWatchMachine, Step
from watchproxy.hub.outcomes import (
    Broken,
    Elapsed,
    Fail,
    Halt,
    NotShared,
    OpenList,
    OpenWatch,
    Outcome,
    ReadOn,
    Refused,
    Sleep,
    Start,
    Stop,
    UpstreamBack,
    WaitForUpstream,
)
from watchproxy.hub.ports import UpstreamHealth, WatchSource
from watchproxy.hub.transitions import Phase
from watchproxy.hub.watchcache import WatchCache
from watchproxy.hub.watchkey import WatchKey
from watchproxy.kube.representation import Representation
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import Backoff, BackoffPolicy

log = logging.getLogger("watchproxy.hub")


_OPENS = (OpenList, OpenWatch)  # the actions that send a request upstream


async def _until_cancelled() -> NoReturn:
    """What a failed key does until its owner closes it (see ``SharedWatch._fail``)."""
    await asyncio.get_running_loop().create_future()
    raise AssertionError("a future nobody completes was completed")


class UpstreamRefused(Exception):
    """The apiserver refused the key's first LIST (``of_list``) or its WATCH with an error."""

    def __init__(self, status: int, body: bytes, content_type: str, *, of_list: bool) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type
        self.of_list = of_list


class KeyNotShared(Exception):
    """The hub will not share this key (``reason``); its clients are passed through."""

    def __init__(self, reason: NotShared) -> None:
        super().__init__(f"not shared: {reason.value}")
        self.reason = reason


def _nobody_to_tell(shared: SharedWatch) -> None:
    return None


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
        first_sync: FirstSync | None = None,
        watch_lists_refused: Callable[[], None] = lambda: None,
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
            config=MachineConfig.of(hub_config, backoff_policy),
        )
        self.fetcher = Fetcher(
            key,
            representation,
            source=source,
            health=health,
            metrics=metrics,
            forwarded_auth=forwarded_auth,
            clock=clock,
            cache_admits=cache_admits,
            first_sync=first_sync,
            # The first list's watch-list goes on as the shared watch: a lifetime as any.
            initial_timeout_seconds=int(
                rng.uniform(
                    hub_config.upstream_watch_min_seconds, hub_config.upstream_watch_max_seconds
                )
            ),
            watch_lists_refused=watch_lists_refused,
            cached=lambda key: self.cache.state.get(key),
        )
        pacing = FanoutPacing(hub_config.fanout_max_delay_seconds, hub_config.fanout_cpu_share)
        self.fanout = Fanout(self.cache, metrics, key.resource_label, lambda: self.closed, pacing)
        self.subscribers = 0
        self.cursors: dict[int, int] = {}  # id(subscriber) -> its next seq, for lag and /debug
        self.failure: UpstreamRefused | KeyNotShared | None = None
        self.upstream_attempts = 0
        self._waiters: set[asyncio.Future[None]] = set()
        # When the state's resourceVersion last moved (an event or a bookmark), by self.clock.
        self.advanced_at: float | None = None
        self._advanced_rv: int | None = None
        self._synced = asyncio.Event()
        self._watch_accepted = False
        self._closing = False  # close() has begun: no new linger, subscribers end
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.Task[None] | None = None
        # What the owner does once no client is left (the hub retires the watch).
        self.on_idle: Callable[[SharedWatch], None] = _nobody_to_tell

    # ---- subscriber side -------------------------------------------------------------------

    async def wait_change(self, timeout: float) -> None:
        """Return at the next change (new events, a bookmark, the end) or after ``timeout``.

        A future per waiter and a timer handle, no task: this runs once per event batch for
        every subscriber, so it must stay cheap.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        timer = loop.call_later(timeout, wake, waiter)
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
            wake(waiter)

    def want(self, resource_version: str) -> None:
        """A client will ask for ``resource_version``: start the history there if not synced."""
        self.machine.want(resource_version)

    async def wait_synced(self, timeout: float) -> None:
        """Wait for the first list; raise UpstreamRefused, KeyNotShared or UpstreamUnavailable
        if it fails."""
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
        return self._closing or self.machine.phase in (Phase.STOPPED, Phase.FAILED)

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
        if self.subscribers == 0:
            self.on_idle(self)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(
            self._run(Start()), name=f"watchproxy-watch {self.key.collection_path}"
        )

    async def close(self) -> None:
        """Stop the upstream watch and wake every subscriber so that it ends its stream."""
        self._closing = True
        if self.fetcher.first_sync is not None:
            self.fetcher.first_sync.abandon()  # never listed: its client is not kept waiting
        for task in (self._task, self._linger):
            if task is not None:
                task.cancel()  # the loop feeds its machine Stop
        for task in (self._task, self._linger):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._linger = None
        if self.machine.phase is not Phase.STOPPED:
            # Never started, or cancelled before it first ran: the loop still does the stop.
            await self._run(Stop())
        self.cache.detach()
        self._synced.set()
        self._notify()

    # ---- the driver -----------------------------------------------------------------------

    async def _run(self, first: Start | Stop) -> None:
        """The machine's one loop: feed it an outcome, perform the action it answers, repeat.

        Ends with the machine stopped: by ``close()`` (a cancel, fed to the machine as Stop,
        then re-raised) or by a bug, which is logged with its traceback and ends the key so
        that its clients re-watch onto a fresh one.
        """
        outcome: Outcome = first
        watch: WatchOutcomes | None = None  # the upstream watch being read, if one is
        cancelled = crashed = False
        while True:
            try:
                step = self.machine.handle(outcome)
                if isinstance(outcome, Broken) and not outcome.down:
                    # While the apiserver is down the prober reports it, once; a stream that
                    # broke while it is up (a cut, a truncated body) is told here, with why.
                    log.warning(
                        "shared watch %s: the upstream stream broke: %s",
                        self.key.collection_path,
                        outcome.reason,
                    )
                del outcome  # a Listed holds the whole list: not kept while the watch runs
                self._took(step)
                action = step.action
                if watch is not None:
                    if isinstance(action, ReadOn):
                        outcome = await watch.asend(action.deadline)
                        continue
                    reading, watch = watch, None
                    await reading.aclose()  # the machine is done with it: close it now
                if isinstance(action, Halt):
                    break
                if isinstance(action, OpenWatch):
                    watch = self.fetcher.watch(action)
                    outcome = await anext(watch)
                else:
                    outcome = await self._perform(action)
            except asyncio.CancelledError:
                # From close(). A watch being read has ended with it, and what remains is
                # not awaited here: the machine stops on the next turn.
                if cancelled or crashed:
                    raise
                cancelled, outcome = True, Stop()
            except Exception:
                if cancelled or crashed:
                    raise
                log.exception("shared watch %s: unexpected error", self.key.collection_path)
                crashed, outcome = True, Stop()
        await self.fetcher.close()  # a watch-list kept for a watch that never came
        if crashed:
            self._synced.set()
            self._notify()
            self.on_idle(self)
        if cancelled:
            raise asyncio.CancelledError

    async def _perform(self, action: OpenList | Sleep | WaitForUpstream | Fail | ReadOn) -> Outcome:
        if isinstance(action, OpenList):
            return await self.fetcher.list(action)
        if isinstance(action, Sleep):
            delay = max(0.0, action.until - self.clock())
            self.metrics.backoff_delay.set(delay)
            await asyncio.sleep(delay)
            self.metrics.backoff_seconds.inc(delay)
            return Elapsed(down=self.health.down)
        if isinstance(action, WaitForUpstream):
            await self.health.wait_up()
            return UpstreamBack()
        if isinstance(action, Fail):
            self._fail(action)
            return await _until_cancelled()
        raise AssertionError(f"{action} while no upstream watch is open")

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
        if isinstance(action, _OPENS):
            self.upstream_attempts += 1
            self.metrics.watch_upstream_opens.inc()
            if isinstance(action, OpenList) and action.relist:
                self.metrics.relists.inc()
        if step.move is not None and step.move.logged:
            log.info("shared watch %s: %s", self.key.collection_path, step.move.label)

    def _fail(self, fail: Fail) -> None:
        refusal = fail.refusal
        if isinstance(refusal, Refused):
            self.failure = UpstreamRefused(
                refusal.status, refusal.body, refusal.content_type, of_list=fail.of_list
            )
        else:
            self.failure = KeyNotShared(refusal.reason)
        self._synced.set()
        self._notify()
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
