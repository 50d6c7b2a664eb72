"""The shared-watch state machine (watchproxy.hub.machine): every transition of its table."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from watchproxy.hub.machine import IllegalTransition, MachineConfig, SharedWatchMachine, Step
from watchproxy.hub.outcomes import (
    Bookmark,
    Broken,
    Elapsed,
    Ended,
    Event,
    Expired,
    Fail,
    Halt,
    Listed,
    NotShared,
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
from watchproxy.hub.transitions import TRANSITIONS, Phase, mermaid
from watchproxy.hub.watchcache import WatchCache
from watchproxy.kube.representation import JsonRepresentation
from watchproxy.policy.backoff import Backoff, BackoffPolicy

SILENCE = 120.0
GONE = b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}\n'


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


class Rig:
    """A machine with a fake clock, no jitter, and a cache listed at 10 (a@5) when synced."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.cache = WatchCache(JsonRepresentation(), capacity=100, max_age=1e9, clock=self.clock)
        policy = BackoffPolicy(initial=0.8, factor=2.0, cap=30.0, jitter="none")
        self.machine = SharedWatchMachine(
            self.cache,
            Backoff(policy, random.Random(1), self.clock),
            clock=self.clock,
            rng=random.Random(1),
            config=MachineConfig(silence=SILENCE, watch_lifetime=(300, 600), recovery_window=1.0),
        )
        self.steps: list[Step] = []

    def feed(self, *outcomes: Outcome) -> Step:
        for outcome in outcomes:
            self.steps.append(self.machine.handle(outcome))
        return self.steps[-1] if self.steps else Step(Halt())

    @property
    def phase(self) -> Phase:
        return self.machine.phase


# Prefixes that bring a machine to a phase.
START: tuple[Outcome, ...] = (Start(),)
LISTED: tuple[Outcome, ...] = (*START, Listed([pod("a", 5)], "10"))
OPEN: tuple[Outcome, ...] = (*LISTED, Opened())
READING: tuple[Outcome, ...] = (*OPEN, Event("ADDED", pod("b", 11)))
RELISTING: tuple[Outcome, ...] = (*OPEN, Expired(GONE))
LIST_BACKOFF: tuple[Outcome, ...] = (*START, Broken("reset"))
WATCH_BACKOFF: tuple[Outcome, ...] = (*READING, Broken("reset"))
RELIST_BACKOFF: tuple[Outcome, ...] = (*RELISTING, Broken("reset"))
WAITING: tuple[Outcome, ...] = (*READING, Broken("refused", down=True))

Check = Callable[[Rig, Step], None]


def is_(kind: type, **fields: Any) -> Check:
    def check(rig: Rig, step: Step) -> None:
        assert isinstance(step.action, kind), step
        for name, value in fields.items():
            assert getattr(step.action, name) == value, (name, step)

    return check


def sleeps(seconds: float) -> Check:
    def check(rig: Rig, step: Step) -> None:
        assert step.action == Sleep(rig.clock.now + seconds)

    return check


