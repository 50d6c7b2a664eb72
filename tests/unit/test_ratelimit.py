"""Token arithmetic, Retry-After parsing and the upstream / per-client limiters."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Coroutine
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchproxy.errors import TooManyRequests
from watchproxy.policy.adaptive import AdaptiveLimit, AdaptiveSettings, Outcome
from watchproxy.policy.clientlimits import ClientRateLimiter, ErroredWatchLimiter
from watchproxy.policy.fairqueue import flow
from watchproxy.policy.ratelimit import (
    MAX_RETRY_AFTER,
    RetryAfterGate,
    TokenBucket,
    UpstreamLimiter,
    parse_retry_after,
)


class VirtualTime:
    """A clock and a sleep for the limiter: time moves only when every task is blocked."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + delay, next(self._sequence), future))
        await future

    async def run(self, *coroutines: Coroutine[Any, Any, Any]) -> list[Any]:
        tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
        for _ in range(100_000):
            for _ in range(20):
                await asyncio.sleep(0)
            if all(task.done() for task in tasks):
                return [task.result() for task in tasks]
            if self._sleepers:
                wake, _, future = heapq.heappop(self._sleepers)
                self.now = max(self.now, wake)
                if not future.done():
                    future.set_result(None)
        raise AssertionError("tasks did not finish")


# --- TokenBucket -----------------------------------------------------------------------------


def test_bucket_starts_full_and_hands_out_its_burst_at_once() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.try_take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.try_take(0.0) == 0.5


def test_bucket_refuses_without_taking_and_reports_exact_wait() -> None:
    bucket = TokenBucket(rate=4.0, burst=1, now=10.0)
    assert bucket.try_take(10.0) == 0.0
    assert bucket.try_take(10.0) == 0.25
    assert bucket.try_take(10.125) == 0.125  # nothing was taken by the refusals
    assert bucket.try_take(10.25) == 0.0


def test_bucket_refills_at_rate_but_never_above_burst() -> None:
    bucket = TokenBucket(rate=2.0, burst=4, now=0.0)
    for _ in range(4):
        bucket.try_take(0.0)
    assert bucket.tokens(1.0) == 2.0
    assert bucket.tokens(100.0) == 4.0
    assert [bucket.try_take(100.0) for _ in range(5)] == [0.0, 0.0, 0.0, 0.0, 0.5]


def test_taking_several_tokens_at_once() -> None:
    bucket = TokenBucket(rate=1.0, burst=5, now=0.0)
    assert bucket.try_take(0.0, n=3) == 0.0
    assert bucket.try_take(0.0, n=3) == 1.0
    assert bucket.try_take(0.0, n=6) == math.inf  # more than the burst: never


def test_reserve_queues_callers_first_come_first_served() -> None:
    bucket = TokenBucket(rate=2.0, burst=2, now=0.0)
    waits = [bucket.reserve(0.0) for _ in range(6)]
    assert waits == [0.0, 0.0, 0.5, 1.0, 1.5, 2.0]
    assert bucket.tokens(0.0) == -4.0
    assert bucket.time_until(0.0) == 2.5  # a newcomer queues behind the reservations
    assert bucket.reserve(1.0) == 1.5  # the same moment, 2.5, seen from t = 1


def test_reserve_more_than_burst_is_an_error() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=1.0, burst=2, now=0.0).reserve(0.0, n=3)


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf])
def test_non_positive_or_infinite_rate_is_unlimited(rate: float) -> None:
    bucket = TokenBucket(rate=rate, burst=0, now=0.0)
    assert all(bucket.try_take(0.0) == 0.0 for _ in range(1000))
    assert bucket.reserve(0.0) == 0.0


def test_time_going_backwards_neither_mints_nor_destroys_tokens() -> None:
    bucket = TokenBucket(rate=1.0, burst=1, now=10.0)
    assert bucket.try_take(10.0) == 0.0
    assert bucket.try_take(5.0) == 1.0
    assert bucket.try_take(11.0) == 0.0


@pytest.mark.parametrize(("rate", "burst"), [(1.0, 0), (1.0, -1), (math.nan, 1)])
def test_bucket_rejects_unusable_parameters(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=burst, now=0.0)


