"""The conformance program's report, and the comparison of a run direct with one through
watchproxy. Pure: values in, values out (the tier's runner does the I/O)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASSED = "passed"
# A spec that skipped itself (e2eskipper: a feature the cluster does not serve, a provider it
# is not): it started, so the report names it, but it proved nothing either way.
SKIPPED = "skipped"


@dataclass(frozen=True)
class SpecResult:
    name: str
    state: str
    """ginkgo's word: passed, skipped, failed, panicked, timedout, interrupted, aborted."""
    failure: str = ""
    location: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.state == PASSED


@dataclass(frozen=True)
class Run:
    """One run of the conformance program: the specs that ran, by full name."""

    seed: int
    seconds: float
    specs: Mapping[str, SpecResult]
    complete: bool

    def count(self, state: str) -> int:
        return sum(1 for spec in self.specs.values() if spec.state == state)

    @property
    def failed(self) -> list[SpecResult]:
        return [s for s in self.specs.values() if s.state not in (PASSED, SKIPPED)]

    def counts(self) -> dict[str, int]:
        """passed / failed / skipped (skipped by the spec itself)."""
        return {
            "passed": self.count(PASSED),
            "failed": len(self.failed),
            "skipped": self.count(SKIPPED),
        }


def parse_report(data: Mapping[str, Any]) -> Run:
    specs: dict[str, SpecResult] = {}
    for raw in data["specs"]:
        spec = SpecResult(
            name=raw["name"],
            state=raw["state"],
            failure=raw.get("failure", ""),
            location=raw.get("location", ""),
            seconds=float(raw.get("seconds", 0.0)),
        )
        specs[spec.name] = spec
    return Run(
        seed=int(data["seed"]),
        seconds=float(data["seconds"]),
        specs=specs,
        complete=bool(data["complete"]),
    )


def read_report(path: Path) -> Run:
    return parse_report(json.loads(path.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Difference:
    """A spec that passed direct and did not pass through watchproxy."""

    name: str
    state: str
    """Its state through watchproxy ("missing": it never ran there)."""
    failure: str

    def describe(self, limit: int = 600) -> str:
        failure = " ".join(self.failure.split())
        if len(failure) > limit:
            failure = failure[:limit] + " ..."
        return f"{self.name}: {self.state} through watchproxy: {failure}"


@dataclass
class Comparison:
    differences: list[Difference] = field(default_factory=list)
    """Passed direct, not through watchproxy, and not listed with a reason."""
    excused: list[Difference] = field(default_factory=list)
    """Passed direct, not through watchproxy, listed with a reason."""
    stale: list[str] = field(default_factory=list)
    """Listed as unable to pass through watchproxy, and passed there all the same."""
    compared: int = 0
    """How many specs passed direct (each one a comparison)."""


def compare(direct: Run, proxied: Run, listed: Mapping[str, str]) -> Comparison:
    """Every spec that passed direct must pass through watchproxy, unless ``listed`` (full spec
    name -> why it cannot) names it; a listed spec that passed through watchproxy is stale."""
    comparison = Comparison()
    for name, spec in sorted(direct.specs.items()):
        if not spec.passed:
            continue
        comparison.compared += 1
        through = proxied.specs.get(name)
        if through is not None and through.passed:
            if name in listed:
                comparison.stale.append(name)
            continue
        difference = Difference(
            name,
            "missing" if through is None else through.state,
            "" if through is None else through.failure,
        )
        (comparison.excused if name in listed else comparison.differences).append(difference)
    return comparison
