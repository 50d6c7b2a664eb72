"""The upstream side of one shared watch as an explicit state machine: pure, no I/O.

The driver (:mod:`watchproxy.hub.sharedwatch`) performs the :class:`Action` the machine asks
for — open a LIST, open a WATCH from an RV, read on, sleep until a deadline, wait for the
apiserver — and feeds back what happened as an :class:`Outcome`. The machine owns the
:class:`~watchproxy.hub.watchcache.WatchCache` it fills and the back-off schedule; the clock
and the random source are passed in, so every transition is a plain function call in tests.

Phases, and what moves between them, are listed once in :data:`TRANSITIONS`; the machine
refuses any move that is not listed there, and :func:`mermaid` draws the same table.

Three rules this encodes, each the fix of a failure seen in the field (issue 10):

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
from enum import Enum

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
    Step,
    Stop,
    UpstreamBack,
    WaitForUpstream,
)
from watchproxy.hub.watchcache import WatchCache
from watchproxy.policy.backoff import Backoff

# An upstream watch that ends cleanly this soon with nothing in it counts as a failure: an
# upstream that ends watches at once must not pull us into a loop.
QUICK_END_SECONDS = 1.0

# Answers to a WATCH that retrying cannot change: the clients get them as they are.
DENIED = frozenset({401, 403, 404, 405})


class Phase(Enum):
    IDLE = "idle"
    LISTING = "listing"  # the first LIST: no state yet
    WATCHING = "watching"  # an upstream WATCH is being opened or read
    RELISTING = "relisting"  # a LIST after the upstream said 410 on resume
    BACKING_OFF = "backing-off"  # sleeping until a deadline (failure, 429, recovery jitter)
    WAITING = "waiting-for-upstream"  # the apiserver is down: the prober retries, not us
    FAILED = "failed"  # the first LIST was refused: clients get that same answer
    STOPPED = "stopped"


# ---- the table ------------------------------------------------------------------------------

P = Phase
# (from, outcome, to, condition): every move the machine can make, and nothing else.
TRANSITIONS: tuple[tuple[Phase, str, Phase, str], ...] = (
    (P.IDLE, "Start", P.LISTING, ""),
    (P.LISTING, "Listed", P.WATCHING, "from the oldest RV a client waits for"),
    (P.LISTING, "Refused", P.FAILED, "clients get the same answer"),
    (P.LISTING, "Broken", P.BACKING_OFF, "upstream up"),
    (P.LISTING, "Broken", P.WAITING, "upstream down"),
    (P.WATCHING, "Opened", P.WATCHING, ""),
    (P.WATCHING, "Event", P.WATCHING, "publish"),
    (P.WATCHING, "Bookmark", P.WATCHING, "publish"),
    (P.WATCHING, "Event", P.BACKING_OFF, "unreadable"),
    (P.WATCHING, "Bookmark", P.BACKING_OFF, "unreadable"),
    (P.WATCHING, "Silent", P.WATCHING, "dead, resume from the last RV"),
    (P.WATCHING, "Ended", P.WATCHING, "resume from the last RV"),
    (P.WATCHING, "Ended", P.BACKING_OFF, "quick and empty"),
    (P.WATCHING, "Expired", P.WATCHING, "backfill refused, cut it, go on from the list"),
    (P.WATCHING, "Expired", P.RELISTING, ""),
    (P.WATCHING, "Refused", P.FAILED, "401, 403, 404 or 405: clients get the same answer"),
    (P.WATCHING, "Refused", P.BACKING_OFF, "429 waits Retry-After, else back-off"),
    (P.WATCHING, "Broken", P.BACKING_OFF, "upstream up"),
    (P.WATCHING, "Broken", P.WAITING, "upstream down"),
    (P.RELISTING, "Listed", P.WATCHING, "publish the difference"),
    (P.RELISTING, "Refused", P.BACKING_OFF, "429 waits Retry-After, else back-off"),
    (P.RELISTING, "Broken", P.BACKING_OFF, "upstream up"),
    (P.RELISTING, "Broken", P.WAITING, "upstream down"),
    (P.BACKING_OFF, "Elapsed", P.LISTING, "the first list failed"),
    (P.BACKING_OFF, "Elapsed", P.WATCHING, "resume"),
    (P.BACKING_OFF, "Elapsed", P.RELISTING, "the relist failed"),
    (P.BACKING_OFF, "Elapsed", P.WAITING, "upstream down"),
    (P.WAITING, "UpstreamBack", P.BACKING_OFF, "jittered, under the recovery window"),
    *((phase, "Stop", P.STOPPED, "") for phase in P if phase is not P.STOPPED),
)
_ALLOWED = frozenset((a, outcome, b) for a, outcome, b, _ in TRANSITIONS)


def _mermaid_id(phase: Phase) -> str:
    return phase.name.lower()


def mermaid() -> str:
    """The transition table as a Mermaid state diagram (``stateDiagram-v2``).

    Conditions are plain words (no ``:`` or ``;``, which Mermaid reads as syntax).
    """
    lines = ["stateDiagram-v2"]
    lines += [f'    state "{p.value}" as {_mermaid_id(p)}' for p in Phase]
    lines.append(f"    [*] --> {_mermaid_id(P.IDLE)}")
    for a, outcome, b, condition in TRANSITIONS:
        if outcome == "Stop" and a is not P.IDLE:
            continue  # every phase stops the same way: one line says it
        label = f"{outcome} [{condition}]" if condition else outcome
        lines.append(f"    {_mermaid_id(a)} --> {_mermaid_id(b)}: {label}")
    lines.append(f"    {_mermaid_id(P.STOPPED)} --> [*]")
    lines.append(f"    note right of {_mermaid_id(P.STOPPED)}: every phase stops on Stop")
    return "\n".join(lines) + "\n"


class IllegalTransition(RuntimeError):
    """The machine was asked to make a move its table does not list (a bug)."""


@dataclass
class MachineConfig:
    silence: float = 120.0
    watch_lifetime: tuple[float, float] = (300.0, 600.0)
    recovery_window: float = 1.0
    quick_end: float = QUICK_END_SECONDS


@dataclass
class _Counters:
    lists: int = 0
    relists: int = 0
    watches: int = 0
    silences: int = 0
    moves: dict[tuple[str, str, str], int] = field(default_factory=dict)


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
        config: MachineConfig | None = None,
    ) -> None:
        self.cache = cache
        self.backoff = backoff
        self.clock = clock
        self.rng = rng
        self.config = config or MachineConfig()
        self.phase = Phase.IDLE
        self.in_flight = False
        self.counters = _Counters()
        self._resume = Phase.LISTING  # what to do when a wait is over
        self._floor: str | None = None  # the oldest RV a client waits for, before the list
        self._opened_at = 0.0
        self._lines = 0

    # ---- inputs from the hub ------------------------------------------------------------

    def want(self, resource_version: str) -> bool:
        """A client waits for ``resource_version``: start the history there if still possible.

        Possible until the first list is applied; the watch then replays from the oldest such
        RV (issue 18: the apiserver has that history, so the hub must not answer 410).
        """
        if self.cache.synced or self.phase in (Phase.FAILED, Phase.STOPPED):
            return False
        if self._floor is None or int(resource_version) < int(self._floor):
            self._floor = resource_version
        return True

    # ---- the machine ----------------------------------------------------------------------

    def handle(self, outcome: Outcome) -> Step:
        """Apply one outcome; return what the driver does next."""
        name = type(outcome).__name__
        if self.phase is Phase.STOPPED:
            return Step(Halt())
        if isinstance(outcome, Stop):
            self.in_flight = False
            return self._go(Phase.STOPPED, name, Halt())
        if self.phase is Phase.FAILED:
            return Step(Halt())
        handlers: dict[Phase, Callable[[Outcome, str], Step]] = {
            Phase.IDLE: self._on_idle,
            Phase.LISTING: self._on_listing,
            Phase.RELISTING: self._on_relisting,
            Phase.WATCHING: self._on_watching,
            Phase.BACKING_OFF: self._on_backing_off,
            Phase.WAITING: self._on_waiting,
        }
        return handlers[self.phase](outcome, name)

    def _go(self, to: Phase, outcome: str, action: Action, *, publish: bool = False) -> Step:
        move = (self.phase, outcome, to)
        if move not in _ALLOWED:
            raise IllegalTransition(f"{self.phase.value} --{outcome}--> {to.value}")
        key = (self.phase.value, outcome, to.value)
        self.counters.moves[key] = self.counters.moves.get(key, 0) + 1
        self.phase = to
        if isinstance(action, OpenList | OpenWatch):
            if self.in_flight:
                raise IllegalTransition("a second upstream request while one is in flight")
            self.in_flight = True
        return Step(action, publish, note=f"{move[0].value} --{outcome}--> {to.value}")

    def _unexpected(self, name: str) -> IllegalTransition:
        return IllegalTransition(f"{name} is not expected while {self.phase.value}")

    def _on_idle(self, outcome: Outcome, name: str) -> Step:
        if isinstance(outcome, Start):
            return self._list(name, relist=False)
        raise self._unexpected(name)

    def _on_listing(self, outcome: Outcome, name: str) -> Step:
        self.in_flight = False
        if isinstance(outcome, Listed):
            self.cache.replace(outcome.items, outcome.resource_version, floor=self._floor)
            self._floor = None
            return self._watch(name, publish=True)
        if isinstance(outcome, Refused):
            return self._go(Phase.FAILED, name, Fail(outcome), publish=True)
        if isinstance(outcome, Broken):
            return self._failed(name, outcome.down, Phase.LISTING)
        raise self._unexpected(name)

    def _on_relisting(self, outcome: Outcome, name: str) -> Step:
        self.in_flight = False
        if isinstance(outcome, Listed):
            try:
                self.cache.replace(outcome.items, outcome.resource_version)
            except ListRegressed:
                # The list went back in time (a stale read, an etcd restore): start over.
                # Every subscriber is ended and re-watches, as the apiserver would force too.
                self.cache.reset(outcome.items, outcome.resource_version)
            return self._watch(name, publish=True)
        if isinstance(outcome, Refused):
            return self._refused(name, outcome, Phase.RELISTING)
        if isinstance(outcome, Broken):
            return self._failed(name, outcome.down, Phase.RELISTING)
        raise self._unexpected(name)

    def _on_watching(self, outcome: Outcome, name: str) -> Step:
        now = self.clock()
        if isinstance(outcome, Opened):
            self._opened_at = now
            return self._go(Phase.WATCHING, name, ReadOn(now + self.config.silence))
        if isinstance(outcome, Event | Bookmark):
            self._lines += 1
            try:
                if isinstance(outcome, Event):
                    changed = self.cache.apply(outcome.type, outcome.object) is not None
                else:
                    self.cache.bookmark(outcome.resource_version)
                    changed = True  # a client waiting for a newer RV may go on
            except (ValueError, KeyError, TypeError, AttributeError):
                # Not an event the cache can hold (no or a non-numeric resourceVersion):
                # treat the stream as broken and resume from what was taken in.
                self.in_flight = False
                return self._failed(name, False, Phase.WATCHING)
            self.backoff.success()  # a watch that delivers is healthy
            action = ReadOn(now + self.config.silence)
            return self._go(Phase.WATCHING, name, action, publish=changed)
        self.in_flight = False
        if isinstance(outcome, Silent):
            self.counters.silences += 1
            return self._watch(name)
        if isinstance(outcome, Ended):
            if self._lines == 0 and now - self._opened_at < self.config.quick_end:
                return self._failed(name, False, Phase.WATCHING)
            self.backoff.success()
            return self._watch(name)
        if isinstance(outcome, Expired):
            if self.cache.backfilling:
                # The apiserver no longer has the RV the backfill started from: clients that
                # started there get its 410; the stream goes on from the list's RV.
                self.cache.abandon_backfill(outcome.line)
                return self._watch(name, publish=True)
            return self._list(name, relist=True)
        if isinstance(outcome, Refused):
            if outcome.status in DENIED:
                # The WATCH itself is not allowed (RBAC may grant list but not watch, a CRD
                # may be gone): retrying cannot help, and serving the list would hand clients
                # a stream the apiserver refuses them. Fail the key with the apiserver's answer.
                return self._go(Phase.FAILED, name, Fail(outcome, of_list=False), publish=True)
            return self._refused(name, outcome, Phase.WATCHING)
        if isinstance(outcome, Broken):
            return self._failed(name, outcome.down, Phase.WATCHING)
        raise self._unexpected(name)

    def _on_backing_off(self, outcome: Outcome, name: str) -> Step:
        if isinstance(outcome, Elapsed):
            if outcome.down:
                return self._go(Phase.WAITING, name, WaitForUpstream())
            if self._resume is Phase.WATCHING:
                return self._watch(name)
            return self._list(name, relist=self._resume is Phase.RELISTING)
        raise self._unexpected(name)

    def _on_waiting(self, outcome: Outcome, name: str) -> Step:
        if isinstance(outcome, UpstreamBack):
            # The prober has seen the apiserver answer: our own schedule starts again, and
            # the keys that waited spread their reconnects over a short window.
            self.backoff.reset()
            until = self.clock() + self.rng.uniform(0.0, self.config.recovery_window)
            return self._go(Phase.BACKING_OFF, name, Sleep(until))
        raise self._unexpected(name)

    # ---- helpers --------------------------------------------------------------------------

    def _list(self, name: str, *, relist: bool) -> Step:
        if relist:
            self.counters.relists += 1
        else:
            self.counters.lists += 1
        to = Phase.RELISTING if relist else Phase.LISTING
        rv = self.cache.resource_version_str if relist else None
        return self._go(to, name, OpenList(relist=relist, not_older_than=rv))

    def _watch(self, name: str, *, publish: bool = False) -> Step:
        rv = self.cache.stream_resource_version_str
        assert rv is not None, "a watch before the first list"
        low, high = self.config.watch_lifetime
        self._lines = 0
        self.counters.watches += 1
        action = OpenWatch(rv, int(self.rng.uniform(low, high)))
        return self._go(Phase.WATCHING, name, action, publish=publish)

    def _failed(self, name: str, down: bool, resume: Phase) -> Step:
        self._resume = resume
        if down:
            return self._go(Phase.WAITING, name, WaitForUpstream())
        return self._go(Phase.BACKING_OFF, name, Sleep(self.clock() + self.backoff.failure()))

    def _refused(self, name: str, refused: Refused, resume: Phase) -> Step:
        self._resume = resume
        if refused.status == 429 and refused.retry_after is not None:
            # Wait out the apiserver's Retry-After, then repeat the same request: a 429 is
            # not a reason to relist (pitfall 22).
            until = self.clock() + max(0.0, refused.retry_after)
            return self._go(Phase.BACKING_OFF, name, Sleep(until))
        return self._go(Phase.BACKING_OFF, name, Sleep(self.clock() + self.backoff.failure()))


if __name__ == "__main__":  # pragma: no cover - prints the diagram for docs/architecture.md
    print(mermaid(), end="")
