"""A client that re-watches in a tight loop after every error costs little (issue 18 item 4)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from tests.harness import running_proxy

MISSING = "/api/v1/namespaces/default/nosuchthings?watch=1"
PODS = "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1"


async def tight_loop(session: aiohttp.ClientSession, url: str, seconds: float) -> list[int]:
    statuses: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(statuses) < 5000:
        async with session.get(url, headers={"User-Agent": "looper/1.0"}) as response:
            await response.read()
            statuses.append(response.status)
    return statuses


async def test_watches_ending_in_errors_are_slowed_to_about_one_a_second(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        running.fake.stats.reset()
        statuses = await tight_loop(session, running.url + MISSING, 3.0)
        # The default budget: 10 at once, then one a second.
        assert 10 <= len(statuses) <= 10 + 3 + 2, len(statuses)
        assert set(statuses) == {404}
        upstream = [r for r in running.fake.stats.requests if "nosuchthings" in r.path]
        assert len(upstream) <= len(statuses)
        # Another client, and the same client on a healthy path, are not held.
        started = time.monotonic()
        async with session.get(running.url + PODS) as response:
            assert response.status == 200
            await response.read()
        assert time.monotonic() - started < 2.5


async def test_errored_watch_limit_can_be_turned_off(tmp_path: Any) -> None:
    overrides = {"ratelimit.watch_errors_per_second": 0}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        statuses = await tight_loop(session, running.url + MISSING, 1.0)
        assert len(statuses) > 30