@given(
    rate=st.floats(min_value=0.1, max_value=100.0),
    burst=st.integers(min_value=1, max_value=50),
    gaps=st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=1, max_size=200),
)
def test_bucket_never_hands_out_more_than_burst_plus_rate_times_t(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate=rate, burst=burst, now=0.0)
    now, granted = 0.0, 0
    for gap in gaps:
        now += gap
        if bucket.try_take(now) == 0.0:
            granted += 1
        assert granted <= burst + rate * now + 1e-9


# --- Retry-After -----------------------------------------------------------------------------

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("120", 120.0),
        ("0", 0.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("-3", 0.0),
        ("-0.5", 0.0),
        ("600", 600.0),
        ("601", MAX_RETRY_AFTER),
        ("99999999999999999999999", MAX_RETRY_AFTER),
        (format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True), 30.0),
        (format_datetime(datetime.fromtimestamp(NOW - 30, UTC), usegmt=True), 0.0),
        (format_datetime(datetime.fromtimestamp(NOW + 86400, UTC), usegmt=True), 600.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # long past
        ("", None),
        ("   ", None),
        (None, None),
        ("soon", None),
        ("1e3", None),
        ("inf", None),
        ("nan", None),
        ("0x10", None),
        ("5 seconds", None),
        ("١٢", None),  # non-ASCII digits
        ("Mon, 99 Foo 2023 99:99:99 GMT", None),
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, NOW) == expected


@pytest.mark.parametrize(
    "header",
    [
        "Sun, 06 Nov 1994 08:49:47 GMT",  # IMF-fixdate
        "Sunday, 06-Nov-94 08:49:47 GMT",  # obsolete RFC 850
        "Sun Nov  6 08:49:47 1994",  # asctime
    ],
)
def test_parse_retry_after_reads_all_three_http_date_forms(header: str) -> None:
    assert parse_retry_after(header, 784111777.0) == 10.0


@given(st.text(max_size=40))
def test_parse_retry_after_never_raises_and_stays_in_range(header: str) -> None:
    delay = parse_retry_after(header, NOW)
    assert delay is None or 0.0 <= delay <= MAX_RETRY_AFTER


def test_retry_after_gate_keeps_the_latest_deadline() -> None:
    gate = RetryAfterGate()
    assert gate.blocked_until is None and gate.wait_time(0.0) == 0.0
    gate.block_until(10.0)
    gate.block_until(5.0)
    assert gate.blocked_until == 10.0
    assert gate.wait_time(4.0) == 6.0
    assert gate.wait_time(10.0) == 0.0
    assert gate.wait_time(11.0) == 0.0


# --- UpstreamLimiter -------------------------------------------------------------------------


def limiter_with(time: VirtualTime, **kwargs: Any) -> UpstreamLimiter:
    kwargs.setdefault("qps", 0.0)
    kwargs.setdefault("burst", 1)
    return UpstreamLimiter(clock=time.clock, sleep=time.sleep, **kwargs)


async def test_no_request_passes_before_retry_after() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=100.0, burst=100)
    time.now = 3.0
    limiter.note_retry_after(5.0)
    entered: list[float] = []

    async def request() -> None:
        async with limiter.slot():
            entered.append(time.now)

    await time.run(*(request() for _ in range(10)))
    assert len(entered) == 10
    assert min(entered) >= 8.0
    assert limiter.throttled_total == 10
    assert limiter.waited_seconds_total == pytest.approx(50.0)


async def test_retry_after_noted_while_a_request_queues_still_holds_it_back() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, max_concurrent=1)
    entered: list[tuple[str, float]] = []

    async def first() -> None:
        async with limiter.slot():
            entered.append(("first", time.now))
            await asyncio.sleep(0)
            limiter.note_retry_after(10.0)  # the response was a 429

    async def second() -> None:
        async with limiter.slot():
            entered.append(("second", time.now))

    await time.run(first(), second())
    assert entered == [("first", 0.0), ("second", 10.0)]


async def test_gate_extended_during_the_wait_is_honoured() -> None:
    time = VirtualTime()
    limiter = limiter_with(time)
    limiter.note_retry_after(2.0)
    entered: list[float] = []

    async def extend_later() -> None:
        await time.sleep(1.0)
        limiter.note_retry_after(5.0)

    async def request() -> None:
        async with limiter.slot():
            entered.append(time.now)

    await time.run(extend_later(), request())
    assert entered == [6.0]


