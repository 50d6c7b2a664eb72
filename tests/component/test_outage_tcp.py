"""Outage and recovery through a fault-injecting TCP proxy, with 50 real clients of five kinds,
every client's events checked against the fake apiserver's record (tests/outage_scenario.py).

This is the short version: a 3 s outage. ``scripts/faults.sh --runs 20`` repeats the full
30 s version for the record.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.outage_scenario import run_once

# The prober's schedule (0.8 s, x2, proportional jitter) allows at most 3 dials in 3 s, plus
# the failed dial that starts the outage.
MAX_ATTEMPTS = 4


@pytest.mark.timeout(240)
async def test_outage_and_recovery_every_client_ends_with_the_apiservers_events(
    tmp_path: Any,
) -> None:
    outcome = await run_once(str(tmp_path), outage=3.0, clients=50, kubectls=2, settle=40)
    assert outcome.problems == [], "\n".join(outcome.problems[:20])
    assert outcome.attempts <= MAX_ATTEMPTS, outcome.line(0)
    assert len(outcome.latencies) == outcome.clients
