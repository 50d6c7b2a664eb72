"""The real-apiserver soak (``bench.soak_real``), short: 20 clients through watchproxy and the
fault relay to kube-apiserver for ``WATCHPROXY_SOAK_REAL_SECONDS`` (20 s by default; the 20-minute
run is ``python -m bench.soak_real --duration 1200 --clients 100``). Faults come in shuffled
rounds of every kind, one every 1.5-4.5 s; the run must end with no violation: nothing lost,
repeated or reordered against the admin watch's record, every final state equal to the
apiserver's, watchproxy's fds and tasks back at their start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realapi.fixture import binary_problem, ci_requires_tier

SECONDS = float(os.environ.get("WATCHPROXY_SOAK_REAL_SECONDS", "20"))
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_soak_through_tcp_faults_and_restarts_loses_repeats_and_leaks_nothing() -> None:
    problem = binary_problem()
    if problem is not None:
        if ci_requires_tier():
            pytest.fail(f"CI=true and the real apiserver is unavailable: {problem}")
        pytest.skip(problem)
    command = [
        sys.executable, "-m", "bench.soak_real", "--duration", str(SECONDS),
        "--clients", "20", "--fault-interval", "3", "--seed", "3",
        "--report-interval", str(SECONDS), "--settle", "40",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=SECONDS + 240, check=False
    )
    output = done.stdout + done.stderr
    tail = "\n".join(output.splitlines()[-30:])  # bounded: the summary and the first violations
    assert done.returncode == 0, tail
    assert "OK: no lost, duplicated or reordered event" in output, tail
    assert "faults injected: 0 " not in output, tail
