"""Many clients listing one large collection every second: what reaches the apiserver?

    .venv/bin/python -m bench.lists [--clients 100] [--pods 10000] [--seconds 10]

The fake apiserver (in this process) holds ``--pods`` pods (bench.collection's shape). watchproxy
runs as its own process, once with LIST batching (``limits.list_batch_max_bytes``, the default)
and once without (0). Each client lists the pods (no resourceVersion: a consistent read) once a
second at its own phase for ``--seconds``. Reported per run: client LISTs answered, upstream
LISTs the fake served, upstream LIST bytes (the LIST's body size times their count), and the
clients' p50/p99 latency of the 200s (watchproxy's upstream rate limit, ``ratelimit.qps``,
answers 429 to what it cannot send in time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

import aiohttp

from bench.collection import realistic_pod
from bench.outage import PODS, start_target
from kubefake import FakeApiServer


async def client(
    session: aiohttp.ClientSession,
    url: str,
    until: float,
    phase: float,
    latencies: list[float],
    statuses: dict[int, int],
) -> None:
    await asyncio.sleep(phase)
    while time.monotonic() < until:
        started = time.monotonic()
        async with session.get(url) as response:
            await response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
        if response.status == 200:
            latencies.append(time.monotonic() - started)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


async def run_once(
    fake: FakeApiServer, kubeconfig: str, clients: int, seconds: float, batch: bool
) -> dict[str, Any]:
    os.environ["WATCHPROXY_LIMITS_LIST_BATCH_MAX_BYTES"] = str(64 * 2**20 if batch else 0)
    process, base = await start_target("watchproxy", kubeconfig)
    try:
        fake.stats.reset()
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        until = time.monotonic() + seconds
        rng = random.Random(1)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
        ) as session:
            await asyncio.gather(
                *(
                    client(session, base + PODS, until, rng.random(), latencies, statuses)
                    for _ in range(clients)
                )
            )
        upstream = [r for r in fake.stats.requests if r.path == PODS and not r.watch]
    finally:
        process.terminate()
        await process.wait()
    latencies.sort()
    return {
        "client_answers": statuses,
        "upstream_lists": len(upstream),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
    }


async def run(clients: int, pods: int, seconds: float) -> dict[str, Any]:
    async with FakeApiServer() as fake:
        for i in range(pods):
            fake.store.create("pods", "default", realistic_pod(i))
        body = fake.store.list("pods", "default")
        list_bytes = len(json.dumps({"items": body}, separators=(",", ":")))
        kubeconfig = fake.write_kubeconfig(os.path.join(tempfile.mkdtemp(), "kubeconfig"))
        result: dict[str, Any] = {"clients": clients, "pods": pods, "list_bytes": list_bytes}
        for batch in (False, True):
            figures = await run_once(fake, kubeconfig, clients, seconds, batch)
            figures["upstream_list_bytes"] = figures["upstream_lists"] * list_bytes
            result["batched" if batch else "unbatched"] = figures
        result["loadavg"] = os.getloadavg()[0]
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.clients, args.pods, args.seconds)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
