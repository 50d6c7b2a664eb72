"""The pure history + state of one shared watch (watchproxy.hub.watchcache)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchproxy.hub.cachetypes import (
    ADDED,
    DELETED,
    MODIFIED,
    CachedEvent,
    ListRegressed,
    NotSynced,
    StartPlan,
    parse_rv,
)
from watchproxy.hub.watchcache import WatchCache
from watchproxy.kube.negotiation import representation_for
from watchproxy.kube.representation import (
    INITIAL_EVENTS_END_ANNOTATION,
    JsonRepresentation,
)
from watchproxy.kube.tables import TableRepresentation

Obj = dict[str, Any]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, rv: int | str, data: Any = 0, namespace: str = "ns") -> Obj:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)},
        "spec": {"data": data},
    }


def make_cache(
    *, capacity: int = 100, max_age: float = 1e9, clock: FakeClock | None = None
) -> WatchCache:
    return WatchCache(
        JsonRepresentation(), capacity=capacity, max_age=max_age, clock=clock or FakeClock()
    )


def decode(line: bytes) -> tuple[str, Obj]:
    event = json.loads(line)
    return event["type"], event["object"]


def keyed(objects: list[Obj]) -> dict[str, Obj]:
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objects}


def apply_lines(state: dict[str, Obj], lines: list[bytes]) -> None:
    for line in lines:
        event_type, obj = decode(line)
        key = f"{obj['metadata'].get('namespace')}/{obj['metadata'].get('name')}"
        if event_type == DELETED:
            state.pop(key, None)
        elif event_type in (ADDED, MODIFIED):
            state[key] = obj


def synced_cache(**kwargs: Any) -> WatchCache:
    """a@5, b@7 listed at 10; then MODIFIED a@11, ADDED c@12, DELETED b@13 (seqs 0, 1, 2)."""
    cache = make_cache(**kwargs)
    assert cache.replace([pod("a", 5), pod("b", 7)], "10") == []
    cache.apply(MODIFIED, pod("a", 11, 1))
    cache.apply(ADDED, pod("c", 12))
    cache.apply(DELETED, pod("b", 13))
    return cache


# --- sync and basic properties ------------------------------------------------------------


def test_first_replace_syncs_silently() -> None:
    cache = make_cache()
    assert not cache.synced
    assert cache.resource_version is None and cache.oldest_resumable_rv is None
    assert cache.replace([pod("a", 5), pod("b", 7)], "10") == []
    assert cache.synced
    assert (cache.resource_version, cache.resource_version_str) == (10, "10")
    assert cache.oldest_resumable_rv == 10
    assert len(cache) == 2 and cache.history_len() == 0
    assert cache.next_seq == cache.oldest_seq == 0


def test_everything_before_sync_is_refused() -> None:
    cache = make_cache()
    with pytest.raises(NotSynced):
        cache.apply(ADDED, pod("a", 1))
    with pytest.raises(NotSynced):
        cache.plan(None)
    with pytest.raises(NotSynced):
        cache.bookmark("3")
    with pytest.raises(NotSynced):
        cache.bookmark_line()


def test_resource_version_keeps_upstream_spelling() -> None:
    cache = make_cache()
    cache.replace([], "0010")
    assert (cache.resource_version, cache.resource_version_str) == (10, "0010")
    cache.bookmark("00012")
    assert cache.resource_version_str == "00012"
    assert b'"resourceVersion":"00012"' in cache.bookmark_line()


@pytest.mark.parametrize("rv", ["", "abc", "-1", "1.5", "١٢"])
def test_non_decimal_resource_versions_are_refused(rv: str) -> None:
    with pytest.raises(ValueError):
        parse_rv(rv)
    with pytest.raises(ValueError):
        make_cache().replace([], rv or "x")


def test_apply_events_update_state_and_history() -> None:
    cache = synced_cache()
    assert cache.next_seq == 3 and cache.oldest_seq == 0 and cache.history_len() == 3
    assert cache.resource_version == 13 and len(cache) == 2
    events = cache.events_from(0)
    assert events is not None
    assert [(e.seq, e.type, e.rv, e.key) for e in events] == [
        (0, MODIFIED, 11, "ns/a"),
        (1, ADDED, 12, "ns/c"),
        (2, DELETED, 13, "ns/b"),
    ]
    assert events[0].line == (
        b'{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":'
        b'{"name":"a","namespace":"ns","resourceVersion":"11"},"spec":{"data":1}}}\n'
    )
    assert keyed(cache.state.objects()) == keyed([pod("a", 11, 1), pod("c", 12)])


def test_upsert_keeps_the_upstream_event_type() -> None:
    cache = make_cache()
    cache.replace([pod("a", 5)], "10")
    added = cache.apply(ADDED, pod("a", 11, 1))
    modified = cache.apply(MODIFIED, pod("z", 12))
    assert added is not None and added.type == ADDED
    assert modified is not None and modified.type == MODIFIED
    assert keyed(cache.state.objects()) == keyed([pod("a", 11, 1), pod("z", 12)])
    with pytest.raises(ValueError):
        cache.apply("BOOKMARK", pod("a", 13))


def test_delete_of_unknown_object_is_passed_through() -> None:
    cache = make_cache()
    cache.replace([], "10")
    event = cache.apply(DELETED, pod("ghost", 11))
    assert event is not None and len(cache) == 0 and cache.resource_version == 11


# --- duplicates ----------------------------------------------------------------------------


def test_events_at_or_below_the_cache_rv_are_ignored() -> None:
    cache = synced_cache()
    for event_type, obj in [
        (MODIFIED, pod("a", 11, 99)),
        (ADDED, pod("x", 12)),
        (DELETED, pod("c", 9)),
        (ADDED, pod("a", 13)),
    ]:
        assert cache.apply(event_type, obj) is None
    assert cache.next_seq == 3 and cache.resource_version == 13
    assert keyed(cache.state.objects()) == keyed([pod("a", 11, 1), pod("c", 12)])


def test_bookmark_raises_the_rv_and_later_events_below_it_are_ignored() -> None:
    cache = synced_cache()
    cache.bookmark("20")
    assert cache.resource_version == 20
    cache.bookmark("15")  # never backwards
    assert cache.resource_version == 20
    assert cache.apply(ADDED, pod("late", 19)) is None
    assert cache.apply(ADDED, pod("new", 21)) is not None


# --- plans ---------------------------------------------------------------------------------

# (rv, send_initial_events, expected initial object names, next_seq, expired, min_rv, wait_rv)
PLAN_CASES: list[tuple[str | None, bool, list[str] | None, int, bool, int, int | None]] = [
    (None, False, ["a", "c"], 3, False, -1, None),
    ("", False, ["a", "c"], 3, False, -1, None),
    ("0", False, ["a", "c"], 3, False, -1, None),
    ("10", False, None, 0, False, -1, None),  # the list RV: replay everything
    ("11", False, None, 1, False, -1, None),
    ("12", False, None, 2, False, -1, None),
    ("13", False, None, 3, False, -1, None),  # up to date
    ("0013", False, None, 3, False, -1, None),
    ("9", False, None, 3, True, -1, None),  # older than the window
    ("1", False, None, 3, True, -1, None),
    ("20", False, None, 3, False, 20, None),  # newer than the cache: skip up to 20
    (None, True, ["a", "c"], 3, False, -1, None),
    ("0", True, ["a", "c"], 3, False, -1, None),
    ("12", True, ["a", "c"], 3, False, -1, None),  # NotOlderThan: current state is newer
    ("13", True, ["a", "c"], 3, False, -1, None),
    ("1", True, ["a", "c"], 3, False, -1, None),  # even below the window
    ("20", True, None, 3, False, 20, 20),  # wait until the cache reaches 20
]


@pytest.mark.parametrize(
    ("rv", "sie", "initial", "next_seq", "expired", "min_rv", "wait_rv"), PLAN_CASES
)
def test_plan(
    rv: str | None,
    sie: bool,
    initial: list[str] | None,
    next_seq: int,
    expired: bool,
    min_rv: int,
    wait_rv: int | None,
) -> None:
    cache = synced_cache()
    plan = cache.plan(rv, send_initial_events=sie)
    assert (plan.next_seq, plan.outside_window, plan.min_rv, plan.wait_rv) == (
        next_seq,
        expired,
        min_rv,
        wait_rv,
    )
    if initial is None:
        assert plan.initial == [] and plan.initial_rv is None
        return
    lines = list(plan.initial)
    if sie:
        event_type, bookmark = decode(lines.pop())
        assert event_type == "BOOKMARK"
        assert bookmark["metadata"] == {
            "resourceVersion": "13",
            "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"},
        }
    assert [decode(line)[0] for line in lines] == [ADDED] * len(initial)
    assert [decode(line)[1]["metadata"]["name"] for line in lines] == initial
    assert plan.initial_rv == "13"


@pytest.mark.parametrize("rv", ["abc", "1e3", "-5", " 12"])
def test_plan_refuses_non_decimal_rv(rv: str) -> None:
    with pytest.raises(ValueError):
        synced_cache().plan(rv)
    with pytest.raises(ValueError):
        synced_cache().plan(rv, send_initial_events=True)


def test_plan_for_rv_newer_than_cache_filters_until_the_cache_catches_up() -> None:
    cache = synced_cache()
    plan = cache.plan("15")
    for rv in (14, 15, 16):
        cache.apply(ADDED, pod(f"p{rv}", rv))
    events = cache.events_from(plan.next_seq)
    assert events is not None
    assert [e.rv for e in events if plan.wants(e)] == [16]


def test_replayed_events_applied_to_the_clients_state_reach_the_current_state() -> None:
    cache = synced_cache()
    state = keyed([pod("a", 5), pod("b", 7)])  # the client listed at 10
    plan = cache.plan("10")
    events = cache.events_from(plan.next_seq)
    assert events is not None
    apply_lines(state, [e.line for e in events])
    assert state == keyed(cache.state.objects())


# --- synthetic ADDED cache -----------------------------------------------------------------


def test_synthetic_added_lines_are_cached_and_invalidated_on_change() -> None:
    cache = synced_cache()
    first = cache.plan(None).initial
    second = cache.plan("0").initial
    assert all(x is y for x, y in zip(first, second, strict=True))  # encoded once
    cache.apply(MODIFIED, pod("a", 14, 2))
    third = cache.plan(None).initial
    by_name = {decode(line)[1]["metadata"]["name"]: line for line in third}
    assert decode(by_name["a"])[1] == pod("a", 14, 2)
    assert by_name["c"] is second[1]  # untouched object keeps its line
    cache.apply(DELETED, pod("c", 15))
    assert [decode(line)[1]["metadata"]["name"] for line in cache.plan(None).initial] == ["a"]


def test_relist_invalidates_changed_synthetic_lines_only() -> None:
    cache = make_cache()
    cache.replace([pod("a", 5), pod("b", 7)], "10")
    before = cache.plan(None).initial
    cache.replace([pod("a", 5), pod("b", 12, 1)], "15")
    after = cache.plan(None).initial
    assert after[0] is before[0]
    assert decode(after[1])[1] == pod("b", 12, 1)


# --- eviction ------------------------------------------------------------------------------


def test_capacity_eviction_raises_the_resumable_rv_and_ends_slow_cursors() -> None:
    cache = synced_cache(capacity=2)
    assert cache.history_len() == 2 and cache.oldest_seq == 1
    assert cache.oldest_resumable_rv == 11  # the newest evicted event
    assert cache.events_from(0) is None  # that cursor was too slow
    assert [e.seq for e in cache.events_from(1) or []] == [1, 2]
    assert cache.events_from(3) == []
    assert cache.plan("10").outside_window
    assert cache.plan("11").next_seq == 1
    assert cache.stats() == {
        "objects": 2,
        "history_events": 2,
        "history_bytes": sum(len(e.line) for e in cache.events_from(1) or []),
        "resource_version": "13",
        "oldest_resumable_rv": 11,
        "oldest_seq": 1,
        "next_seq": 3,
    }


def test_age_eviction_with_a_fake_clock() -> None:
    clock = FakeClock()
    cache = make_cache(clock=clock, max_age=10)
    cache.replace([], "10")
    cache.apply(ADDED, pod("a", 11))
    clock.now += 6
    cache.apply(ADDED, pod("b", 12))
    clock.now += 5  # a is 11 s old, b 5 s
    assert cache.history_len() == 2  # nothing came in: a quiet history is kept
    assert cache.plan("10").next_seq == 0
    cache.apply(ADDED, pod("c", 13))  # the next event takes what is too old with it
    assert cache.oldest_seq == 1 and cache.oldest_resumable_rv == 11
    clock.now += 20
    cache.apply(ADDED, pod("d", 14))
    assert cache.oldest_seq == 3 and cache.history_len() == 1
    assert cache.oldest_resumable_rv == 13
    assert cache.plan("13").next_seq == 3 and cache.plan("12").outside_window
    assert cache.events_from(1) is None


def test_a_history_that_aged_out_stays_resumable_from_its_bookmarks() -> None:
    clock = FakeClock()
    cache = make_cache(clock=clock, max_age=10)
    cache.replace([], "10")
    cache.apply(ADDED, pod("a", 11))
    cache.bookmark("50")
    clock.now += 100
    cache.apply(ADDED, pod("b", 51))  # a goes: 100 s old
    assert cache.history_len() == 1 and cache.oldest_seq == 1
    assert cache.plan("11") == StartPlan(initial=[], next_seq=1, start_rv=11)
    assert cache.plan("30") == StartPlan(initial=[], next_seq=1, start_rv=30)
    assert cache.plan("10").outside_window


def test_a_relist_group_ages_out_like_any_event_and_its_rv_stays_resumable() -> None:
    clock = FakeClock()
    cache = make_cache(clock=clock, max_age=10)
    cache.replace([pod("a", 5), pod("b", 6)], "10")
    cache.replace([], "20")
    clock.now += 100
    added = cache.apply(ADDED, pod("c", 21))  # the group goes: 100 s old
    assert added is not None and cache.history_len() == 1
    # A client at 20 has had the whole group: nothing it lacks was evicted.
    assert cache.plan("20") == StartPlan(initial=[], next_seq=added.seq, start_rv=20)
    assert cache.plan("19").expired  # inside the relist gap


def test_constructor_validates_limits() -> None:
    with pytest.raises(ValueError):
        make_cache(capacity=0)
    with pytest.raises(ValueError):
        make_cache(max_age=0)


def test_long_histories_compact_without_losing_events() -> None:
    cache = make_cache(capacity=10)
    cache.replace([], "1")
    for rv in range(2, 5000):
        cache.apply(ADDED, pod(f"p{rv % 50}", rv))
    events = cache.events_from(cache.oldest_seq)
    assert events is not None and [e.rv for e in events] == list(range(4990, 5000))
    assert cache.plan("4994").next_seq == events[5].seq


# --- relist --------------------------------------------------------------------------------


def relisted_cache() -> tuple[WatchCache, list[CachedEvent]]:
    """a@5 b@7 c@9 listed at 10, d@11 added; relist at 20: a same, b@15, e@12 new, c/d gone."""
    cache = make_cache()
    cache.replace([pod("a", 5), pod("b", 7), pod("c", 9)], "10")
    cache.apply(ADDED, pod("d", 11))
    events = cache.replace([pod("a", 5), pod("b", 15, 1), pod("e", 12)], "20")
    return cache, events


def test_relist_diff_is_ordered_so_rvs_never_go_backwards() -> None:
    cache, events = relisted_cache()
    assert [(e.seq, e.type, e.rv, e.key, e.relist) for e in events] == [
        (1, ADDED, 12, "ns/e", True),
        (2, MODIFIED, 15, "ns/b", True),
        (3, DELETED, 20, "ns/c", True),
        (4, DELETED, 20, "ns/d", True),
    ]
    assert decode(events[0].line) == (ADDED, pod("e", 12))
    assert decode(events[1].line) == (MODIFIED, pod("b", 15, 1))
    # DELETEs carry the last known state, at the list's RV
    assert decode(events[2].line) == (DELETED, pod("c", 20))
    assert decode(events[3].line) == (DELETED, pod("d", 20))
    assert cache.resource_version_str == "20"
    assert keyed(cache.state.objects()) == keyed([pod("a", 5), pod("b", 15, 1), pod("e", 12)])
    assert cache.events_from(0) is not None  # subscribers keep their streams


def test_relist_without_changes_appends_nothing() -> None:
    cache = make_cache()
    cache.replace([pod("a", 5)], "10")
    assert cache.replace([pod("a", 5)], "30") == []
    assert cache.resource_version == 30 and cache.next_seq == 0


def test_upstream_events_covered_by_a_relist_are_ignored() -> None:
    cache, _ = relisted_cache()
    assert cache.apply(DELETED, pod("c", 18)) is None  # the real DELETE, seen late
    assert cache.apply(MODIFIED, pod("b", 15, 1)) is None
    assert cache.apply(ADDED, pod("f", 21)) is not None


def test_resume_at_a_relist_list_rv_gets_only_what_came_after_the_group() -> None:
    cache, events = relisted_cache()
    # A client holding 20 has had the whole group (the hub never ends a stream inside one
    # without a 410): replaying it would duplicate it on every re-watch at 20.
    assert cache.plan("20") == StartPlan(initial=[], next_seq=cache.next_seq, start_rv=20)
    assert cache.plan("11").next_seq == events[0].seq  # from before the relist: all of it
    added = cache.apply(ADDED, pod("f", 21))
    assert added is not None
    assert cache.plan("20").next_seq == added.seq
    assert cache.plan("21").next_seq == cache.next_seq


def test_only_the_last_event_of_a_relist_group_ends_it() -> None:
    _, events = relisted_cache()
    assert [e.inside_group for e in events] == [True, True, True, False]
    assert [e.ends_group for e in events] == [False, False, False, True]


def test_evicting_a_relist_delete_makes_rvs_before_it_unresumable() -> None:
    cache = make_cache(capacity=3)
    cache.replace([pod("a", 5), pod("b", 6), pod("c", 7)], "10")
    cache.replace([], "20")  # three DELETEs at 20
    added = cache.apply(ADDED, pod("x", 21))  # evicts DELETE a
    assert added is not None
    assert cache.oldest_resumable_rv == 20
    assert cache.plan("19").expired  # inside the relist gap
    assert cache.plan("20").next_seq == added.seq  # a client at 20 has the whole group
    cache.apply(ADDED, pod("y", 22))
    cache.apply(ADDED, pod("z", 23))  # the whole group is gone
    assert cache.plan("19").expired and cache.plan("20").next_seq == added.seq
    assert cache.plan("21").next_seq == added.seq + 1


def test_relist_events_below_the_list_rv_are_replayed_at_their_rv() -> None:
    cache = make_cache()
    cache.replace([pod("a", 5)], "10")
    events = cache.replace([pod("a", 8, 1), pod("b", 20)], "30")
    # a@8 is below the cache RV 10, so it is placed at 10: a client that was at 10 before
    # the relist has not had it, and 10 is not a list RV, so a resume at 10 gets it.
    assert cache.plan("10").next_seq == events[0].seq
    assert cache.plan("30").next_seq == cache.next_seq


def test_relist_with_older_rv_is_refused_and_reset_ends_every_cursor() -> None:
    cache = synced_cache()
    with pytest.raises(ListRegressed):
        cache.replace([pod("a", 3)], "12")
    caught_up = cache.next_seq
    cache.reset([pod("a", 3)], "12")
    assert cache.events_from(caught_up) is None and cache.events_from(0) is None
    assert cache.resource_version == 12 and cache.oldest_resumable_rv == 12
    assert keyed(cache.state.objects()) == keyed([pod("a", 3)])
    assert cache.plan("11").outside_window
    assert cache.plan("12") == StartPlan(initial=[], next_seq=cache.next_seq, start_rv=12)


def test_rv_inside_a_relist_gap_is_expired() -> None:
    cache, _ = relisted_cache()  # relist from 11 to 20; e@12 and b@15 inside
    for rv in ("12", "15", "19"):
        assert cache.plan(rv).expired and not cache.plan(rv).outside_window
    assert not cache.plan("11").expired and not cache.plan("20").expired


def test_subscriber_ahead_of_the_cache_is_ended_when_a_relist_jumps_over_it() -> None:
    cache = make_cache()
    cache.replace([pod("a", 5)], "10")
    # the upstream watch broke at 10; a client LISTed directly at 13 and saw ghost@12
    plan = cache.plan("13")
    assert plan.min_rv == 13
    cache.replace([pod("a", 5)], "15")  # ghost was deleted at 14: nothing to diff
    assert cache.events_from(plan.next_seq, plan.min_rv) is None
    assert cache.plan("13").expired  # and its re-watch is told to relist
    inside, beyond = cache.plan("16"), cache.plan("18")
    cache.replace([pod("a", 5)], "17")
    assert cache.events_from(inside.next_seq, inside.min_rv) is None
    assert cache.events_from(beyond.next_seq, beyond.min_rv) == []  # 18 is past the gap
    plain = cache.plan("15")
    assert cache.events_from(plain.next_seq, plain.min_rv) == []


def test_relist_anomaly_below_the_cache_rv_keeps_history_monotonic() -> None:
    cache = make_cache()
    cache.replace([pod("a", 5)], "10")
    events = cache.replace([pod("a", 8, 1), pod("b", 20)], "30")
    assert [e.rv for e in events] == [10, 20]  # a@8 would go back in time
    assert decode(events[0].line)[1] == pod("a", 8, 1)  # the object keeps its real RV


# --- lines ---------------------------------------------------------------------------------


def test_bookmark_and_expired_lines() -> None:
    cache = synced_cache(capacity=2)
    assert cache.bookmark_line() == (
        b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1",'
        b'"metadata":{"resourceVersion":"13"}}}\n'
    )
    assert cache.bookmark_line() is cache.bookmark_line()
    event_type, obj = decode(cache.bookmark_line(initial_events_end=True))
    assert event_type == "BOOKMARK"
    assert obj["metadata"]["annotations"] == {INITIAL_EVENTS_END_ANNOTATION: "true"}
    assert decode(cache.expired_line("5")) == (
        "ERROR",
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version: 5 (11)",
            "reason": "Expired",
            "code": 410,
        },
    )


def test_table_watch_through_the_cache() -> None:
    rep = representation_for("application/json;as=Table;g=meta.k8s.io;v=v1", None)
    assert isinstance(rep, TableRepresentation)
    cache = WatchCache(rep, capacity=10, max_age=100, clock=FakeClock())
    columns = [
        {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}
    ]

    def row(name: str, rv: int) -> Obj:
        return {
            "cells": [name],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
            },
        }

    items, rv = rep.list_items(
        {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "10"},
            "columnDefinitions": columns,
            "rows": [row("a", 5), row("b", 6)],
        }
    )
    cache.replace(items, rv)
    upstream = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "11"},
        "columnDefinitions": columns,
        "rows": [row("a", 11)],
    }
    event = cache.apply(MODIFIED, upstream)
    assert event is not None and event.key == "ns/a" and event.rv == 11
    assert b'"columnDefinitions":null' in event.line  # stored once, without the columns
    late = cache.plan("10")
    first = rep.first_line_fixup((cache.events_from(late.next_seq) or [event])[0].line)
    assert json.loads(first)["object"]["columnDefinitions"] == columns
    initial = cache.plan(None).initial
    assert b'"columnDefinitions":null' in initial[1]
    assert json.loads(rep.first_line_fixup(initial[0]))["object"]["columnDefinitions"] == columns
    relist = cache.replace([], "20")
    deleted = [json.loads(e.line)["object"] for e in relist]
    assert [rep.object_rv(o) for o in deleted] == ["20", "20"]
    assert [o["metadata"]["resourceVersion"] for o in deleted] == ["20", "20"]


# --- the property --------------------------------------------------------------------------

KEYS = [f"k{i}" for i in range(6)]


class Subscriber:
    def __init__(
        self, plan: StartPlan, state: dict[str, Obj], rv: int | None, after_seq: int | None
    ) -> None:
        self.plan = plan
        self.state = state
        self.rv = rv  # the RV it asked for (None: initial state)
        self.after_seq = after_seq  # the last seq it had seen (None: none)


@settings(max_examples=250, deadline=None)
@given(data=st.data())
def test_every_subscriber_reaches_the_current_state(data: st.DataObject) -> None:
    capacity = data.draw(st.integers(1, 12), label="capacity")
    max_age = data.draw(st.sampled_from([5.0, 50.0, 1e9]), label="max_age")
    clock = FakeClock()
    cache = make_cache(capacity=capacity, max_age=max_age, clock=clock)
    truth: dict[str, Obj] = {}
    etcd_rv = 100
    version = 0
    watching = True  # False: the upstream watch broke, events are lost until a relist
    upstream_events: list[tuple[str, Obj]] = []
    mirror: dict[str, Obj] = {}  # a subscriber that followed from the start
    # (rv string, state, last seq) at every point a client could have stopped
    checkpoints: list[tuple[str, dict[str, Obj], int]] = []
    subscribers: list[Subscriber] = []
    gaps: list[tuple[int, int]] = []  # (cache RV, list RV) of every relist
    last_rv = -1

    def record(events: list[CachedEvent]) -> None:
        nonlocal last_rv
        for event in events:
            assert event.rv >= last_rv  # history never goes back in time
            last_rv = event.rv
            apply_lines(mirror, [event.line])
            obj = decode(event.line)[1]
            if event.inside_group:
                # The hub never ends a stream here (the subscriber finishes the group or ends
                # with a 410), so no client resumes from inside a relist group: only a client
                # that broke its own stream there could, and the hub counts those
                # (watchproxy_watch_relist_group_cuts_total).
                continue
            checkpoints.append((obj["metadata"]["resourceVersion"], dict(mirror), event.seq))

    cache.replace([], str(etcd_rv))
    checkpoints.append((str(etcd_rv), {}, -1))

    ops = st.sampled_from(
        ["write"] * 6 + ["skip", "bookmark", "break", "relist", "dup", "tick", "join"]
    )
    for _ in range(data.draw(st.integers(0, 60), label="steps")):
        op = data.draw(ops)
        if op == "write":
            key = data.draw(st.sampled_from(KEYS))
            etcd_rv += 1
            version += 1
            if key in truth and data.draw(st.booleans()):
                event_type, obj = DELETED, pod(key, etcd_rv, truth.pop(key)["spec"]["data"])
            else:
                event_type = MODIFIED if key in truth else ADDED
                obj = truth[key] = pod(key, etcd_rv, version)
            if watching:
                upstream_events.append((event_type, obj))
                event = cache.apply(event_type, obj)
                assert event is not None
                record([event])
        elif op == "skip":
            etcd_rv += data.draw(st.integers(1, 3))  # writes to other resources
        elif op == "bookmark" and watching:
            cache.bookmark(str(etcd_rv))
            checkpoints.append((str(etcd_rv), dict(mirror), cache.next_seq - 1))
        elif op == "break":
            watching = False
        elif op == "relist":
            gaps.append((cache.resource_version or 0, etcd_rv))
            record(cache.replace(list(truth.values()), str(etcd_rv)))
            checkpoints.append((str(etcd_rv), dict(mirror), cache.next_seq - 1))
            watching = True
        elif op == "dup" and upstream_events:
            event_type, obj = data.draw(st.sampled_from(upstream_events))
            assert cache.apply(event_type, obj) is None
        elif op == "tick":
            clock.now += data.draw(st.sampled_from([1.0, 10.0, 100.0]))  # the next event evicts
        elif op == "join":
            mode = data.draw(st.sampled_from(["fresh", "zero", "point", "ahead", "sie"]))
            if mode in ("fresh", "zero", "sie"):
                rv_arg = {"fresh": None, "zero": "0", "sie": None}[mode]
                plan = cache.plan(rv_arg, send_initial_events=mode == "sie")
                subscribers.append(Subscriber(plan, {}, None, None))
            elif mode == "point":
                rv_str, state, seq = data.draw(st.sampled_from(checkpoints))
                plan = cache.plan(rv_str)
                rv = int(rv_str)
                if plan.outside_window:
                    assert rv < (cache.oldest_resumable_rv or 0)
                elif plan.expired:  # inside a relist gap, or at a relist group partly evicted
                    assert any(before < rv < after for before, after in gaps) or rv in {
                        after for _, after in gaps
                    }
                else:
                    subscribers.append(Subscriber(plan, dict(state), int(rv_str), seq))
            else:  # the client did its own consistent LIST upstream
                plan = cache.plan(str(etcd_rv))
                if plan.expired:  # only just after evicting part of a relist group at etcd_rv
                    assert etcd_rv in {after for _, after in gaps}
                    continue
                assert not plan.outside_window
                subscribers.append(Subscriber(plan, keyed(list(truth.values())), etcd_rv, None))
        assert mirror == keyed(cache.state.objects())
        assert cache.history_len() <= capacity

    # let the cache catch up with the truth
    record(cache.replace(list(truth.values()), str(etcd_rv)))
    assert keyed(cache.state.objects()) == keyed(list(truth.values()))

    for sub in subscribers:
        events = cache.events_from(sub.plan.next_seq, sub.plan.start_rv)
        if events is None:
            continue  # evicted (too slow), or a relist jumped over it: it is ended
        lines = [line for line in sub.plan.initial if decode(line)[0] != "BOOKMARK"]
        apply_lines(sub.state, lines)
        delivered = [e for e in events if sub.plan.wants(e)]
        floor = sub.rv if sub.rv is not None else int(sub.plan.initial_rv or "0")
        previous = floor
        for event in delivered:
            assert event.rv >= previous  # never back in time
            # "only events after N": nothing at or before it again — except relist events
            # below their list's RV at exactly N, which are replayed (see test above)
            list_rvs = {after for before, after in gaps if after > before}
            again = event.relist and event.rv == floor and floor not in list_rvs
            assert event.rv > floor or again
            previous = event.rv
            if sub.after_seq is not None:
                assert event.seq > sub.after_seq or again  # never an event it already had
        seqs = [e.seq for e in delivered]
        assert len(seqs) == len(set(seqs))
        apply_lines(sub.state, [e.line for e in delivered])
        assert sub.state == keyed(cache.state.objects())


def test_state_bytes_follow_every_change_of_the_state() -> None:
    cache = make_cache()
    cache.replace([pod("a", 5), pod("b", 6)], "10")
    two = cache.state_bytes
    rep = JsonRepresentation()
    assert two == sum(len(rep.encode_event(ADDED, p)) for p in [pod("a", 5), pod("b", 6)])
    cache.apply(ADDED, pod("c", 11))
    assert cache.state_bytes > two
    cache.apply(DELETED, pod("c", 12))
    assert cache.state_bytes == two
    cache.replace([pod("a", 5)], "20")  # b gone in the relist
    assert 0 < cache.state_bytes < two
    cache.apply(DELETED, pod("a", 21))
    assert cache.state_bytes == 0
    cache.reset([pod("z", 30)], "30")
    assert cache.state_bytes > 0
