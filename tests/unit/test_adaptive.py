"""The adaptive concurrency limit: grows only while it binds, cuts once per burst of distress."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchproxy.metrics import CONCURRENCY_LIMIT_REASONS
from watchproxy.policy.adaptive import AdaptiveLimit, AdaptiveSettings, LimitReason, Outcome


def test_a_healthy_apiserver_below_the_limit_never_moves_it() -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=64))
    for i in range(10_000):
        assert not limit.record(i * 0.001, Outcome.OK, kind="get", latency=0.003)
    assert limit.limit == 64
    assert limit.reason is LimitReason.INITIAL


def test_growth_while_binding_is_about_one_per_limit_answers() -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=10, maximum=1000))
    for i in range(10):
        limit.record(i * 0.001, Outcome.OK, kind="get", latency=0.003, binding=True)
    assert limit.limit == 11
    assert limit.reason is LimitReason.GROWTH
    # From 11 to 20 takes 11 + 12 + ... + 19 answers, give or take the rounding.
    answers = 0
    while limit.limit < 20:
        limit.record(1.0, Outcome.OK, kind="get", latency=0.003, binding=True)
        answers += 1
    assert sum(range(11, 20)) - 5 <= answers <= sum(range(11, 20)) + 5


def test_one_burst_of_429s_costs_one_cut() -> None:
    """Fifty requests sent together under one limit and refused one after the other: the
    first refusal cuts; the rest were sent before that cut and say nothing about its limit."""
    limit = AdaptiveLimit(AdaptiveSettings(initial=64))
    for i in range(50):
        limit.record(10.0 + i * 0.001, Outcome.THROTTLED, sent=9.99)
    assert limit.limit == 32
    assert limit.reason is LimitReason.THROTTLED
    assert limit.cuts[LimitReason.THROTTLED] == 1
    # A request sent after the cut, under the new limit, and refused: that is news.
    limit.record(10.2, Outcome.THROTTLED, sent=10.0)
    assert limit.limit == 16


def test_a_slow_answer_sent_before_a_cut_does_not_cut_again() -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=50))
    now = 0.0
    for _ in range(200):
        now += 0.001
        limit.record(now, Outcome.OK, kind="get", latency=0.002)
    limit.record(now, Outcome.THROTTLED)
    cut_at, after_cut = now, limit.limit
    for _ in range(50):
        now += 0.001
        limit.record(now, Outcome.OK, kind="get", latency=0.5, binding=True, sent=cut_at - 0.001)
    assert limit.cuts[LimitReason.LATENCY] == 0
    assert limit.limit >= after_cut


@pytest.mark.parametrize(
    ("outcome", "reason", "expected"),
    [
        (Outcome.OVERLOADED, LimitReason.OVERLOADED, 70),
        (Outcome.TIMEOUT, LimitReason.TIMEOUT, 70),
        (Outcome.BROKEN, LimitReason.BROKEN, 70),
    ],
)
def test_other_distress_cuts_gently(outcome: Outcome, reason: LimitReason, expected: int) -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=100, maximum=1000))
    assert limit.record(0.0, outcome)
    assert (limit.limit, limit.reason) == (expected, reason)


def test_the_limit_never_leaves_its_bounds() -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=4, minimum=2, maximum=5))
    for i in range(20):
        limit.record(float(i), Outcome.THROTTLED)
    assert limit.limit == 2
    for _ in range(1000):
        limit.record(100.0, Outcome.OK, binding=True)
    assert limit.limit == 5


def test_a_latency_step_while_binding_cuts_a_little_then_is_the_new_normal() -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=50))
    now = 0.0
    for _ in range(200):
        now += 0.001
        limit.record(now, Outcome.OK, kind="get", latency=0.002, sent=now - 0.002)
    for _ in range(200):
        now += 0.001
        limit.record(now, Outcome.OK, kind="get", latency=0.02, binding=True, sent=now - 0.02)
    cuts = limit.cuts[LimitReason.LATENCY]
    assert 1 <= cuts <= 3, cuts
    assert limit.reason in (LimitReason.LATENCY, LimitReason.GROWTH)
    for _ in range(2000):
        now += 0.001
        limit.record(now, Outcome.OK, kind="get", latency=0.02, binding=True, sent=now - 0.02)
    assert limit.cuts[LimitReason.LATENCY] == cuts


def test_slow_lists_beside_fast_gets_are_no_latency_signal() -> None:
    """Each kind is compared with its own history, not with the others."""
    limit = AdaptiveLimit(AdaptiveSettings(initial=50))
    now = 0.0
    for i in range(2000):
        now += 0.001
        kind, latency = ("list", 0.2) if i % 3 == 0 else ("get", 0.002)
        limit.record(now, Outcome.OK, kind=kind, latency=latency, binding=True)
    assert limit.cuts[LimitReason.LATENCY] == 0


def test_recovers_after_the_signals_stop() -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=64))
    for i in range(6):
        limit.record(float(i), Outcome.THROTTLED)
    assert limit.limit == 1  # the floor
    for _ in range(5000):
        limit.record(100.0, Outcome.OK, kind="get", latency=0.003, binding=True)
    assert limit.limit >= 64


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="minimum <= initial <= maximum"):
        AdaptiveSettings(initial=1, minimum=2)
    with pytest.raises(ValueError, match="throttled_factor"):
        AdaptiveSettings(throttled_factor=1.0)


def test_the_metrics_know_every_reason() -> None:
    assert tuple(reason.value for reason in LimitReason) == CONCURRENCY_LIMIT_REASONS


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(Outcome)),
            st.floats(min_value=0, max_value=1),
            st.booleans(),
            st.floats(min_value=0, max_value=0.01),
        ),
        max_size=300,
    )
)
def test_any_sequence_keeps_the_bounds(steps: list[tuple[Outcome, float, bool, float]]) -> None:
    settings = AdaptiveSettings(initial=8, minimum=2, maximum=40)
    limit = AdaptiveLimit(settings)
    now = 0.0
    for outcome, latency, binding, gap in steps:
        now += gap
        before = limit.limit
        changed = limit.record(now, outcome, kind="get", latency=latency, binding=binding)
        assert settings.minimum <= limit.limit <= settings.maximum
        assert changed == (limit.limit != before)
        if outcome is Outcome.OK and limit.limit > before:
            assert binding and limit.limit == before + 1


def test_after_a_refusal_growth_waits_below_its_ceiling_until_the_hold_passes() -> None:
    limit = AdaptiveLimit(AdaptiveSettings(initial=10, probe_hold_seconds=5.0))
    limit.record(0.0, Outcome.THROTTLED)
    assert limit.limit == 5
    for _ in range(1000):
        limit.record(1.0, Outcome.OK, binding=True)
    assert limit.limit == 9  # one short of the limit the refusal came at
    for _ in range(100):
        limit.record(5.5, Outcome.OK, binding=True)
    assert limit.limit > 10  # the hold is over: it probes past the old ceiling
