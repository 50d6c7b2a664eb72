"""The fan-out benchmark still runs end to end and every client gets every event once, in order.

Not a timed test: it asserts completion and zero loss, never a throughput or a latency.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.gobuild import go_binary
from tests.clients.build import ToolchainMissing
from tests.clients.build_rust_node import on_ci

ROOT = Path(__file__).resolve().parents[2]


def go_programs_or_skip(*names: str) -> None:
    """Build the bench's Go programs; without Go the test skips, except on CI."""
    try:
        for name in names:
            go_binary(name)
    except ToolchainMissing as exc:
        if on_ci():
            pytest.fail(f"{exc} (CI=true: a missing toolchain is a failure)")
        pytest.skip(str(exc))


def run_fanout(out: Path, *args: str) -> list[dict[str, Any]]:
    """``bench.fanout --quick --subscribers 1,5 --events 50 --rate 200 ARGS``: its cells, once
    it exited 0 (nothing lost, repeated or reordered)."""
    command = [sys.executable, "-m", "bench.fanout", "--quick", "--subscribers", "1,5"]
    command += ["--events", "50", "--rate", "200", "--json", str(out), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells: list[dict[str, Any]] = json.loads(out.read_text())["cells"]
    return cells


@pytest.mark.parametrize("sub_impl", ["go", "python"])
def test_fanout_benchmark_runs_and_loses_nothing(tmp_path: Path, sub_impl: str) -> None:
    if sub_impl == "go":
        go_programs_or_skip("gosub")
    modes = ("direct", "proxy", "ceiling")
    args = ["--sub-impl", sub_impl]
    if sub_impl == "go":
        # The proxy's fan-out pacing on and holding every pass: it must lose nothing either.
        args += ["--proxy-set", "hub.fanout_max_delay_seconds=0.05"]
        args += ["--proxy-set", "hub.fanout_cpu_share=0.001"]
    cells = run_fanout(tmp_path / "fanout.json", *args)
    assert {(c["phase"], c["subscribers"], c["mode"]) for c in cells} == {
        (phase, count, mode) for phase in ("paced", "max") for count in (1, 5) for mode in modes
    }
    for cell in cells:
        assert cell["faults"] == 0 and not cell["errors"], cell
        expected = cell["events"] * cell["subscribers"]
        assert cell["delivered"] == expected, cell
    by_mode = {(c["phase"], c["subscribers"], c["mode"]): c for c in cells}
    # One upstream watch however many clients, for the proxy and the ceiling; N when direct.
    assert by_mode[("max", 5, "proxy")]["upstream_watches"] == 1
    assert by_mode[("max", 5, "ceiling")]["upstream_watches"] == 1
    assert by_mode[("max", 5, "direct")]["upstream_watches"] == 5


def test_kubectl_proxy_behind_the_tls_relay_gets_every_event(tmp_path: Path) -> None:
    """bench/gobroadcast: kubectl proxy's watches share the relay's one upstream watch."""
    go_programs_or_skip("gobroadcast", "gosub")
    cells = run_fanout(
        tmp_path / "relay.json", "--phases", "paced", "--modes", "kubectl", "--kubectl-via-relay"
    )
    assert [(c["subscribers"], c["mode"]) for c in cells] == [(1, "kubectl"), (5, "kubectl")]
    for cell in cells:
        assert cell["faults"] == 0 and not cell["errors"], cell
        assert cell["delivered"] == cell["events"] * cell["subscribers"], cell
        assert cell["upstream_watches"] == 1, cell  # the relay's, however many kubectl opened


def test_outage_comparison_runs_and_loses_nothing() -> None:
    command = [sys.executable, "-m", "bench.outage", "--outage", "2", "--clients", "10"]
    command += ["--only", "watchproxy"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [result] = json.loads(done.stdout[: done.stdout.index("]") + 1])
    assert result["every_watcher_got_every_event_once_in_order"]
    assert result["watch_reconnects"] == 0  # streams stayed open through the outage


def test_gzip_watchers_benchmark_runs_and_compresses_each_event_once(tmp_path: Path) -> None:
    out = tmp_path / "gzip.json"
    command = [sys.executable, "-m", "bench.gzip_watchers", "--watchers", "1,5"]
    command += ["--events", "30", "--rate", "100", "--objects", "5", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = json.loads(out.read_text())
    assert [(c["watchers"], c["coding"]) for c in cells] == [
        (n, coding) for n in (1, 5) for coding in ("identity", "gzip", "gzip")
    ]
    # A count, not a timing: 5 gzip watchers cost one compression per event (or fewer, when
    # events go out together), not 5.
    for cell in cells:
        if cell["compressions"] is not None:
            assert 0 < cell["compressions"] <= cell["events"], cell
        assert cell["wire_per_event"] > 0


def test_a_baseline_from_a_git_worktree_runs_beside_the_proxy(tmp_path: Path) -> None:
    """--baseline REF: watchproxy as it was at REF, in the same rounds, and the worktree goes."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    go_programs_or_skip("gosub")
    cells = run_fanout(
        tmp_path / "baseline.json", "--phases", "paced", "--modes", "proxy", "--baseline", "HEAD"
    )
    assert [(c["subscribers"], c["mode"]) for c in cells] == [
        (1, "proxy"), (1, "baseline"), (5, "proxy"), (5, "baseline"),
    ]  # fmt: skip
    for cell in cells:
        assert cell["faults"] == 0 and not cell["errors"], cell
        assert cell["delivered"] == cell["events"] * cell["subscribers"], cell
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    )
    assert "baseline" not in listed.stdout


def test_syncs_benchmark_runs_every_cell_within_the_shipped_limits(tmp_path: Path) -> None:
    """``bench.syncs`` with a small collection: every client of every cell synced (the bench
    checks each one's count of pods), through watchproxy as shipped and kubectl proxy when
    there is one, each watchproxy under its shipped memory limit."""
    targets = "sidecar,node-local" + (",kubectl" if shutil.which("kubectl") else "")
    out = tmp_path / "syncs.json"
    command = [sys.executable, "-m", "bench.syncs", "--pods", "500", "--clients", "3"]
    command += ["--targets", targets, "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = json.loads(out.read_text())["cells"]
    assert [(c["target"], c["kind"]) for c in cells] == [
        (target, kind) for kind in ("watch-list", "list-watch") for target in targets.split(",")
    ]
    for cell in cells:
        if cell["limit (MiB)"]:
            assert cell["peak RSS (MiB)"] < cell["limit (MiB)"], cell
