"""The upstream side of one shared watch as an explicit state machine: pure, no I/O.

The driver (:mod:`watchproxy.hub.sharedwatch`) performs the :class:`Action` the machine asks
for — open a LIST, open a WATCH from an RV, read on, sleep until a deadline, wait for the
apiserver — and feeds back what happened as an :class:`Outcome`. The machine owns the
:class:`~watchproxy.hub.watchcache.WatchCache` it fills and the back-off schedule; the clock
and the random source are passed in, so every transition is a plain function call in tests.

Phases, and what moves between them, are listed once in :data:`TRANSITIONS`. The table drives
the machine: :meth:`SharedWatchMachine.handle` dispatches on (phase, outcome) to the one handler
of that pair, which may only take one of the pair's rows; :func:`mermaid` draws the same table
for docs/architecture.md. The driver's single loop is the only caller of ``handle``.

Three rules this encodes, each the answer to a failure a real apiserver can cause:

- relisting after a 410 is its own phase, distinct from the first list: a refused relist is
  backed off and retried, while a refused first list is the clients' answer (``failed``);
- a watch that carries neither an event nor a bookmark for ``silence`` seconds is dead (a
  half-open connection reads nothing forever): it is resumed from the last RV;
- while the apiserver is down the machine makes no attempt of its own (the one prober does);
  when the prober sees it back, the watch resumes after a jitter in ``[0, recovery_window)``
  and its own back-off starts again — instead of sleeping out a delay that grew during the
  outage, which made the first event after recovery arrive 5-16 s late.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from watchproxy.config import HubConfig
from watchproxy.hub.cachetypes import ListRegressed
from watchproxy.hub.outcomes import (
    Action,
    Bookmark,
    Broken,
    Elapsed,
    Ended,
    Event,
    Expired,
    Fail,
    Halt,
    Listed,
    Opened,
    OpenList,
    OpenWatch,
    Outcome,
    ReadOn,
    Refused,
    Silent,
    Sleep,
    Start,
    Stop,
    Unshareable,
    UpstreamBack,
    WaitForUpstream,
)
from watchproxy.hub.transitions import TRANSITIONS, Move, Phase
from watchproxy.hub.watchcache import WatchCache
from watchproxy.kube.watchquery import QUICK_END_SECONDS
from watchproxy.policy.backoff import Backoff, BackoffPolicy


@dataclass(frozen=True, slots=True)
class Step:
    """The next action; ``publish``: the cache changed, wake the subscribers; ``move``: the
    row of the transition table taken (None when the outcome changed nothing: a stopped or
    failed machine ignores what still comes in)."""

    action: Action
    publish: bool = False
    move: Move | None = None


# Answers to a WATCH that retrying cannot change: the clients get them as they are.
DENIED = frozenset({401, 403, 404, 405})


class IllegalTransition(RuntimeError):
    """The machine was asked to make a move its table does not list (a bug)."""


@dataclass(frozen=True)
class MachineConfig:
    """The machine's timings; :meth:`of` derives them from the hub's configuration."""

    silence: float
    watch_lifetime: tuple[float, float]
    recovery_window: float
    quick_end: float = QUICK_END_SECONDS

    @classmethod
    def of(cls, hub: HubConfig, backoff: BackoffPolicy) -> MachineConfig:
        return cls(
            silence=hub.upstream_silence_seconds,
            watch_lifetime=(hub.upstream_watch_min_seconds, hub.upstream_watch_max_seconds),
            # Spreads the keys' re-watches a little after an outage; the upstream limiter
            # meters them anyway, and every 0.1 s here is 0.05 s of recovery latency.
            recovery_window=min(0.25, backoff.initial),
        )


@dataclass
class _Counters:
    lists: int = 0
    relists: int = 0
    watches: int = 0
    silences: int = 0
    # How often each row of TRANSITIONS was taken, by its index there.
    moves: list[int] = field(default_factory=lambda: [0] * len(TRANSITIONS))


@dataclass(slots=True)
class _Reading:
    """What the WATCHING phase knows of the upstream watch it has open."""

    opened_at: float = 0.0
    lines: int = 0


# What a cache refuses an event or bookmark with (no or a non-numeric resourceVersion).
_UNREADABLE = (ValueError, KeyError, TypeError, AttributeError)
# The step of a machine that ignores what it is fed (stopped, or failed and waiting for Stop).
_HALT = Step(Halt())


class SharedWatchMachine:
    """One shared watch's upstream state: feed it outcomes, do the actions it returns.

    Guarantees: at most one upstream request in flight (an Open* action is only returned
    when none is, see :attr:`in_flight`); every move is one of :data:`TRANSITIONS`; events
    reach the cache in upstream order and resume points never go backwards.
    """

    def __init__(
        self,
        cache: WatchCache,
        backoff: Backoff,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        config: MachineConfig,
    ) -> None:
        self.cache = cache
        self.backoff = backoff
        self.clock = clock
        self.rng = rng
        self.config = config
        self.phase = Phase.IDLE
        self.in_flight = False
        self.counters = _Counters()
        # Per phase: what the WATCHING phase reads, and what the waiting phases (BACKING_OFF,
        # WAITING) go back to when their wait is over.
        self._reading = _Reading()
        self._resume = Phase.LISTING
        # Until the first list is applied: the oldest RV a client waits for.
        self._floor: str | None = None

    # ---- inputs from the hub ------------------------------------------------------------

    def want(self, resource_version: str) -> bool:
        """A client waits for ``resource_version``: start the history there if still possible.

        Possible until the first list is applied; the watch then replays from the oldest such
        RV: the apiserver still has that history, so the hub must not answer 410 for it.
        """
        if self.cache.synced or self.phase in (Phase.FAILED, Phase.STOPPED):
            return False
        if self._floor is None or int(resource_version) < int(self._floor):
            self._floor = resource_version
        return True

    # ---- the machine ----------------------------------------------------------------------

    def handle(self, outcome: Outcome) -> Step:
        """Apply one outcome; return what the driver does next."""
        handler = _DISPATCH[self.phase].get(type(outcome))
        if handler is None:
            if self.phase in (Phase.STOPPED, Phase.FAILED):
                return _HALT  # what was under way when it failed or stopped
            name = type(outcome).__name__
            raise IllegalTransition(f"{name} is not expected while {self.phase.value}")
        return handler(self, outcome)

    def _go(self, outcome: Outcome, to: Phase, action: Action, *, publish: bool = False) -> Step:
        move = _TARGETS[self.phase][type(outcome)].get(to)
        if move is None:
            name = type(outcome).__name__
            raise IllegalTransition(f"{self.phase.value} --{name}--> {to.value}")
        index, row = move
        self.counters.moves[index] += 1
        self.phase = to
        return Step(action, publish, row)

    # ---- one handler per (phase, outcome) of the table ---------------------------------------

    def _start(self, outcome: Start) -> Step:
        return self._list(outcome, relist=False)

    def _listed(self, outcome: Listed) -> Step:
        self.in_flight = False
        self.cache.replace(outcome.items, outcome.resource_version, floor=self._floor)
        self._floor = None
        return self._watch(outcome, publish=True)

    def _list_refused(self, outcome: Refused | Unshareable) -> Step:
        self.in_flight = False
        return self._go(outcome, Phase.FAILED, Fail(outcome), publish=True)

    def _relisted(self, outcome: Listed) -> Step:
        self.in_flight = False
        try:
            self.cache.replace(outcome.items, outcome.resource_version)
        except ListRegressed:
            # The list went back in time (a stale read, an etcd restore): start over.
            # Every subscriber is ended and re-watches, as the apiserver would force too.
            self.cache.reset(outcome.items, outcome.resource_version)
        return self._watch(outcome, publish=True)

    def _relist_refused(self, outcome: Refused) -> Step:
        self.in_flight = False
        return self._refused(outcome, Phase.RELISTING)

    def _relist_unshareable(self, outcome: Unshareable) -> Step:
        # Only the representation can refuse a relist (the cache budget is checked when a key
        # is first listed): the apiserver may encode it again later, so try again.
        self.in_flight = False
        return self._pause(outcome, Phase.RELISTING, down=False)

    def _broken(self, outcome: Broken) -> Step:
        self.in_flight = False
        return self._pause(outcome, self.phase, down=outcome.down)

    def _opened(self, outcome: Opened) -> Step:
        now = self.clock()
        self._reading.opened_at = now
        return self._go(outcome, Phase.WATCHING, ReadOn(now + self.config.silence))

    def _line(self, outcome: Event | Bookmark) -> Step:
        self._reading.lines += 1
        try:
            if isinstance(outcome, Event):
                changed = self.cache.apply(outcome.type, outcome.object) is not None
            else:
                self.cache.bookmark(outcome.resource_version)
                changed = True  # a client waiting for a newer RV may go on
        except _UNREADABLE:
            # Not a line the cache can hold: treat the stream as broken and resume from what
            # was taken in.
            self.in_flight = False
            return self._pause(outcome, Phase.WATCHING, down=False)
        self.backoff.success()  # a watch that delivers is healthy
        action = ReadOn(self.clock() + self.config.silence)
        return self._go(outcome, Phase.WATCHING, action, publish=changed)

    def _silent(self, outcome: Silent) -> Step:
        self.in_flight = False
        self.counters.silences += 1
        return self._watch(outcome)

    def _ended(self, outcome: Ended) -> Step:
        self.in_flight = False
        reading = self._reading
        if reading.lines == 0 and self.clock() - reading.opened_at < self.config.quick_end:
            return self._pause(outcome, Phase.WATCHING, down=False)
        self.backoff.success()
        return self._watch(outcome)

    def _expired(self, outcome: Expired) -> Step:
        self.in_flight = False
        if self.cache.backfilling:
            # The apiserver no longer has the RV the backfill started from: clients that
            # started there get its 410; the stream goes on from the list's RV.
            self.cache.abandon_backfill(outcome.line)
            return self._watch(outcome, publish=True)
        return self._list(outcome, relist=True)

    def _watch_refused(self, outcome: Refused) -> Step:
        self.in_flight = False
        if outcome.status in DENIED:
            # The WATCH itself is not allowed (RBAC may grant list but not watch, a CRD
            # may be gone): retrying cannot help, and serving the list would hand clients
            # a stream the apiserver refuses them. Fail the key with the apiserver's answer.
            return self._go(outcome, Phase.FAILED, Fail(outcome, of_list=False), publish=True)
        return self._refused(outcome, Phase.WATCHING)

    def _elapsed(self, outcome: Elapsed) -> Step:
        if outcome.down:
            return self._go(outcome, Phase.WAITING, WaitForUpstream())
        if self._resume is Phase.WATCHING:
            return self._watch(outcome)
        return self._list(outcome, relist=self._resume is Phase.RELISTING)

    def _upstream_back(self, outcome: UpstreamBack) -> Step:
        # The prober has seen the apiserver answer: our own schedule starts again, and
        # the keys that waited spread their reconnects over a short window.
        self.backoff.reset()
        until = self.clock() + self.rng.uniform(0.0, self.config.recovery_window)
        return self._go(outcome, Phase.BACKING_OFF, Sleep(until))

    def _stop(self, outcome: Stop) -> Step:
        self.in_flight = False
        return self._go(outcome, Phase.STOPPED, Halt())

    # ---- helpers --------------------------------------------------------------------------

    def _opens(self) -> None:
        if self.in_flight:
            raise IllegalTransition("a second upstream request while one is in flight")
        self.in_flight = True

    def _list(self, outcome: Outcome, *, relist: bool) -> Step:
        if relist:
            self.counters.relists += 1
        else:
            self.counters.lists += 1
        to = Phase.RELISTING if relist else Phase.LISTING
        rv = self.cache.resource_version_str if relist else None
        self._opens()
        return self._go(outcome, to, OpenList(relist=relist, not_older_than=rv))

    def _watch(self, outcome: Outcome, *, publish: bool = False) -> Step:
        rv = self.cache.stream_resource_version_str
        assert rv is not None, "a watch before the first list"
        low, high = self.config.watch_lifetime
        self._reading = _Reading()
        self.counters.watches += 1
        action = OpenWatch(rv, int(self.rng.uniform(low, high)))
        self._opens()
        return self._go(outcome, Phase.WATCHING, action, publish=publish)

    def _pause(self, outcome: Outcome, resume: Phase, *, down: bool) -> Step:
        self._resume = resume
        if down:
            return self._go(outcome, Phase.WAITING, WaitForUpstream())
        until = self.clock() + self.backoff.failure()
        return self._go(outcome, Phase.BACKING_OFF, Sleep(until))

    def _refused(self, refused: Refused, resume: Phase) -> Step:
        if refused.status == 429 and refused.retry_after is not None:
            # Wait out the apiserver's Retry-After, then repeat the same request: a 429 is
            # not a reason to relist (docs/pitfalls.md).
            self._resume = resume
            until = self.clock() + max(0.0, refused.retry_after)
            return self._go(refused, Phase.BACKING_OFF, Sleep(until))
        return self._pause(refused, resume, down=False)


P = Phase
_Handler = Callable[[SharedWatchMachine, Any], Step]
M = SharedWatchMachine
# The handler of each (phase, outcome) pair of TRANSITIONS; it picks among that pair's rows.
_HANDLERS: dict[tuple[Phase, type[object]], _Handler] = {
    (P.IDLE, Start): M._start,
    (P.LISTING, Listed): M._listed,
    (P.LISTING, Refused): M._list_refused,
    (P.LISTING, Unshareable): M._list_refused,
    (P.LISTING, Broken): M._broken,
    (P.WATCHING, Opened): M._opened,
    (P.WATCHING, Event): M._line,
    (P.WATCHING, Bookmark): M._line,
    (P.WATCHING, Silent): M._silent,
    (P.WATCHING, Ended): M._ended,
    (P.WATCHING, Expired): M._expired,
    (P.WATCHING, Refused): M._watch_refused,
    (P.WATCHING, Broken): M._broken,
    (P.RELISTING, Listed): M._relisted,
    (P.RELISTING, Refused): M._relist_refused,
    (P.RELISTING, Unshareable): M._relist_unshareable,
    (P.RELISTING, Broken): M._broken,
    (P.BACKING_OFF, Elapsed): M._elapsed,
    (P.WAITING, UpstreamBack): M._upstream_back,
    **{(phase, Stop): M._stop for phase in P if phase is not P.STOPPED},
}


def _tables() -> tuple[
    dict[Phase, dict[type[object], _Handler]],
    dict[Phase, dict[type[object], dict[Phase, tuple[int, Move]]]],
]:
    """Per phase, per outcome: its handler, and the rows it may take by their target."""
    pairs = {(move.source, move.outcome) for move in TRANSITIONS}
    if pairs != set(_HANDLERS):
        raise IllegalTransition(f"handlers and table differ: {pairs ^ set(_HANDLERS)}")
    dispatch: dict[Phase, dict[type[object], _Handler]] = {phase: {} for phase in Phase}
    targets: dict[Phase, dict[type[object], dict[Phase, tuple[int, Move]]]] = {
        phase: {} for phase in Phase
    }
    for index, move in enumerate(TRANSITIONS):
        dispatch[move.source][move.outcome] = _HANDLERS[(move.source, move.outcome)]
        targets[move.source].setdefault(move.outcome, {})[move.target] = (index, move)
    return dispatch, targets


_DISPATCH, _TARGETS = _tables()
