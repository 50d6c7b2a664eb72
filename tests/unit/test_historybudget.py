"""The byte budget over every history ring (watchproxy.hub.historybudget) and each ring's own
byte bound (``WatchCache(max_bytes=...)``)."""

from __future__ import annotations

import tracemalloc

import pytest

from tests.unit.test_watchcache import FakeClock, pod
from watchproxy.config import ConfigError, build_config
from watchproxy.hub.historybudget import HistoryBudget
from watchproxy.hub.watchcache import WatchCache
from watchproxy.kube.representation import JsonRepresentation


def ring(budget: HistoryBudget | None = None, *, max_bytes: int = 0) -> WatchCache:
    cache = WatchCache(
        JsonRepresentation(),
        capacity=10_000,
        max_age=1e9,
        clock=FakeClock(),
        max_bytes=max_bytes,
        budget=budget,
    )
    cache.replace([], "100")
    return cache


def fill(cache: WatchCache, first_rv: int, count: int, size: int) -> None:
    for i in range(count):
        cache.apply("ADDED", pod(f"p{first_rv + i}", first_rv + i, data="x" * size))


def rvs(cache: WatchCache) -> list[int]:
    plan = cache.plan("100")
    events = cache.events_from(plan.next_seq) or []
    return [event.rv for event in events]


def test_the_total_stays_within_the_budget_and_the_busiest_ring_pays() -> None:
    budget = HistoryBudget(limit=20_000)
    busy, quiet = ring(budget), ring(budget)
    fill(quiet, 101, 5, 100)
    quiet_bytes = quiet.history_bytes
    fill(busy, 200, 50, 1_000)
    assert budget.used == busy.history_bytes + quiet.history_bytes
    assert budget.used <= budget.limit
    assert quiet.history_bytes == quiet_bytes  # the quiet key kept all of its history
    # The busy ring lost its oldest events first: what is left is its newest, contiguous.
    left = [event.rv for event in busy.events_from(busy.oldest_seq) or []]
    assert left == list(range(250 - len(left), 250))
    assert budget.evicted_events == 50 - len(left)


def test_a_resume_from_before_the_evicted_history_goes_to_the_apiserver() -> None:
    budget = HistoryBudget(limit=10_000)
    cache = ring(budget)
    fill(cache, 101, 40, 1_000)
    oldest = cache.oldest_resumable_rv
    assert oldest is not None and oldest > 101
    assert cache.plan("101").outside_window  # not a made-up 410: the apiserver decides
    resumed = cache.plan(str(oldest))
    assert not resumed.outside_window and not resumed.expired


def test_the_newest_event_is_never_shed() -> None:
    # Subscribers that keep up may not have been handed it yet: losing it would end them.
    budget = HistoryBudget(limit=100)
    cache = ring(budget)
    fill(cache, 101, 3, 1_000)
    assert cache.history_len() == 1
    assert budget.used == cache.history_bytes > budget.limit


def test_a_ring_alone_keeps_to_its_own_bound() -> None:
    cache = ring(max_bytes=5_000)
    fill(cache, 101, 30, 1_000)
    assert 0 < cache.history_bytes <= 5_000
    assert rvs(cache) == []  # nothing newer than the newest
    assert cache.history_len() < 30


def test_an_ended_ring_no_longer_counts() -> None:
    budget = HistoryBudget(limit=1_000_000)
    first, second = ring(budget), ring(budget)
    fill(first, 101, 10, 1_000)
    fill(second, 101, 10, 1_000)
    first.detach()
    assert budget.used == second.history_bytes
    fill(first, 111, 1, 1_000)  # a detached ring charges nothing
    assert budget.used == second.history_bytes


def test_a_relist_is_charged_and_a_reset_refunds() -> None:
    budget = HistoryBudget(limit=0)  # no bound: only the accounting
    cache = ring(budget)
    fill(cache, 101, 3, 100)
    cache.replace([pod("q", 200)], "200")  # three DELETEs and one ADDED
    assert budget.used == cache.history_bytes > 0
    cache.reset([pod("q", 300)], "300")
    assert budget.used == 0


@pytest.mark.parametrize("key", ["history_max_bytes", "history_max_bytes_per_key"])
def test_a_negative_byte_bound_is_a_config_error_naming_the_key(key: str) -> None:
    with pytest.raises(ConfigError, match=f"hub.{key}"):
        build_config({"hub": {key: -1}})


def test_a_subscriber_writes_its_backlog_in_bounded_batches() -> None:
    from watchproxy.hub.subscriber import WRITE_BATCH_BYTES, first_batch

    cache = ring()
    fill(cache, 101, 100, 10_000)  # about 1 MB of history behind a cursor at its start
    backlog = cache.events_from(cache.oldest_seq) or []
    batch = first_batch(backlog)
    assert 0 < len(batch) < len(backlog)
    assert sum(len(e.line) for e in batch) <= WRITE_BATCH_BYTES
    assert list(batch) == list(backlog[: len(batch)])
    one = first_batch(backlog[:1])
    assert len(one) == 1  # an event larger than a batch still goes out, alone


def test_evicted_events_are_freed_not_kept_until_the_ring_is_compacted() -> None:
    """The memory a ring holds is its budget: an evicted line goes at once. Before, each slot
    kept its event until the list was compacted (past 1,024 dropped slots and half the list),
    so a ring held up to 1,024 evicted lines, or as many as its live ones, besides them."""
    budget = HistoryBudget(limit=400 * 1024)
    cache = ring(budget)

    def modify(first_rv: int, count: int) -> None:  # one pod: the state stays one object
        for rv in range(first_rv, first_rv + count):
            cache.apply("MODIFIED", pod("p", rv, data=f"{rv}" + "x" * 10_240))

    modify(101, 100)  # warm up: the list's own size, the budget's bookkeeping
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        modify(1_000, 1_000)  # 10 MB through a 400 KiB budget
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert budget.used <= budget.limit
    assert held < budget.limit + 200 * 1024, held  # before the fix: about twice the budget
