"""The headline, scaled down: kube-rs watchers without back-off, the apiserver down for 5 s.

``python -m bench.kubers_outage`` measures 20 watchers and 30 s (figures in the README); this
runs 5 watchers and 5 s and checks the shape: through watchproxy the apiserver sees no more
connection attempts than the back-off schedule allows, straight it sees far more, and through
watchproxy every watcher gets every pod once, in order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kubers_outage import scenario
from tests.clients.build_rust_node import ToolchainMissing, build_kubewatch, on_ci

OUTAGE = 5.0
WATCHERS = 5


@pytest.fixture(scope="session")
def kubewatch() -> Path:
    try:
        return build_kubewatch()
    except ToolchainMissing as exc:
        if on_ci():
            pytest.fail(f"{exc} (CI=true: a missing toolchain is a failure)")
        pytest.skip(str(exc))


async def test_kubers_without_backoff_hammers_a_down_apiserver_but_not_through_watchproxy(
    kubewatch: Path, tmp_path: Path
) -> None:
    runs = {
        route: await scenario(
            route, outage=OUTAGE, watchers=WATCHERS, kubewatch=kubewatch, workdir=tmp_path / route
        )
        for route in ("direct", "watchproxy")
    }
    direct, proxied = runs["direct"], runs["watchproxy"]
    # One shared upstream watch on the client-go schedule (0.8 s doubling, jittered): a handful
    # of attempts in 5 s; the README's bound for 30 s is 8.
    assert 1 <= proxied["connection_attempts_during_outage"] <= 8, proxied
    assert proxied["kube_rs_errors"] == 0, proxied  # the streams stayed open
    assert proxied["every_watcher_got_every_pod_once_in_order"], proxied
    # Each watcher re-connects the moment it fails: hundreds of attempts even on a slow machine.
    assert direct["connection_attempts_during_outage"] >= 100, direct
    assert (
        direct["connection_attempts_during_outage"]
        >= 20 * proxied["connection_attempts_during_outage"]
    ), (direct, proxied)
