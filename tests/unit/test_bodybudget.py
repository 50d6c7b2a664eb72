"""The body budget: what all request bodies being read hold together (policy.bodybudget)."""

from __future__ import annotations

from watchproxy.policy.bodybudget import BodyBudget


def test_a_body_that_does_not_fit_takes_nothing_and_fits_once_another_gives_back() -> None:
    budget = BodyBudget(10)
    assert budget.take(6)
    assert not budget.take(5)
    assert budget.held == 6
    assert budget.take(4)
    budget.give(6)
    assert budget.take(5) and budget.held == 9


def test_a_capacity_of_zero_bounds_nothing() -> None:
    budget = BodyBudget(0)
    assert budget.take(1 << 40) and budget.take(1 << 40)


def test_giving_back_never_goes_below_zero() -> None:
    budget = BodyBudget(10)
    budget.give(3)
    assert budget.held == 0