async def test_token_bucket_admits_burst_then_qps_in_arrival_order() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=2.0, burst=2)
    entered: list[tuple[int, float]] = []

    async def request(number: int) -> None:
        async with limiter.slot():
            entered.append((number, time.now))

    await time.run(*(request(n) for n in range(6)))
    assert entered == [(0, 0.0), (1, 0.0), (2, 0.5), (3, 1.0), (4, 1.5), (5, 2.0)]
    assert limiter.throttled_total == 4


async def test_concurrency_never_exceeds_the_cap() -> None:
    limiter = UpstreamLimiter(qps=0.0, burst=1, max_concurrent=3)
    running = 0
    peak = 0
    finished = 0

    async def request() -> None:
        nonlocal running, peak, finished
        async with limiter.slot():
            running += 1
            peak = max(peak, running)
            assert limiter.in_flight == running <= 3
            for _ in range(3):
                await asyncio.sleep(0.001)
            running -= 1
        finished += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(40):
            group.create_task(request())
    assert finished == 40
    assert peak == 3
    assert limiter.in_flight == 0


async def test_a_failing_request_frees_its_concurrency_slot() -> None:
    limiter = UpstreamLimiter(qps=0.0, burst=1, max_concurrent=1)
    with pytest.raises(RuntimeError):
        async with limiter.slot():
            raise RuntimeError("upstream broke")
    async with limiter.slot(max_wait=0):
        assert limiter.in_flight == 1


async def test_max_wait_refuses_with_retry_after_instead_of_waiting() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=1.0, burst=1)
    limiter.note_retry_after(30.0)
    with pytest.raises(TooManyRequests) as caught:
        async with limiter.slot(max_wait=5.0):
            pytest.fail("must not run")
    assert caught.value.retry_after == 30.0
    status = caught.value.status()
    assert status["code"] == 429
    assert status["details"] == {"retryAfterSeconds": 30}
    assert limiter.rejected_total == 1
    assert time.sleeps == []
    time.now = 30.0
    async with limiter.slot(max_wait=0):  # the refused request took no token
        pass


async def test_max_wait_refuses_when_the_bucket_is_empty() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=1.0, burst=1)
    async with limiter.slot(max_wait=0):
        pass
    with pytest.raises(TooManyRequests) as caught:
        async with limiter.slot(max_wait=0.5):
            pass
    assert caught.value.retry_after == 1.0

    entered: list[float] = []

    async def patient() -> None:
        async with limiter.slot(max_wait=1.0):
            entered.append(time.now)

    await time.run(patient())
    assert entered == [1.0]


async def test_default_max_wait_from_the_constructor_and_none_to_wait_forever() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, max_wait=0.0)
    limiter.note_retry_after(100.0)
    with pytest.raises(TooManyRequests):
        async with limiter.slot():
            pass
    entered: list[float] = []

    async def patient() -> None:
        async with limiter.slot(max_wait=None):
            entered.append(time.now)

    await time.run(patient())
    assert entered == [100.0]


async def test_non_blocking_slot_refuses_when_all_concurrency_slots_are_busy() -> None:
    limiter = UpstreamLimiter(qps=0.0, burst=1, max_concurrent=1)
    async with limiter.slot():
        with pytest.raises(TooManyRequests) as caught:
            async with limiter.slot(max_wait=0):
                pass
        assert caught.value.retry_after is not None and caught.value.retry_after > 0
    async with limiter.slot(max_wait=0):
        pass


async def test_concurrency_wait_is_bounded_by_max_wait() -> None:
    limiter = UpstreamLimiter(qps=0.0, burst=1, max_concurrent=1)
    release = asyncio.Event()

    async def holder() -> None:
        async with limiter.slot():
            await release.wait()

    task = asyncio.create_task(holder())
    await asyncio.sleep(0)
    with pytest.raises(TooManyRequests):
        async with limiter.slot(max_wait=0.02):
            pass
    release.set()
    await task


# --- fair shares between flows (clients) ------------------------------------------------------


async def test_a_noisy_flow_cannot_starve_a_quiet_one() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=10.0, burst=1)
    entered: dict[str, list[float]] = {"noisy": [], "quiet": []}

    async def request(who: str, delay: float = 0.0) -> None:
        with flow(who):
            if delay:
                await time.sleep(delay)
            async with limiter.slot():
                entered[who].append(time.now)

    await time.run(*(request("noisy") for _ in range(50)), request("quiet", delay=0.05))
    assert len(entered["noisy"]) == 50
    # The quiet request takes the next token but one, not a place behind 49 noisy ones (5 s).
    assert entered["quiet"][0] <= 0.2 + 1e-9
    # Work-conserving: the noisy flow still got every other token.
    assert max(entered["noisy"]) == pytest.approx(5.0)


