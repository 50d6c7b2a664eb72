"""Connectivity: what decides "down", and when the prober looks (a scripted probe, no network)."""

from __future__ import annotations

import asyncio

from tests.harness import wait_for
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import BackoffPolicy
from watchproxy.upstream.connectivity import DIAL_FAILURES_DOWN, Connectivity, ProbeFailed

POLICY = BackoffPolicy(initial=0.01, factor=2.0, cap=0.05)


class ScriptedProbe:
    """Answers what the test says; counts how often it was asked."""

    def __init__(self) -> None:
        self.ok = True
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        if not self.ok:
            raise ProbeFailed("cannot connect: Connection refused")
        return True


async def started(probe: ScriptedProbe) -> Connectivity:
    connectivity = Connectivity(probe, POLICY, Metrics(), idle_probe_interval=3600)
    connectivity.start()
    await wait_for(lambda: connectivity.up, what="first probe")
    return connectivity


async def test_one_failed_dial_is_not_an_outage_but_consecutive_ones_are() -> None:
    probe = ScriptedProbe()
    connectivity = await started(probe)
    try:
        for _ in range(DIAL_FAILURES_DOWN - 1):
            connectivity.report_dial_failure("connection refused")
        assert connectivity.up
        connectivity.report_ok()  # an answer in between starts the count again
        for _ in range(DIAL_FAILURES_DOWN - 1):
            connectivity.report_dial_failure("connection refused")
        assert connectivity.up
        probe.ok = False
        connectivity.report_dial_failure("connection refused")
        assert connectivity.down
        assert connectivity.last_error == "connection refused"
    finally:
        await connectivity.close()


async def test_a_suspicion_probes_now_and_only_the_probe_decides() -> None:
    probe = ScriptedProbe()
    connectivity = await started(probe)
    try:
        before = probe.calls
        connectivity.suspect("GET timed out")
        await wait_for(lambda: probe.calls > before, what="a probe after the suspicion")
        assert connectivity.up
        probe.ok = False
        connectivity.suspect("GET timed out")
        await wait_for(lambda: connectivity.down, what="the failed probe to mark it down")
        assert connectivity.last_error == "cannot connect: Connection refused"
        probe.ok = True
        await wait_for(lambda: connectivity.up, what="recovery on the backoff schedule")
    finally:
        await connectivity.close()


async def test_suspicions_do_not_flood_the_upstream_with_probes() -> None:
    probe = ScriptedProbe()
    connectivity = await started(probe)
    try:
        before = probe.calls
        for _ in range(50):
            connectivity.suspect("GET timed out")
            await asyncio.sleep(0)
        await asyncio.sleep(0.5)
        assert probe.calls - before <= 1  # once a second at most
    finally:
        await connectivity.close()
