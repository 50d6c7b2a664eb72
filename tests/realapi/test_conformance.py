"""Kubernetes' own API conformance specs, direct and through watchproxy.

The e2e specs of k8s.io/kubernetes v1.37.2 that need only an apiserver (``test/e2e/
apimachinery``, ``auth``, ``instrumentation``; built into ``tests/conformance/bin/conformance``
by ``scripts/test.sh``) run twice with the same ginkgo seed, side by side, each against a fresh
kubetestenv of its own: straight at the apiserver, and through a watchproxy in its default
configuration. Every spec that passes direct must pass through watchproxy, unless
``tests/conformance/specs.py`` lists it with the reason it cannot; a listed spec that passes
anyway fails the test too, so that the list stays true. Every spec the selection takes must
pass direct: one that cannot on an apiserver without nodes or controllers is skipped in
``specs.py`` with its reason.

By default a subset runs (watches, chunking, Table, CRD watch, WatchList, field validation,
server-side apply; a few minutes). ``CONFORMANCE=full`` runs every spec of the three
packages that an apiserver alone can pass; ``CONFORMANCE_SEED`` changes the seed;
``CONFORMANCE_SUMMARY=FILE`` writes the counts and differences as JSON, which
``scripts/compatibility.py --conformance FILE`` puts in docs/compatibility.md.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from tests.clients.build import go_sources, is_fresh
from tests.conformance import specs
from tests.conformance.build import BINARY, kubernetes_version
from tests.conformance.results import Comparison, Run, compare
from tests.conformance.runner import run_specs
from tests.conformance.specs import Selection
from tests.harness import proxy_for_upstream, versioned_kubectl
from tests.realapi.fixture import ci_requires_tier, start_or_skip

MODE = os.environ.get("CONFORMANCE", "subset")
if MODE not in ("subset", "full"):
    raise RuntimeError(f"CONFORMANCE={MODE!r}: one of subset, full")
SEED = int(os.environ.get("CONFORMANCE_SEED", specs.SEED))
SELECTION = specs.FULL if MODE == "full" else specs.SUBSET
# Each run's bound (ginkgo's -timeout); the test's is both runs and two apiserver starts more.
NEWEST_KUBECTL = 37
RUN_TIMEOUT = 3600.0 if MODE == "full" else 420.0

pytestmark = [pytest.mark.long(170), pytest.mark.timeout(2 * RUN_TIMEOUT + 300, func_only=True)]


def conformance_binary() -> Path:
    """The built program, or skip (fail with CI=true) when scripts/test.sh did not build it."""
    problem = None
    if not BINARY.exists():
        problem = f"{BINARY} is missing: run python -m tests.conformance.build (needs Go)"
    elif not is_fresh(BINARY, go_sources(BINARY.parent.parent)):
        problem = f"{BINARY} is older than its sources: run python -m tests.conformance.build"
    if problem is not None:
        if ci_requires_tier():
            pytest.fail(f"CI=true and the conformance program is unavailable: {problem}")
        pytest.skip(problem)
    return BINARY


# The apiserver as a cluster runs it: the watch cache on for every resource (the fixture turns
# it off for configmaps, whose watches then read etcd: "Watchers should receive events on
# concurrent watches in same order" meets a 410 there), and etcd compacted every minute (the
# fixture's 4 s expire the resourceVersions that spec resumes from; the default 5 min would keep
# the chunking spec that waits for a compaction for up to 10).
APISERVER = ("-compaction-interval", "1m", "-apiserver-args", "")


async def run_both(binary: Path, work: Path, selection: Selection) -> tuple[Run, Run]:
    """The selected specs straight at one fresh kubetestenv and through a watchproxy in front
    of another, at the same time. Each apiserver is the run's own: the specs make cluster-wide
    objects, so neither run sees the other's. Side by side, both runs meet the same load."""
    # The newest kubectl when tests/realapi/build.sh built it, the one on PATH otherwise.
    kubectl = versioned_kubectl(NEWEST_KUBECTL) or "kubectl"

    def run(kubeconfig: str, name: str) -> Coroutine[Any, Any, Run]:
        return run_specs(
            binary, kubeconfig, selection,
            seed=SEED, out_dir=work / name, timeout=RUN_TIMEOUT, kubectl=kubectl,
        )  # fmt: skip

    direct_server = start_or_skip(work / "direct" / "kubetestenv", extra=APISERVER)
    try:
        proxied_server = start_or_skip(work / "watchproxy" / "kubetestenv", extra=APISERVER)
        try:
            # A run that fails to start ends the other (the TaskGroup cancels it, and
            # run_specs then kills its program).
            async with (
                proxy_for_upstream(work / "watchproxy", proxied_server.kubeconfig) as proxy,
                asyncio.TaskGroup() as runs,
            ):
                direct = runs.create_task(run(direct_server.kubeconfig, "direct"))
                proxied = runs.create_task(run(proxy.kubeconfig, "watchproxy"))
        finally:
            proxied_server.stop()
    finally:
        direct_server.stop()
    return direct.result(), proxied.result()


def summary(direct: Run, proxied: Run, comparison: Comparison) -> dict[str, object]:
    return {
        "kubernetes": kubernetes_version(),
        "date": datetime.date.today().isoformat(),
        "mode": MODE,
        "seed": SEED,
        "focus": SELECTION.focus,
        "skip": SELECTION.skip,
        "direct": {**direct.counts(), "seconds": round(direct.seconds)},
        "watchproxy": {**proxied.counts(), "seconds": round(proxied.seconds)},
        "compared": comparison.compared,
        "differences": [d.describe() for d in comparison.differences],
        "excused": {d.name: specs.listed()[d.name] for d in comparison.excused},
        "stale": comparison.stale,
    }


def write_summary(report: dict[str, object]) -> None:
    text = json.dumps(report, indent=1) + "\n"
    print(text)
    if path := os.environ.get("CONFORMANCE_SUMMARY"):
        Path(path).write_text(text, encoding="utf-8")


async def test_every_spec_that_passes_direct_passes_through_watchproxy(tmp_path: Path) -> None:
    binary = conformance_binary()
    direct, proxied = await run_both(binary, tmp_path, SELECTION)
    comparison = compare(direct, proxied, specs.listed())
    report = summary(direct, proxied, comparison)
    write_summary(report)

    assert direct.complete and proxied.complete, f"a run did not complete: {report}"
    # Every area of the selection ran: a focus that matches nothing proves nothing.
    for area in SELECTION.area_patterns:
        assert any(area.search(name) for name in direct.specs), f"no spec matched {area.pattern}"
    broken = [f"{s.name}: {s.state}: {s.failure[:400]}" for s in direct.failed]
    assert not broken, (
        "specs that fail direct against kubetestenv (skip them in tests/conformance/specs.py"
        f" with the reason, or mend the environment); output in {tmp_path / 'direct'}:\n"
        + "\n".join(broken)
    )
    assert comparison.compared > 0
    assert not comparison.differences, (
        f"specs that pass direct and fail through watchproxy (output in {tmp_path}):\n"
        + "\n".join(d.describe() for d in comparison.differences)
    )
    assert not comparison.stale, (
        "listed in tests/conformance/specs.py (THROUGH_WATCHPROXY or KNOWN_BUGS) as failing"
        " through watchproxy, and passed: remove them from the list\n" + "\n".join(comparison.stale)
    )
