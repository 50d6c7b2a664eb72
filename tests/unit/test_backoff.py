"""The backoff schedule: bounds, growth, cap, jitter distributions and the reset rule."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchproxy.app import probe_policy
from watchproxy.config import Config
from watchproxy.policy.backoff import Backoff, BackoffPolicy

SAMPLES = 4000


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def expected_proportional_mean(d: float, cap: float) -> float:
    """E[min(cap, U[d, 2d))]."""
    if 2 * d <= cap:
        return 1.5 * d
    return ((cap * cap - d * d) / 2 + (2 * d - cap) * cap) / d


# --- policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0},
        {"initial": -1},
        {"factor": 0.5},
        {"cap": 0.5, "initial": 1.0},
        {"reset_after": -1},
        {"initial": float("nan")},
        {"cap": float("inf")},
        {"jitter": "sometimes"},
    ],
)
def test_policy_rejects_invalid_parameters(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        BackoffPolicy(**kwargs)  # type: ignore[arg-type]


def test_defaults_are_client_go_reflector_backoff() -> None:
    policy = BackoffPolicy()
    assert (policy.initial, policy.factor, policy.cap, policy.reset_after) == (
        0.8,
        2.0,
        30.0,
        120.0,
    )
    assert policy.jitter == "proportional"


def test_base_delay_doubles_from_initial_until_cap() -> None:
    policy = BackoffPolicy()
    assert [policy.base_delay(n) for n in range(8)] == [
        0.8,
        1.6,
        3.2,
        6.4,
        12.8,
        25.6,
        30.0,
        30.0,
    ]


@pytest.mark.parametrize("attempt", [1_000, 10**6, 10**400])
def test_base_delay_does_not_overflow_for_huge_attempts(attempt: int) -> None:
    assert BackoffPolicy().base_delay(attempt) == 30.0
    assert BackoffPolicy(factor=1.0000001).base_delay(attempt) <= 30.0


def test_factor_one_is_constant_delay() -> None:
    policy = BackoffPolicy(initial=2.0, factor=1.0, jitter="none")
    assert {policy.base_delay(n) for n in range(100)} == {2.0}


def test_negative_attempt_is_rejected() -> None:
    with pytest.raises(ValueError):
        BackoffPolicy().base_delay(-1)


def test_no_jitter_is_exactly_the_base_delay() -> None:
    policy = BackoffPolicy(jitter="none")
    rng = random.Random(1)
    assert [policy.delay(n, rng) for n in range(7)] == [policy.base_delay(n) for n in range(7)]


@pytest.mark.parametrize("attempt", range(9))
def test_proportional_jitter_stays_in_d_to_2d_capped_with_expected_mean(attempt: int) -> None:
    policy = BackoffPolicy()
    rng = random.Random(attempt)
    d = policy.base_delay(attempt)
    samples = [policy.delay(attempt, rng) for _ in range(SAMPLES)]
    assert min(samples) >= d
    assert max(samples) <= min(policy.cap, 2 * d)
    if 2 * d <= policy.cap:
        assert max(samples) < 2 * d
    assert statistics.fmean(samples) == pytest.approx(
        expected_proportional_mean(d, policy.cap), rel=0.03
    )


@pytest.mark.parametrize("attempt", range(9))
def test_full_jitter_is_uniform_between_zero_and_d(attempt: int) -> None:
    policy = BackoffPolicy(jitter="full")
    rng = random.Random(100 + attempt)
    d = policy.base_delay(attempt)
    samples = [policy.delay(attempt, rng) for _ in range(SAMPLES)]
    assert min(samples) >= 0.0 and max(samples) <= d
    assert statistics.fmean(samples) == pytest.approx(d / 2, rel=0.05)
    below_quarter = sum(sample < d / 4 for sample in samples) / SAMPLES
    assert below_quarter == pytest.approx(0.25, abs=0.03)


def test_proportional_jitter_spreads_clients_apart() -> None:
    policy = BackoffPolicy()
    rng = random.Random(7)
    samples = [policy.delay(2, rng) for _ in range(SAMPLES)]
    # uniform on [3.2, 6.4): standard deviation 3.2 / sqrt(12)
    assert statistics.pstdev(samples) == pytest.approx(3.2 / 12**0.5, rel=0.05)


def test_same_seed_gives_the_same_schedule() -> None:
    policy = BackoffPolicy()
    first = [policy.delay(n, random.Random(42)) for n in range(10)]
    second = [policy.delay(n, random.Random(42)) for n in range(10)]
    assert first == second


# --- the state machine -----------------------------------------------------------------------


def make_backoff(**policy_kwargs: object) -> tuple[Backoff, FakeClock]:
    clock = FakeClock()
    policy = BackoffPolicy(**policy_kwargs)  # type: ignore[arg-type]
    return Backoff(policy, random.Random(0), clock), clock


def test_fresh_backoff_has_no_delay_and_no_health() -> None:
    backoff, _ = make_backoff()
    assert backoff.attempt == 0
    assert backoff.current_delay == 0.0
    assert backoff.healthy_since is None


def test_consecutive_failures_grow_to_the_cap() -> None:
    backoff, _ = make_backoff(jitter="none")
    delays = [backoff.failure() for _ in range(9)]
    assert delays == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]
    assert backoff.current_delay == 30.0
    assert backoff.attempt == 9


def test_failure_after_short_health_keeps_growing_the_delay() -> None:
    backoff, clock = make_backoff(jitter="none")
    backoff.failure()
    backoff.failure()
    clock.now += 1.6
    backoff.success()
    assert backoff.healthy_since == clock.now
    clock.now += 119.9
    assert backoff.failure() == 3.2
    assert backoff.healthy_since is None


def test_failure_after_reset_after_of_health_starts_again_at_attempt_zero() -> None:
    backoff, clock = make_backoff(jitter="none")
    for _ in range(6):
        backoff.failure()
    backoff.success()
    clock.now += 120.0
    assert backoff.attempt == 0
    assert backoff.failure() == 0.8
    assert backoff.failure() == 1.6


def test_repeated_success_keeps_the_first_healthy_moment() -> None:
    backoff, clock = make_backoff(jitter="none")
    backoff.failure()
    backoff.failure()
    backoff.success()
    started = clock.now
    for _ in range(10):
        clock.now += 15.0
        backoff.success()
    assert backoff.healthy_since == started
    assert backoff.failure() == 0.8  # healthy for 150 s >= 120 s


def test_zero_reset_after_resets_on_any_success() -> None:
    backoff, _ = make_backoff(jitter="none", reset_after=0.0)
    backoff.failure()
    backoff.failure()
    backoff.success()
    assert backoff.failure() == 0.8


def test_explicit_reset_forgets_failures() -> None:
    backoff, _ = make_backoff(jitter="none")
    backoff.failure()
    backoff.failure()
    backoff.reset()
    assert (backoff.attempt, backoff.current_delay) == (0, 0.0)
    assert backoff.failure() == 0.8


def attempts_within(window: float, delays: list[float]) -> int:
    """Attempts made in [0, window] when the first is at 0 and each failure waits a delay."""
    attempts, elapsed = 1, 0.0
    for delay in delays:
        elapsed += delay
        if elapsed > window:
            break
        attempts += 1
    return attempts


def test_thirty_seconds_of_continuous_failure_with_defaults_makes_five_or_six_attempts() -> None:
    policy = BackoffPolicy()
    # Bounds from the schedule itself: shortest delays (d each) give the most attempts
    # (t = 0, 0.8, 2.4, 5.6, 12.0, 24.8), longest (min(cap, 2d)) the fewest (t = 0 .. 24.0).
    most = attempts_within(30.0, [policy.base_delay(n) for n in range(50)])
    fewest = attempts_within(30.0, [min(policy.cap, 2 * policy.base_delay(n)) for n in range(50)])
    assert (fewest, most) == (5, 6)
    seen = set()
    for seed in range(500):
        backoff = Backoff(policy, random.Random(seed), FakeClock())
        count = attempts_within(30.0, [backoff.failure() for _ in range(50)])
        assert fewest <= count <= most
        seen.add(count)
    assert seen == {5, 6}


def test_thirty_seconds_of_continuous_failure_with_full_jitter_retries_more() -> None:
    policy = BackoffPolicy(jitter="full")
    counts = []
    for seed in range(500):
        backoff = Backoff(policy, random.Random(seed), FakeClock())
        counts.append(attempts_within(30.0, [backoff.failure() for _ in range(200)]))
    # Expected delays d/2 give t = 0, 0.4, 1.2, 2.8, 6.0, 12.4, 25.2: about 7 attempts.
    assert 6 <= statistics.median(counts) <= 8
    assert min(counts) >= 5


# --- properties ------------------------------------------------------------------------------

policies = st.builds(
    BackoffPolicy,
    initial=st.floats(min_value=0.001, max_value=10.0),
    factor=st.floats(min_value=1.0, max_value=5.0),
    cap=st.floats(min_value=10.0, max_value=1000.0),
    jitter=st.sampled_from(["full", "proportional", "none"]),
    reset_after=st.floats(min_value=0.0, max_value=600.0),
)


@given(policy=policies, attempt=st.integers(min_value=0, max_value=10**6), seed=st.integers())
def test_delay_always_within_jitter_bounds(policy: BackoffPolicy, attempt: int, seed: int) -> None:
    d = policy.base_delay(attempt)
    delay = policy.delay(attempt, random.Random(seed))
    assert 0.0 <= delay <= policy.cap
    if policy.jitter == "full":
        assert delay <= d
    elif policy.jitter == "proportional":
        assert min(d, policy.cap) <= delay <= policy.cap
    else:
        assert delay == d


@given(policy=policies, attempt=st.integers(min_value=0, max_value=10**6))
def test_base_delay_is_nondecreasing_and_capped(policy: BackoffPolicy, attempt: int) -> None:
    assert policy.initial <= policy.base_delay(attempt) <= policy.cap
    assert policy.base_delay(attempt) <= policy.base_delay(attempt + 1)


@given(
    policy=policies,
    seed=st.integers(),
    steps=st.lists(st.one_of(st.just("fail"), st.floats(0.0, 300.0)), max_size=40),
)
def test_attempt_counter_follows_the_reset_rule(
    policy: BackoffPolicy, seed: int, steps: list[str | float]
) -> None:
    clock = FakeClock()
    backoff = Backoff(policy, random.Random(seed), clock)
    model_attempt, healthy_since = 0, None
    for step in steps:
        if step == "fail":
            if healthy_since is not None and clock.now - healthy_since >= policy.reset_after:
                model_attempt = 0
            healthy_since = None
            delay = backoff.failure()
            model_attempt += 1
            assert 0.0 <= delay <= policy.cap
        else:
            assert isinstance(step, float)
            if healthy_since is None:
                healthy_since = clock.now
            backoff.success()
            clock.now += step
    assert backoff.healthy_since == healthy_since
    if healthy_since is None or clock.now - healthy_since < policy.reset_after:
        assert backoff.attempt == model_attempt
    else:
        assert backoff.attempt == 0


def test_cap_jitter_spreads_delays_at_the_cap_and_zero_keeps_client_gos_schedule() -> None:
    rng = random.Random(7)
    plain = BackoffPolicy(initial=1.0, cap=8.0)
    assert {plain.delay(10, rng) for _ in range(100)} == {8.0}
    spread = BackoffPolicy(initial=1.0, cap=8.0, cap_jitter=0.25)
    samples = [spread.delay(10, rng) for _ in range(SAMPLES)]
    assert 6.0 <= min(samples) < 6.05 and 7.95 < max(samples) <= 8.0
    assert statistics.mean(samples) == pytest.approx(7.0, rel=0.02)
    # Below the cap the proportional jitter is unchanged: [d, 2d).
    assert all(1.0 <= spread.delay(0, rng) < 2.0 for _ in range(100))
    with pytest.raises(ValueError, match="cap_jitter"):
        BackoffPolicy(cap_jitter=1.5)


def test_the_probe_schedule_keeps_thirty_seconds_of_outage_to_eight_attempts() -> None:
    """Issue 10's budget with the default configuration: two failed dials declare the
    apiserver down, then only the prober dials; any 30 s of outage costs at most 8 attempts,
    and at the cap a probe goes out every 6-8 s (so recovery is seen ~3.5 s late on average)."""
    policy = probe_policy(Config())
    for seed in range(2000):
        backoff = Backoff(policy, random.Random(seed), FakeClock())
        times = [0.0]
        while times[-1] < 300.0:
            times.append(times[-1] + backoff.failure())
        probes = times[1:]
        for start in [0.0, *probes]:
            in_window = sum(1 for t in probes if start <= t < start + 30.0)
            # Two dials before the first window; later windows start at a probe (counted).
            assert in_window + (2 if start == 0.0 else 0) <= 8, (seed, start)
    gaps = [b - a for a, b in itertools.pairwise(probes) if b > 60.0]
    assert min(gaps) >= 6.0 and max(gaps) <= 8.0
