"""Many clients listing one large collection every second: what reaches the apiserver?

    .venv/bin/python -m bench.lists [--clients 100] [--pods 10000] [--seconds 10] [--writes 5]
                                    [--limit 500]

The fake apiserver (in this process) holds ``--pods`` pods (bench.collection's shape); one pod's
labels change ``--writes`` times a second, and one client watches the pods through watchproxy
(so the key has a shared watch), in every run. watchproxy runs as its own process three times:
without LIST batching (``limits.list_batch_max_bytes`` 0, ``hub.consistent_list_wait_seconds``
0), with batching, and with batching and consistent LISTs from the hub (both defaults). Each
client lists the pods (no resourceVersion: a consistent read) once a second at its own phase for
``--seconds``; with ``--limit`` it reads each list in pages of that many, following the continue
tokens, as ``kubectl get`` does (500). Reported per run: client LISTs answered, full upstream
LISTs, continuations and one-item probes the fake served, upstream LIST bytes, and the clients'
p50/p99 latency of the 200s (a whole list, every page of it; watchproxy's upstream rate limit,
``ratelimit.qps``, answers 429 to what it cannot send in time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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


async def list_once(session: aiohttp.ClientSession, url: str, limit: int) -> int:
    """One whole LIST (every page when ``limit``); the status of the last answer."""
    token = ""
    while True:
        query = f"?limit={limit}" + (f"&continue={token}" if token else "") if limit else ""
        async with session.get(url + query) as response:
            body = await response.read()
            if response.status != 200 or not limit:
                return response.status
        token = continue_of(body)
        if not token:
            return 200


def continue_of(body: bytes) -> str:
    """The page's continue token, read from the list's metadata at its head: parsing every
    1 MB page in this process (which also runs the fake) would time the bench, not the server."""
    head = body[:4096]
    at = head.find(b'"continue":"')
    if at < 0:
        return ""
    start = at + len(b'"continue":"')
    return head[start : head.index(b'"', start)].decode()


async def client(
    session: aiohttp.ClientSession,
    url: str,
    until: float,
    phase: float,
    latencies: list[float],
    statuses: dict[int, int],
    limit: int,
) -> None:
    await asyncio.sleep(phase)
    while time.monotonic() < until:
        started = time.monotonic()
        status = await list_once(session, url, limit)
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            latencies.append(time.monotonic() - started)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


async def watch_and_write(
    fake: FakeApiServer, session: aiohttp.ClientSession, base: str, writes: float
) -> None:
    """One client watch through watchproxy, and one pod relabelled ``writes`` times a second."""

    async def write() -> None:
        for n in range(10_000_000):
            fake.store.patch_labels(
                "pods", "default", realistic_pod(0)["metadata"]["name"], {"bench": str(n)}
            )
            await asyncio.sleep(1.0 / writes)

    url = base + PODS + "?watch=1&allowWatchBookmarks=true"
    async with session.get(url) as response, asyncio.TaskGroup() as group:
        group.create_task(write())
        async for _ in response.content.iter_any():
            pass


RUNS = {"unbatched": (0, 0.0), "batched": (64 * 2**20, 0.0), "hub": (64 * 2**20, 0.5)}


async def run_once(
    fake: FakeApiServer,
    kubeconfig: str,
    clients: int,
    seconds: float,
    writes: float,
    name: str,
    limit: int,
) -> dict[str, Any]:
    batch_bytes, wait = RUNS[name]
    os.environ["WATCHPROXY_LIMITS_LIST_BATCH_MAX_BYTES"] = str(batch_bytes)
    os.environ["WATCHPROXY_HUB_CONSISTENT_LIST_WAIT_SECONDS"] = str(wait)
    process, base = await start_target("watchproxy", kubeconfig)
    background: asyncio.Task[None] | None = None
    try:
        watcher = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        background = asyncio.create_task(watch_and_write(fake, watcher, base, writes))
        await asyncio.sleep(1.0)  # the shared watch is synced and the collection moving
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
                    client(session, base + PODS, until, rng.random(), latencies, statuses, limit)
                    for _ in range(clients)
                )
            )
        upstream = [r for r in fake.stats.requests if r.path == PODS and not r.watch]
    finally:
        if background is not None:
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
            await watcher.close()
        process.terminate()
        await process.wait()
    latencies.sort()
    probes = [r for r in upstream if r.query_string == "limit=1"]
    pages = [r for r in upstream if "continue=" in r.query_string]
    return {
        "client_answers": statuses,
        "upstream_lists": len(upstream) - len(probes) - len(pages),
        "upstream_continuations": len(pages),
        "upstream_probes": len(probes),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
    }


async def run(clients: int, pods: int, seconds: float, writes: float, limit: int) -> dict[str, Any]:
    async with FakeApiServer() as fake:
        for i in range(pods):
            fake.store.create("pods", "default", realistic_pod(i))
        body = fake.store.list("pods", "default")
        list_bytes = len(json.dumps({"items": body}, separators=(",", ":")))
        kubeconfig = fake.write_kubeconfig(os.path.join(tempfile.mkdtemp(), "kubeconfig"))
        probe_bytes = len(json.dumps({"items": body[:1]}, separators=(",", ":")))
        result: dict[str, Any] = {"clients": clients, "pods": pods, "list_bytes": list_bytes}
        result["limit"] = limit
        # A whole list is one upstream LIST, or ceil(pods / limit) pages of about equal size.
        per_request = list_bytes / math.ceil(pods / limit) if limit else list_bytes
        for name in RUNS:
            figures = await run_once(fake, kubeconfig, clients, seconds, writes, name, limit)
            requests = figures["upstream_lists"] + figures["upstream_continuations"]
            figures["upstream_list_bytes"] = round(
                requests * per_request + figures["upstream_probes"] * probe_bytes
            )
            result[name] = figures
        result["loadavg"] = os.getloadavg()[0]
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--writes", type=float, default=5.0, help="pod updates per second")
    parser.add_argument("--limit", type=int, default=0, help="read each list in pages of this")
    args = parser.parse_args()
    result = asyncio.run(run(args.clients, args.pods, args.seconds, args.writes, args.limit))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