async def test_waiting_flows_take_tokens_in_turn() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=1.0, burst=1)
    order: list[str] = []

    async def request(who: str) -> None:
        with flow(who):
            async with limiter.slot():
                order.append(who)

    await time.run(*(request(who) for who in "aaaabbc"))
    assert order == list("abcabaa")
    assert limiter.waiting_flows == 0  # nothing kept about flows once nobody waits


async def test_one_flow_alone_keeps_the_whole_budget_in_arrival_order() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=2.0, burst=2)
    entered: list[tuple[int, float]] = []

    async def request(number: int) -> None:
        with flow("only"):
            async with limiter.slot():
                entered.append((number, time.now))

    await time.run(*(request(n) for n in range(6)))
    assert entered == [(0, 0.0), (1, 0.0), (2, 0.5), (3, 1.0), (4, 1.5), (5, 2.0)]


async def test_a_light_flow_finds_a_token_at_once_beside_a_backlogged_one() -> None:
    # The bench.fairness situation: a noisy flow keeps a backlog; without the reserve every quiet
    # request waited for the next token (up to 1/qps) although it was served next.
    time = VirtualTime()
    limiter = limiter_with(time, qps=50.0, burst=100)
    assert limiter.reserve == 5
    noisy: list[float] = []
    quiet_waits: list[float] = []

    async def noisy_request() -> None:
        with flow("noisy"):
            async with limiter.slot():
                noisy.append(time.now)

    async def quiet_request(at: float) -> None:
        with flow(f"quiet-{at}"):
            await time.sleep(at)
            async with limiter.slot():
                quiet_waits.append(time.now - at)

    arrivals = [3.0 + 0.1037 * i for i in range(40)]  # not aligned with the token clock
    await time.run(*(noisy_request() for _ in range(400)), *map(quiet_request, arrivals))
    assert quiet_waits == [0.0] * 40
    # Throughput kept: the bucket ran at qps throughout; the reserve cost the backlog its own
    # size once (5 tokens = 0.1 s) and the quiet requests their 40 tokens.
    assert (400 - 100 + 40) / 50.0 <= max(noisy) <= (400 - 100 + 40 + 5) / 50.0


async def test_light_flows_cannot_starve_a_backlogged_one() -> None:
    # Ten clients at 10 requests a second each ask for twice the qps: each of them is light (never
    # two waiting), the noisy one is backlogged. It must still get a fair share, not only what
    # the reserve rule leaves over.
    time = VirtualTime()
    limiter = limiter_with(time, qps=50.0, burst=10)
    noisy: list[float] = []

    async def noisy_request() -> None:
        with flow("noisy"):
            async with limiter.slot():
                noisy.append(time.now)

    async def light_request(number: int) -> None:
        with flow(number % 10):
            await time.sleep(number / 100.0)
            async with limiter.slot():
                pass

    await time.run(*(noisy_request() for _ in range(200)), *map(light_request, range(300)))
    share = 50.0 / 11
    assert sum(0.5 <= t < 3.0 for t in noisy) >= 0.8 * 2.5 * share


async def test_a_flow_alone_pays_the_reserve_once() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=50.0, burst=10)
    entered: list[float] = []

    async def request() -> None:
        with flow("only"):
            async with limiter.slot():
                entered.append(time.now)

    await time.run(*(request() for _ in range(40)))
    assert entered[:10] == [0.0] * 10
    assert entered[10] == pytest.approx(limiter.reserve / 50.0)
    # After that one pause the backlog drains at qps, the reserve left in the bucket until the
    # last request (nothing else of its flow waiting) may take it.
    assert 30 / 50.0 <= entered[-1] <= (30 + limiter.reserve) / 50.0


async def test_max_wait_refuses_the_noisy_flow_not_the_quiet_one() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, qps=10.0, burst=1, max_wait=1.0)
    outcomes: dict[str, list[str]] = {"noisy": [], "quiet": []}

    async def request(who: str, delay: float = 0.0) -> None:
        with flow(who):
            if delay:
                await time.sleep(delay)
            try:
                async with limiter.slot():
                    outcomes[who].append("ok")
            except TooManyRequests:
                outcomes[who].append("429")

    await time.run(*(request("noisy") for _ in range(30)), request("quiet", delay=0.05))
    assert outcomes["quiet"] == ["ok"]
    assert 0 < outcomes["noisy"].count("429") < 30
    assert outcomes["noisy"].count("ok") <= 12  # about max_wait x qps, plus the burst