# (id, prefix, outcome, phase after, check of the step)
CASES: list[tuple[str, tuple[Outcome, ...], Outcome, Phase, Check]] = [
    ("start lists", (), Start(), Phase.LISTING, is_(OpenList, relist=False)),
    (
        "listed watches",
        START,
        Listed([], "10"),
        Phase.WATCHING,
        is_(OpenWatch, resource_version="10"),
    ),
    ("first list refused fails", START, Refused(403, b"{}"), Phase.FAILED, is_(Fail)),
    (
        "first list 429 fails too",
        START,
        Refused(429, b"{}", retry_after=2),
        Phase.FAILED,
        is_(Fail),
    ),
    (
        "a first list the cache cannot hold fails",
        START,
        Unshareable(NotShared.CACHE_FULL),
        Phase.FAILED,
        is_(Fail, of_list=True),
    ),
    ("first list broken backs off", START, Broken("reset"), Phase.BACKING_OFF, sleeps(0.8)),
    (
        "first list, upstream down",
        START,
        Broken("x", down=True),
        Phase.WAITING,
        is_(WaitForUpstream),
    ),
    ("opened reads on", LISTED, Opened(), Phase.WATCHING, is_(ReadOn, deadline=1005 + SILENCE)),
    ("event publishes", OPEN, Event("ADDED", pod("b", 11)), Phase.WATCHING, is_(ReadOn)),
    ("bookmark publishes", OPEN, Bookmark("12"), Phase.WATCHING, is_(ReadOn)),
    ("unreadable event", OPEN, Event("ADDED", {"metadata": {}}), Phase.BACKING_OFF, sleeps(0.8)),
    ("unreadable bookmark", OPEN, Bookmark("x1"), Phase.BACKING_OFF, sleeps(0.8)),
    ("silent resumes", READING, Silent(), Phase.WATCHING, is_(OpenWatch, resource_version="11")),
    ("ended resumes", READING, Ended(), Phase.WATCHING, is_(OpenWatch, resource_version="11")),
    ("quick empty end backs off", OPEN, Ended(), Phase.BACKING_OFF, sleeps(0.8)),
    ("410 relists", READING, Expired(GONE), Phase.RELISTING, is_(OpenList, relist=True)),
    ("429 waits Retry-After", READING, Refused(429, retry_after=3), Phase.BACKING_OFF, sleeps(3)),
    ("500 backs off", READING, Refused(500), Phase.BACKING_OFF, sleeps(0.8)),
    ("a watch the account may not make fails", READING, Refused(403), Phase.FAILED, is_(Fail)),
    ("a resource gone mid-life fails", READING, Refused(404), Phase.FAILED, is_(Fail)),
    ("watch broken backs off", READING, Broken("reset"), Phase.BACKING_OFF, sleeps(0.8)),
    (
        "watch broken, down",
        READING,
        Broken("reset", down=True),
        Phase.WAITING,
        is_(WaitForUpstream),
    ),
    (
        "relisted watches",
        RELISTING,
        Listed([], "20"),
        Phase.WATCHING,
        is_(OpenWatch, resource_version="20"),
    ),
    ("relist refused", RELISTING, Refused(500), Phase.BACKING_OFF, sleeps(0.8)),
    ("relist 429", RELISTING, Refused(429, retry_after=5), Phase.BACKING_OFF, sleeps(5)),
    (
        "a relist in an encoding the kind lacks backs off",
        RELISTING,
        Unshareable(NotShared.UNENCODABLE),
        Phase.BACKING_OFF,
        sleeps(0.8),
    ),
    ("relist broken", RELISTING, Broken("reset"), Phase.BACKING_OFF, sleeps(0.8)),
    ("relist broken, down", RELISTING, Broken("x", down=True), Phase.WAITING, is_(WaitForUpstream)),
    ("retry the first list", LIST_BACKOFF, Elapsed(), Phase.LISTING, is_(OpenList, relist=False)),
    (
        "retry the watch",
        WATCH_BACKOFF,
        Elapsed(),
        Phase.WATCHING,
        is_(OpenWatch, resource_version="11"),
    ),
    ("retry the relist", RELIST_BACKOFF, Elapsed(), Phase.RELISTING, is_(OpenList, relist=True)),
    (
        "down when the wait ends",
        WATCH_BACKOFF,
        Elapsed(down=True),
        Phase.WAITING,
        is_(WaitForUpstream),
    ),
    ("upstream back", WAITING, UpstreamBack(), Phase.BACKING_OFF, is_(Sleep)),
]


