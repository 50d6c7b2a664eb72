"""Fair shares of the upstream budget between clients (node-local mode above all).

Each source address is a flow (a pod, in node-local mode). While requests queue for the token
bucket or a concurrency slot, waiting flows take turns: a client looping on LISTs gets no more
than its share while others want some, and the whole budget while they do not.

``-m slow`` runs the issue's measurement: one client at 500 requests/s and nine at 1/s; the
nine's p99 latency must stay within twice their unloaded p99 (printed with ``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.harness import Running, running_proxy

PODS = "/api/v1/namespaces/default/pods"


@contextlib.asynccontextmanager
async def client_from(address: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client whose connections come from ``address`` (another pod, as the proxy sees it)."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def timed_get(session: aiohttp.ClientSession, url: str) -> tuple[int, float]:
    started = time.monotonic()
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as response:
        await response.read()
        return response.status, time.monotonic() - started


async def test_a_noisy_client_cannot_take_the_whole_upstream_budget(tmp_path: Any) -> None:
    overrides = {"ratelimit.qps": 20, "ratelimit.burst": 1, "ratelimit.max_wait_seconds": 5}
    async with (
        running_proxy(tmp_path, overrides) as running,
        client_from("127.0.0.2") as noisy,
        client_from("127.0.0.3") as quiet,
    ):
        url = running.url + PODS
        # 200 LISTs at once: at 20/s that is a 10 s queue, half of it past max_wait.
        flood = [asyncio.create_task(timed_get(noisy, url)) for _ in range(200)]
        try:
            await asyncio.sleep(0.2)  # the noisy queue is long now
            quiet_answers = [await timed_get(quiet, url) for _ in range(5)]
        finally:
            noisy_answers = await asyncio.gather(*flood)
        assert [status for status, _ in quiet_answers] == [200] * 5, quiet_answers
        # Each quiet request waits for about one turn (a token is 50 ms), not for the queue.
        assert max(seconds for _, seconds in quiet_answers) < 0.5, quiet_answers
        statuses = [status for status, _ in noisy_answers]
        assert statuses.count(200) >= 50  # the noisy client still gets the rest of the budget
        assert set(statuses) <= {200, 429}


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


async def _quiet_clients(running: Running, seconds: float) -> list[float]:
    """Nine clients (127.0.0.11-19), one LIST per second each; every latency."""
    url = running.url + PODS
    latencies: list[float] = []

    async def one(address: str, offset: float) -> None:
        async with client_from(address) as session:
            await asyncio.sleep(offset)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                tick = time.monotonic()
                status, latency = await timed_get(session, url)
                assert status == 200, status
                latencies.append(latency)
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

    await asyncio.gather(*(one(f"127.0.0.{11 + i}", i / 9) for i in range(9)))
    return latencies


async def _noisy_client(running: Running, rate: float, stop: asyncio.Event) -> list[int]:
    """Open loop: a LIST every 1/rate s from 127.0.0.2, whatever the answers."""
    url = running.url + PODS
    statuses: list[int] = []
    async with client_from("127.0.0.2") as session, asyncio.TaskGroup() as group:

        async def one() -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                status, _ = await timed_get(session, url)
                statuses.append(status)

        next_at = time.monotonic()
        while not stop.is_set():
            group.create_task(one())
            next_at += 1.0 / rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return statuses


@pytest.mark.slow
async def test_nine_quiet_clients_keep_their_latency_beside_a_noisy_one(tmp_path: Any) -> None:
    seconds = 20.0
    async with running_proxy(tmp_path) as running:  # default budget: 50 qps, burst 100
        unloaded = await _quiet_clients(running, seconds)
        stop = asyncio.Event()
        noisy = asyncio.create_task(_noisy_client(running, 500.0, stop))
        try:
            await asyncio.sleep(2.0)  # the burst is spent and the queue is full
            loaded = await _quiet_clients(running, seconds)
        finally:
            stop.set()
            statuses = await noisy
    print(
        f"\nunloaded: {len(unloaded)} requests, p50 {statistics.median(unloaded) * 1000:.1f} ms,"
        f" p99 {p99(unloaded) * 1000:.1f} ms"
        f"\nbeside 500 req/s: {len(loaded)} requests, p50 {statistics.median(loaded) * 1000:.1f}"
        f" ms, p99 {p99(loaded) * 1000:.1f} ms"
        f"\nnoisy client: {len(statuses)} answered, {statuses.count(200)} x 200,"
        f" {statuses.count(429)} x 429"
    )
    assert p99(loaded) <= 2 * p99(unloaded)