async def test_a_freed_concurrency_slot_goes_to_the_flow_with_fewer_turns() -> None:
    limiter = UpstreamLimiter(qps=0.0, burst=1, max_concurrent=2)
    release = asyncio.Event()
    order: list[str] = []

    async def request(who: str, hold: bool = False) -> None:
        with flow(who):
            async with limiter.slot():
                order.append(who)
                if hold:
                    await release.wait()

    async with asyncio.TaskGroup() as group:
        for _ in range(2):
            group.create_task(request("noisy", hold=True))
        for _ in range(3):
            group.create_task(request("noisy"))
        for _ in range(5):
            await asyncio.sleep(0)
        group.create_task(request("quiet"))
        for _ in range(5):
            await asyncio.sleep(0)
        release.set()
    assert order[:2] == ["noisy", "noisy"]
    assert order[2] == "quiet", order


def test_retry_after_is_capped_and_nan_ignored() -> None:
    time = VirtualTime()
    limiter = limiter_with(time)
    limiter.note_retry_after(math.nan)
    assert limiter.retry_after_remaining() == 0.0
    limiter.note_retry_after(10_000.0)
    assert limiter.retry_after_remaining() == MAX_RETRY_AFTER
    limiter.note_retry_after(-5.0)
    assert limiter.retry_after_remaining() == MAX_RETRY_AFTER
    assert limiter.retry_after_total == 2


def test_limiter_rejects_negative_limits() -> None:
    with pytest.raises(ValueError):
        UpstreamLimiter(qps=1.0, burst=1, max_concurrent=-1)
    with pytest.raises(ValueError):
        UpstreamLimiter(qps=1.0, burst=1, max_wait=-1.0)


# --- ClientRateLimiter -----------------------------------------------------------------------


def test_each_client_gets_its_own_bucket() -> None:
    limiter = ClientRateLimiter(rate=1.0, burst=2)
    assert [limiter.check("10.0.0.1", 0.0) for _ in range(3)] == [0.0, 0.0, 1.0]
    assert limiter.check("10.0.0.2", 0.0) == 0.0
    assert limiter.check("10.0.0.1", 0.5) == 0.5
    assert limiter.check("10.0.0.1", 1.0) == 0.0
    assert limiter.rejected_total == 2


def test_client_keys_are_bounded_least_recently_used_first() -> None:
    limiter = ClientRateLimiter(rate=0.001, burst=1, max_keys=3)
    for key in ("a", "b", "c"):
        assert limiter.check(key, 0.0) == 0.0
    assert limiter.check("a", 0.0) > 0  # touch "a": now "b" is the oldest
    assert limiter.check("d", 0.0) == 0.0
    assert len(limiter) == 3
    assert limiter.check("b", 0.0) == 0.0  # forgotten, so a fresh bucket
    assert limiter.check("a", 0.0) > 0  # remembered, still empty


def test_idle_clients_whose_buckets_refilled_are_forgotten() -> None:
    limiter = ClientRateLimiter(rate=1.0, burst=2)
    for key in range(100):
        limiter.check(key, 0.0)
    assert len(limiter) == 100
    limiter.check("late", 10.0)
    assert len(limiter) == 1


def test_unlimited_client_rate_always_allows() -> None:
    limiter = ClientRateLimiter(rate=0.0, burst=0)
    assert all(limiter.check("x", 0.0) == 0.0 for _ in range(1000))
    assert len(limiter) == 0


def test_client_limiter_validates_parameters() -> None:
    with pytest.raises(ValueError):
        ClientRateLimiter(rate=1.0, burst=0)
    with pytest.raises(ValueError):
        ClientRateLimiter(rate=1.0, burst=1, max_keys=0)


def test_errored_watches_cost_nothing_until_the_burst_then_one_per_interval() -> None:
    limiter = ErroredWatchLimiter(rate=1.0, burst=10)
    now = 100.0
    assert limiter.wait("client", now) == 0.0
    for _ in range(10):
        limiter.record_error("client", now)
        assert limiter.wait("client", now) == 0.0
    limiter.record_error("client", now)
    assert limiter.wait("client", now) == pytest.approx(1.0)
    assert limiter.wait("other", now) == 0.0  # keys are independent
    assert limiter.wait("client", now + 1.0) == pytest.approx(0.0)


