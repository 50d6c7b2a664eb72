"""Random upstream histories through the shared-watch machine and its cache (hypothesis).

A model apiserver (one resource, a global resourceVersion, a compactable history) answers the
machine's actions with random outcomes — events, bookmarks, in-stream and HTTP 410s, 429s,
resets, silences, clean ends, outages — while subscribers join at random points (fresh, from
an RV they saw, from the apiserver's current RV, before the first list) and read at random
speeds. Invariants: no subscriber ever gets an event twice or an RV that goes backwards; each
one that reads to the end while the machine is caught up holds the apiserver's state; never
more than one upstream request in flight.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event as note_event
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from watchproxy.config import HubConfig
from watchproxy.hub.cachetypes import StartPlan
from watchproxy.hub.machine import MachineConfig, SharedWatchMachine, Step
from watchproxy.hub.outcomes import (
    Bookmark,
    Broken,
    Elapsed,
    Ended,
    Event,
    Expired,
    Listed,
    Opened,
    OpenList,
    OpenWatch,
    ReadOn,
    Refused,
    Silent,
    Sleep,
    Start,
    UpstreamBack,
    WaitForUpstream,
)
from watchproxy.hub.transitions import Phase
from watchproxy.hub.watchcache import WatchCache
from watchproxy.kube.representation import JsonRepresentation
from watchproxy.policy.backoff import Backoff, BackoffPolicy

NAMES = ("a", "b", "c", "d")
GONE = b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}\n'


def pod(name: str, rv: int, version: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}, "v": version}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)  # two clients with the same state are still two clients
class Client:
    plan: StartPlan
    state: dict[str, int]  # name -> version
    last_rv: int
    cursor: int
    seen: set[int] = field(default_factory=set)


class SharedWatchHistories(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.cache = WatchCache(JsonRepresentation(), capacity=8, max_age=1e9, clock=self.clock)
        policy = BackoffPolicy(initial=0.8, cap=30.0)
        self.machine = SharedWatchMachine(
            self.cache,
            Backoff(policy, random.Random(0), self.clock),
            clock=self.clock,
            rng=random.Random(0),
            config=MachineConfig.of(HubConfig(upstream_silence_seconds=120.0), policy),
        )
        # the model apiserver
        self.rv = 100
        self.truth: dict[str, tuple[int, int]] = {}  # name -> (rv, version)
        self.changes: list[tuple[int, str, str, int]] = []  # (rv, type, name, version)
        self.horizon = 100  # watches from below this RV are 410
        self.version = 0
        self.down = False
        # the open upstream watch, if any: next change index to deliver
        self.stream_from: int | None = None
        self.stream_next = 0
        self.step: Step = self.machine.handle(Start())
        self.requests_open = 1
        self.clients: list[Client] = []
        self.pending: list[tuple[str | None, dict[str, int], int]] = []  # joined before sync
        self.views: list[tuple[int, dict[str, int]]] = [(100, {})]  # (rv, state) seen by clients

    @initialize(data=st.data(), writes=st.integers(0, 4), early=st.integers(0, 3))
    def start_most_runs_streaming(self, data: st.DataObject, writes: int, early: int) -> None:
        """Most runs get past the first list: some writes, clients that come before it."""
        for i in range(writes):
            self.write(NAMES[i % len(NAMES)], False)
        for _ in range(early):
            self.join(data, "seen")
        if data.draw(st.booleans()):
            self.answer_list("ok")
            if isinstance(self.step.action, OpenWatch):
                self.answer_watch("ok")

    # ---- the apiserver ------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES), delete=st.booleans())
    def write(self, name: str, delete: bool) -> None:
        self.rv += 1
        self.version += 1
        if name in self.truth and delete:
            self.changes.append((self.rv, "DELETED", name, self.truth.pop(name)[1]))
        else:
            kind = "MODIFIED" if name in self.truth else "ADDED"
            self.truth[name] = (self.rv, self.version)
            self.changes.append((self.rv, kind, name, self.version))
        self.views.append((self.rv, {n: v for n, (_, v) in self.truth.items()}))

    @rule()
    def other_resource_written(self) -> None:
        self.rv += 1

    @rule()
    def compact(self) -> None:
        self.horizon = self.rv

    @rule(down=st.booleans())
    def outage(self, down: bool) -> None:
        self.down = down

    # ---- answering the machine ------------------------------------------------------------

    def feed(self, outcome: Any) -> None:
        before = self.step.action
        self.step = self.machine.handle(outcome)
        action = self.step.action
        # The model's own count: a request ends with any answer but "opened" and events.
        if isinstance(before, OpenList | OpenWatch | ReadOn) and not isinstance(action, ReadOn):
            self.requests_open -= 1
        if isinstance(action, OpenList | OpenWatch):
            self.requests_open += 1
        if self.pending and self.cache.synced:
            for rv, state, last in self.pending:
                self.join_planned(self.cache.plan(rv), state, last)
            self.pending = []

    @precondition(lambda self: isinstance(self.step.action, OpenList))
    @rule(answer=st.sampled_from(["ok", "ok", "429", "500", "reset"]))
    def answer_list(self, answer: str) -> None:
        relist = self.step.action.relist  # type: ignore[union-attr]
        if self.down or answer == "reset":
            self.feed(Broken("reset", down=self.down))
        elif answer != "ok" and relist:  # (a refused first list ends the key: unit-tested)
            self.feed(Refused(int(answer), retry_after=1.0))
        else:
            items = [pod(n, rv, v) for n, (rv, v) in self.truth.items()]
            self.feed(Listed(items, str(self.rv)))

    @precondition(lambda self: isinstance(self.step.action, OpenWatch))
    @rule(answer=st.sampled_from(["ok", "ok", "ok", "410", "429", "reset"]))
    def answer_watch(self, answer: str) -> None:
        start = int(self.step.action.resource_version)  # type: ignore[union-attr]
        if self.down or answer == "reset":
            self.feed(Broken("reset", down=self.down))
        elif answer == "410" or start < self.horizon:
            self.feed(Expired(GONE))
        elif answer == "429":
            self.feed(Refused(429, retry_after=2.0))
        else:
            self.stream_from = start
            self.stream_next = next(
                (i for i, c in enumerate(self.changes) if c[0] > start), len(self.changes)
            )
            self.feed(Opened())

    @precondition(lambda self: isinstance(self.step.action, ReadOn))
    @rule(what=st.sampled_from(["event", "event", "event", "bookmark", "end", "silent", "cut"]))
    def stream(self, what: str) -> None:
        if what == "event" and self.stream_next < len(self.changes):
            rv, kind, name, version = self.changes[self.stream_next]
            self.stream_next += 1
            self.feed(Event(kind, pod(name, rv, version)))
        elif what == "bookmark":
            # the apiserver's bookmark: everything up to it has been sent
            sent = self.changes[self.stream_next - 1][0] if self.stream_next else 0
            done = self.stream_next == len(self.changes)
            self.feed(Bookmark(str(self.rv if done else max(sent, self.stream_from or 0))))
        elif what == "end":
            self.clock.now += 400
            self.feed(Ended())
        elif what == "silent":
            self.clock.now += 121
            self.feed(Silent())
        elif what == "cut":
            self.feed(Broken("reset", down=self.down))

    @precondition(lambda self: isinstance(self.step.action, ReadOn))
    @rule()
    def catch_up(self) -> None:
        """The apiserver sends everything it has, then a bookmark."""
        while self.stream_next < len(self.changes) and isinstance(self.step.action, ReadOn):
            rv, kind, name, version = self.changes[self.stream_next]
            self.stream_next += 1
            self.feed(Event(kind, pod(name, rv, version)))
        if isinstance(self.step.action, ReadOn):
            self.feed(Bookmark(str(self.rv)))

    @precondition(lambda self: isinstance(self.step.action, Sleep))
    @rule()
    def wake(self) -> None:
        self.clock.now = max(self.clock.now, self.step.action.until)  # type: ignore[union-attr]
        self.feed(Elapsed(down=self.down))

    @precondition(lambda self: isinstance(self.step.action, WaitForUpstream) and not self.down)
    @rule()
    def upstream_back(self) -> None:
        self.feed(UpstreamBack())

    # ---- clients ------------------------------------------------------------------------

    def join_planned(self, plan: StartPlan, state: dict[str, int], last: int) -> None:
        if plan.outside_window or plan.expired:
            return  # passed through to the apiserver, or told to relist: not the hub's stream
        if plan.initial:
            state = {}
            for line in plan.initial:
                obj = json.loads(line)["object"]
                state[obj["metadata"]["name"]] = obj["v"]
            last = int(plan.initial_rv or 0)
        self.clients.append(Client(plan, dict(state), last, plan.next_seq))

    @rule(data=st.data(), how=st.sampled_from(["fresh", "seen", "current"]))
    def join(self, data: st.DataObject, how: str) -> None:
        rv: str | None
        state: dict[str, int]
        if how == "fresh":
            rv, state, last = None, {}, 0
        elif how == "seen":
            last, state = data.draw(st.sampled_from(self.views))
            rv = str(last)
        else:  # its own LIST at the apiserver, then a watch from it
            last, state = self.views[-1]
            rv = str(self.rv)
            last = self.rv
        if not self.cache.synced:
            if rv is not None:
                self.machine.want(rv)
            self.pending.append((rv, dict(state), last))
            return
        self.join_planned(self.cache.plan(rv), dict(state), last)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(self.clients))
        self.read_client(client, data.draw(st.integers(1, 5)))

    def read_client(self, client: Client, limit: int) -> None:
        events = self.cache.events_from(client.cursor, client.plan.start_rv)
        if events is None:
            self.clients.remove(client)  # ended (slow, cut, or a relist jumped over it)
            note_event("a client was ended")
            return
        batch = list(events)[:limit]
        self.deliver(client, batch)
        if batch and len(batch) == len(events) and len(batch) < limit:
            # Read to the end: as the subscriber does, look again. At a backfill cutoff the
            # next look ends the client (it writes the apiserver's 410 and closes), so a
            # client that has read to a cutoff is not a caught-up client.
            self.read_client(client, limit - len(batch))

    def deliver(self, client: Client, batch: list[Any]) -> None:
        for event in batch:
            client.cursor = event.seq + 1
            if not client.plan.wants(event):
                continue
            again = event.relist and event.rv == client.last_rv
            if again:
                note_event("a relist group replayed")
            assert event.seq not in client.seen, "an event delivered twice"
            assert event.rv > client.last_rv or again or event.relist, "an old event"
            assert event.rv >= client.last_rv, "resourceVersion went backwards"
            client.seen.add(event.seq)
            client.last_rv = event.rv
            obj = json.loads(event.line)["object"]
            if event.type == "DELETED":
                client.state.pop(obj["metadata"]["name"], None)
            else:
                client.state[obj["metadata"]["name"]] = obj["v"]

    # ---- invariants -----------------------------------------------------------------------

    @invariant()
    def one_request_at_most(self) -> None:
        assert self.requests_open in (0, 1)
        assert self.machine.in_flight == (self.requests_open == 1)

    @invariant()
    def caught_up_clients_hold_the_truth(self) -> None:
        caught_up = (
            isinstance(self.step.action, ReadOn)
            and self.stream_next == len(self.changes)
            and not self.cache.backfilling
            and self.machine.phase is Phase.WATCHING
        )
        if not caught_up:
            return
        note_event("caught up" + (" with clients" if self.clients else ""))
        truth = {n: v for n, (_, v) in self.truth.items()}
        for client in list(self.clients):
            self.read_client(client, 10**6)
            if client in self.clients:
                assert client.state == truth, "a subscriber lost an event"
                how = "without" if client.plan.initial else "with"
                note_event(f"checked a client that joined {how} an RV")
                self.views.append((client.last_rv, dict(client.state)))


SharedWatchHistories.TestCase.settings = settings(
    max_examples=200, stateful_step_count=80, deadline=None
)
test_shared_watch_histories = SharedWatchHistories.TestCase
