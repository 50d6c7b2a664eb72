"""kubectl through watchproxy while the apiserver is gone: a prompt, clear error, not a hang.

client-go retries a 503 that carries a Retry-After up to 10 times, and kubectl's discovery
repeats that per attempt; with the prober's delay as Retry-After, kubectl hung for minutes.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests.harness import kubectl, running_proxy, wait_for

DEADLINE = 15.0


@pytest.mark.parametrize("discovery", ["cached", "cold"])
async def test_kubectl_get_fails_within_15s_during_an_outage(tmp_path: Any, discovery: str) -> None:
    cache = os.path.join(tmp_path, "kubectl-cache")
    async with running_proxy(tmp_path) as running:
        if discovery == "cached":
            code, _, err = await kubectl(running.kubeconfig, "get", "pods", "--cache-dir", cache)
            assert code == 0, err
        await running.fake.faults.outage("reset")
        started = time.monotonic()
        code, _, err = await kubectl(
            running.kubeconfig, "get", "pods", "--cache-dir", cache, timeout=60
        )
        took = time.monotonic() - started
        assert code != 0
        assert took < DEADLINE, f"kubectl took {took:.1f}s"
        if discovery == "cached":
            assert "unreachable" in err, err  # the Status message reaches the user
        await wait_for(lambda: running.proxy.connectivity.down, what="the outage to be seen")
        await running.fake.faults.recover()
        await wait_for(lambda: running.proxy.connectivity.up, timeout=30, what="recovery")