def test_errored_watch_debt_is_capped_and_idle_keys_are_forgotten() -> None:
    limiter = ErroredWatchLimiter(rate=2.0, burst=4)
    for _ in range(1000):
        limiter.record_error("loop", 0.0)
    assert limiter.wait("loop", 0.0) <= 4 / 2.0 + 1e-9
    limiter.record_error("other", 100.0)  # "loop" refilled long ago: it is dropped
    assert len(limiter) == 1


def test_errored_watch_limit_off() -> None:
    limiter = ErroredWatchLimiter(rate=0.0, burst=1)
    for _ in range(100):
        limiter.record_error("k", 0.0)
    assert limiter.wait("k", 0.0) == 0.0


# --- UpstreamLimiter with an adaptive limit ------------------------------------------------


def test_a_429_above_the_floor_cuts_the_limit_and_holds_nobody_back() -> None:
    time = VirtualTime()
    adaptive = AdaptiveLimit(AdaptiveSettings(initial=16, minimum=2))
    limiter = limiter_with(time, adaptive=adaptive)
    assert limiter.concurrency_limit == 16
    assert limiter.record(Outcome.THROTTLED, retry_after=5.0)
    assert limiter.concurrency_limit == 8
    assert limiter.retry_after_remaining() == 0.0


def test_a_second_429_in_a_row_with_nothing_in_flight_closes_the_gate() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, adaptive=AdaptiveLimit(AdaptiveSettings(initial=64)))
    limiter.record(Outcome.THROTTLED, retry_after=5.0)
    assert limiter.retry_after_remaining() == 0.0  # one refusal: the cut answers it
    limiter.record(Outcome.OK, kind="get", latency=0.001)
    limiter.record(Outcome.THROTTLED, retry_after=5.0)
    assert limiter.retry_after_remaining() == 0.0  # refusals between successes: no gate
    limiter.record(Outcome.THROTTLED, retry_after=5.0)
    assert limiter.retry_after_remaining() == 5.0  # one after another, all refused
    assert limiter.concurrency_limit > 1


async def test_refusals_of_requests_in_flight_together_only_cut_the_limit() -> None:
    time = VirtualTime()
    limiter = limiter_with(time, adaptive=AdaptiveLimit(AdaptiveSettings(initial=4)))
    # Three requests in flight together; two come back refused while the third is still out.
    held = [limiter.admit_now() for _ in range(3)]
    assert all(held)
    for _ in range(2):
        limiter.release()
        limiter.record(Outcome.THROTTLED, retry_after=5.0)
    assert limiter.retry_after_remaining() == 0.0
    assert limiter.concurrency_limit < 4
    limiter.release()
    limiter.record(Outcome.THROTTLED, retry_after=5.0)  # nothing left in flight: a third
    assert limiter.retry_after_remaining() == 5.0


def test_a_fixed_cap_below_the_adaptive_limit_wins() -> None:
    limiter = UpstreamLimiter(0.0, 1, 4, adaptive=AdaptiveLimit(AdaptiveSettings(initial=64)))
    assert limiter.concurrency_limit == 4


async def test_the_limit_growing_lets_a_waiting_request_in() -> None:
    time = VirtualTime()
    adaptive = AdaptiveLimit(AdaptiveSettings(initial=1, minimum=1))
    limiter = limiter_with(time, adaptive=adaptive)
    entered: list[str] = []
    release = asyncio.Event()
    first_in = asyncio.Event()

    async def request(name: str) -> None:
        async with limiter.slot(max_wait=None):
            entered.append(name)
            first_in.set()
            await release.wait()

    first = asyncio.create_task(request("first"))
    second = asyncio.create_task(request("second"))
    try:
        await first_in.wait()
        await asyncio.sleep(0)
        assert entered == ["first"]
        # A healthy answer while the limit binds: it grows to 2 and the waiter goes in.
        assert limiter.record(Outcome.OK, kind="get", latency=0.001)
        for _ in range(10):
            await asyncio.sleep(0)
        assert entered == ["first", "second"]
    finally:
        release.set()
        await asyncio.gather(first, second)
