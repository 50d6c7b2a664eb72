"""The headline against a real kube-apiserver, scaled down: five kube-rs watchers without
back-off through watchproxy while the apiserver process is stopped for 5 s and restarted on the
same etcd data. ``python -m bench.kubers_outage --real`` measures 20 watchers and 30 s both
straight and through watchproxy (figures in the README); this checks watchproxy's side: the
restarted apiserver saw no more attempts than the prober's schedule allows, kube-rs saw no
error, and every watcher got every pod created around the restart once, in order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kubers_outage import scenario
from tests.clients.build_rust_node import ToolchainMissing, build_kubewatch, on_ci
from tests.realapi.fixture import Unavailable, binary_problem, ci_requires_tier

pytestmark = [pytest.mark.long(45), pytest.mark.timeout(180, func_only=True)]


@pytest.fixture(scope="module")
def kubewatch() -> Path:
    problem = binary_problem()
    if problem is not None:
        if ci_requires_tier():
            pytest.fail(f"CI=true and the real apiserver is unavailable: {Unavailable(problem)}")
        pytest.skip(problem)
    try:
        return build_kubewatch()
    except ToolchainMissing as exc:
        if on_ci():
            pytest.fail(f"{exc} (CI=true: a missing toolchain is a failure)")
        pytest.skip(str(exc))


async def test_kubers_without_backoff_through_watchproxy_across_a_real_restart(
    kubewatch: Path, tmp_path: Path
) -> None:
    run = await scenario(
        "watchproxy", outage=5.0, watchers=5, kubewatch=kubewatch, workdir=tmp_path, real=True
    )
    assert 1 <= run["connection_attempts_during_outage"] <= 8, run
    assert run["kube_rs_errors"] == 0, run  # the streams stayed open across the restart
    assert run["every_watcher_got_every_pod_once_in_order"], run
