"""The conformance tier's comparison and lists (tests/conformance), without running a spec."""

from __future__ import annotations

import re

from tests.conformance import specs
from tests.conformance.results import Run, SpecResult, compare, parse_report

WATCH = "[sig-api-machinery] Watchers should observe add, update, and delete [Conformance]"
TABLE = (
    "[sig-api-machinery] Servers with support for Table transformation should return pod details"
)
SELF = "[sig-auth] SelfSubjectReview should support SelfSubjectReview API operations"


def run(**states: str) -> Run:
    names = {"watch": WATCH, "table": TABLE, "self": SELF}
    return Run(
        seed=1,
        seconds=1.0,
        specs={
            names[k]: SpecResult(names[k], v, "boom" if v != "passed" else "")
            for k, v in states.items()
        },
        complete=True,
    )


def test_a_spec_that_passes_direct_and_fails_through_watchproxy_is_a_difference() -> None:
    comparison = compare(
        run(watch="passed", table="passed"), run(watch="passed", table="failed"), {}
    )
    assert [d.name for d in comparison.differences] == [TABLE]
    assert comparison.differences[0].state == "failed"
    assert comparison.compared == 2


def test_a_spec_that_never_ran_through_watchproxy_is_a_difference() -> None:
    comparison = compare(run(watch="passed"), run(), {})
    assert [(d.name, d.state) for d in comparison.differences] == [(WATCH, "missing")]


def test_a_listed_spec_is_excused_and_a_listed_spec_that_passes_is_stale() -> None:
    listed = {SELF: "impersonates", WATCH: "said to fail"}
    comparison = compare(
        run(watch="passed", self="passed"), run(watch="passed", self="failed"), listed
    )
    assert comparison.differences == []
    assert [d.name for d in comparison.excused] == [SELF]
    assert comparison.stale == [WATCH]


def test_a_spec_that_fails_direct_is_not_compared() -> None:
    comparison = compare(run(table="failed", self="skipped"), run(table="failed"), {})
    assert comparison.compared == 0
    assert comparison.differences == []


def test_the_report_of_the_program_parses() -> None:
    parsed = parse_report(
        {
            "seed": 7,
            "seconds": 3.5,
            "complete": True,
            "specs": [
                {"name": WATCH, "state": "passed", "seconds": 1.0},
                {"name": TABLE, "state": "failed", "failure": "timed out", "location": "a.go:1"},
                {"name": SELF, "state": "skipped", "failure": "no such feature"},
            ],
        }
    )
    assert parsed.counts() == {"passed": 1, "failed": 1, "skipped": 1}
    assert parsed.specs[TABLE].failure == "timed out"
    assert [s.name for s in parsed.failed] == [TABLE]


def test_the_subset_takes_the_watch_specs_and_leaves_the_skipped_ones() -> None:
    assert specs.SUBSET.takes(WATCH)
    assert specs.SUBSET.takes(TABLE)
    assert not specs.SUBSET.takes(SELF)  # not an area of the subset
    assert specs.FULL.takes(SELF)
    nodes = "[sig-api-machinery] Servers with support for Table transformation should return"
    assert not specs.FULL.takes(f"{nodes} generic metadata details across all namespaces for nodes")
    assert not specs.FULL.takes("[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin] x")


def test_focus_and_skip_are_one_regular_expression_each() -> None:
    for selection in (specs.SUBSET, specs.FULL):
        re.compile(selection.focus)
        re.compile(selection.skip)
        assert all(reason for reason in selection.skips.values())


def test_every_spec_listed_as_failing_through_watchproxy_runs_in_the_full_set() -> None:
    for name, reason in specs.listed().items():
        assert reason
        assert specs.FULL.takes(name), name