@pytest.mark.parametrize(
    ("prefix", "outcome", "phase", "check"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_transition(
    prefix: tuple[Outcome, ...], outcome: Outcome, phase: Phase, check: Check
) -> None:
    rig = Rig()
    rig.feed(*prefix)
    rig.clock.now += 0.5 if isinstance(outcome, Ended) and prefix == OPEN else 5.0
    step = rig.feed(outcome)
    assert rig.phase is phase
    check(rig, step)


STOP_FROM = {
    Phase.IDLE: (),
    Phase.LISTING: START,
    Phase.WATCHING: READING,
    Phase.RELISTING: RELISTING,
    Phase.BACKING_OFF: WATCH_BACKOFF,
    Phase.WAITING: WAITING,
    Phase.FAILED: (*START, Refused(403)),
}


@pytest.mark.parametrize("phase", list(STOP_FROM), ids=lambda p: p.value)
def test_every_phase_stops_and_then_does_nothing(phase: Phase) -> None:
    rig = Rig()
    rig.feed(*STOP_FROM[phase])
    assert rig.phase is phase
    assert rig.feed(Stop()).action == Halt()
    assert rig.phase is Phase.STOPPED and not rig.machine.in_flight
    assert rig.feed(Event("ADDED", pod("x", 99))).action == Halt()


def taken(rig: Rig) -> set[int]:
    return {index for index, count in enumerate(rig.machine.counters.moves) if count}


def test_every_transition_of_the_table_is_exercised() -> None:
    seen: set[int] = set()
    for _name, prefix, outcome, _phase, _check in CASES:
        rig = Rig()
        rig.feed(*prefix, outcome)
        seen |= taken(rig)
    for prefix in STOP_FROM.values():
        rig = Rig()
        rig.feed(*prefix, Stop())
        seen |= taken(rig)
    rig = Rig()  # the backfill refused by the apiserver
    rig.machine.want("7")
    rig.feed(*START, Listed([], "10"), Opened(), Expired(GONE))
    seen |= taken(rig)
    assert [TRANSITIONS[i].label for i in set(range(len(TRANSITIONS))) - seen] == []


def test_each_step_names_the_row_it_took() -> None:
    rig = Rig()
    for outcome in (*READING, Broken("reset"), Elapsed()):
        before = rig.phase
        step = rig.feed(outcome)
        assert step.move is not None and step.move in TRANSITIONS
        assert (step.move.source, step.move.outcome, step.move.target) == (
            before,
            type(outcome),
            rig.phase,
        )
    assert [m.label for m in TRANSITIONS if m.logged and m.source is Phase.WATCHING] == [
        "watching --Event--> backing-off",
        "watching --Bookmark--> backing-off",
        "watching --Silent--> watching",
        "watching --Ended--> backing-off",
        "watching --Expired--> relisting",
        "watching --Refused--> backing-off",
        "watching --Broken--> backing-off",
        "watching --Broken--> waiting-for-upstream",
    ]


def test_a_move_the_table_does_not_list_is_refused() -> None:
    rig = Rig()
    with pytest.raises(IllegalTransition):
        rig.feed(Listed([], "10"))  # before Start
    rig = Rig()
    rig.feed(*READING)
    with pytest.raises(IllegalTransition):
        rig.feed(UpstreamBack())  # only a waiting machine waits for the upstream


def test_at_most_one_request_in_flight() -> None:
    rig = Rig()
    assert not rig.machine.in_flight
    rig.feed(Start())
    assert rig.machine.in_flight  # the LIST
    rig.feed(Listed([], "10"))
    assert rig.machine.in_flight  # the WATCH
    rig.feed(Opened(), Event("ADDED", pod("b", 11)))
    assert rig.machine.in_flight  # still reading it
    rig.feed(Broken("reset"))
    assert not rig.machine.in_flight  # backing off: nothing open upstream


def test_a_429_repeats_the_same_request_and_does_not_relist() -> None:
    rig = Rig()
    rig.feed(*READING, Refused(429, retry_after=3))
    rig.clock.now += 3
    step = rig.feed(Elapsed())
    assert step.action == OpenWatch("11", step.action.timeout_seconds)  # type: ignore[union-attr]
    assert rig.machine.counters.relists == 0


def test_a_clean_end_after_events_resets_nothing_but_resumes_at_once() -> None:
    rig = Rig()
    rig.feed(*READING)
    rig.clock.now += 400
    step = rig.feed(Ended())
    assert isinstance(step.action, OpenWatch) and step.action.resource_version == "11"
    assert 300 <= step.action.timeout_seconds < 600


def test_events_and_bookmarks_move_the_silence_deadline() -> None:
    rig = Rig()
    rig.feed(*OPEN)
    rig.clock.now += 100
    step = rig.feed(Bookmark("15"))
    assert step.action == ReadOn(1100 + SILENCE) and step.publish
    assert step.move is not None and step.move.label == "watching --Bookmark--> watching"
    rig.clock.now += 100
    step = rig.feed(Event("MODIFIED", pod("a", 16)))
    assert step.action == ReadOn(1200 + SILENCE) and step.publish


def test_upstream_back_resets_the_backoff_and_spreads_over_the_recovery_window() -> None:
    delays = []
    for seed in range(50):
        rig = Rig()
        rig.machine.rng = random.Random(seed)
        rig.feed(*READING)
        for _ in range(5):  # the back-off grows while the upstream flaps
            rig.feed(Broken("reset"))
            rig.clock.now += 60
            rig.feed(Elapsed(), Opened())
        rig.feed(Broken("refused", down=True))
        step = rig.feed(UpstreamBack())
        assert isinstance(step.action, Sleep)
        delays.append(step.action.until - rig.clock.now)
        assert rig.machine.backoff.attempt == 0
    assert all(0 <= d < 1.0 for d in delays)
    assert max(delays) - min(delays) > 0.5  # spread, not one instant


def test_want_starts_the_history_at_the_oldest_rv_a_client_needs() -> None:
    rig = Rig()
    assert rig.machine.want("9")
    rig.feed(Start())
    assert rig.machine.want("7") and rig.machine.want("8")  # still listing: the oldest wins
    step = rig.feed(Listed([pod("a", 5)], "10"))
    assert step.action == OpenWatch("7", step.action.timeout_seconds)  # type: ignore[union-attr]
    assert rig.cache.backfilling and rig.cache.resource_version == 10
    assert not rig.machine.want("3")  # too late: the watch is open


def test_backfill_events_fill_history_without_touching_state() -> None:
    rig = Rig()
    rig.machine.want("7")
    rig.feed(Start(), Listed([pod("a", 9)], "10"), Opened())
    rig.feed(Event("MODIFIED", pod("a", 8)))  # before the list: history only
    assert rig.cache.backfilling and rig.cache.stream_resource_version == 8
    rig.feed(Event("MODIFIED", pod("a", 9)), Bookmark("10"))
    assert not rig.cache.backfilling
    assert [
        json.loads(e.line)["object"]["metadata"]["resourceVersion"]
        for e in rig.cache.events_from(0) or []
    ] == ["8", "9"]


def test_a_refused_backfill_cuts_its_subscribers_with_the_apiservers_410() -> None:
    rig = Rig()
    rig.machine.want("7")
    rig.feed(Start(), Listed([pod("a", 9)], "10"), Opened())
    early = rig.cache.plan("7")
    late = rig.cache.plan(None)
    step = rig.feed(Expired(GONE))
    assert step.publish and step.action == OpenWatch("10", step.action.timeout_seconds)  # type: ignore[union-attr]
    assert rig.phase is Phase.WATCHING and rig.machine.counters.relists == 0
    assert rig.cache.events_from(early.next_seq, early.start_rv) is None
    assert rig.cache.cut_line(early.next_seq, early.start_rv) == GONE
    assert rig.cache.events_from(late.next_seq, late.start_rv) == []
    assert rig.cache.plan("8").outside_window


def test_a_relist_that_went_back_in_time_resets_the_cache() -> None:
    rig = Rig()
    rig.feed(*READING, Expired(GONE))
    step = rig.feed(Listed([pod("a", 3)], "9"))
    assert isinstance(step.action, OpenWatch) and step.action.resource_version == "9"
    assert rig.cache.resource_version == 9


def test_mermaid_diagram_lists_every_phase_and_move() -> None:
    text = mermaid()
    assert text.startswith("stateDiagram-v2\n")
    for phase in Phase:
        assert f'state "{phase.value}" as {phase.name.lower()}' in text
    for move in TRANSITIONS:
        if move.outcome is not Stop:
            a, b, outcome = move.source, move.target, move.outcome.__name__
            assert f"{a.name.lower()} --> {b.name.lower()}: {outcome}" in text
    assert "idle --> stopped: Stop" in text
