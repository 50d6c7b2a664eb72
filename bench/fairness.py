"""Fairness between clients: nine quiet clients (one LIST a second each, from 127.0.0.11-19)
beside one noisy client (500 LISTs a second from 127.0.0.2), through watchproxy.

    .venv/bin/python -m bench.fairness [--seconds 20] [--rate 500]

watchproxy runs as its own process (as in a pod), and so does the noisy client, so the quiet
clients' latency shows what the proxy's policy does to them, not what sharing this process's event
loop with 500 requests a second would. The fake apiserver runs here. Prints the quiet clients'
p50/p99 unloaded and loaded, the ratio, and what the noisy client got; exits 1 if the loaded
p99 is more than twice the unloaded one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import aiohttp

from bench.outage import PODS, start_target
from kubefake import FakeApiServer

QUIET_SOURCES = [f"127.0.0.{11 + i}" for i in range(9)]


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


async def timed_get(session: aiohttp.ClientSession, url: str) -> tuple[int, float]:
    started = time.monotonic()
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as response:
        await response.read()
        return response.status, time.monotonic() - started


def session_from(address: str) -> aiohttp.ClientSession:
    """Connections from ``address``: another pod, as the proxy sees it."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0), limit=0))


async def quiet_clients(url: str, seconds: float) -> list[float]:
    latencies: list[float] = []

    async def one(address: str, offset: float) -> None:
        async with session_from(address) as session:
            await asyncio.sleep(offset)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                tick = time.monotonic()
                status, latency = await timed_get(session, url)
                if status != 200:
                    raise RuntimeError(f"a quiet client got {status}")
                latencies.append(latency)
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

    await asyncio.gather(*(one(address, i / 9) for i, address in enumerate(QUIET_SOURCES)))
    return latencies


async def noisy_client(url: str, rate: float) -> None:
    """Open loop until stdin closes: a LIST every 1/rate s; prints the status counts."""
    statuses: Counter[int] = Counter()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    stopped = asyncio.ensure_future(reader.read())
    async with session_from("127.0.0.2") as session, asyncio.TaskGroup() as group:

        async def one() -> None:
            try:
                status, _ = await timed_get(session, url)
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            statuses[status] += 1

        next_at = time.monotonic()
        while not stopped.done():
            group.create_task(one())
            next_at += 1.0 / rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    print(json.dumps(dict(statuses)), flush=True)


async def measure(seconds: float, rate: float) -> dict[str, Any]:
    async with FakeApiServer() as fake:
        kubeconfig = fake.write_kubeconfig(os.path.join(tempfile.mkdtemp(), "kubeconfig"))
        proxy, base = await start_target("watchproxy", kubeconfig)
        try:
            url = base + PODS
            unloaded = await quiet_clients(url, seconds)
            noisy = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.fairness", "--noisy", url, "--rate", str(rate),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert noisy.stdin is not None
            try:
                await asyncio.sleep(2.0)  # the burst is spent and the noisy queue is full
                loaded = await quiet_clients(url, seconds)
            finally:
                noisy.stdin.close()
                out, _ = await asyncio.wait_for(noisy.communicate(), 60)
            noisy_statuses = json.loads(out or b"{}")
        finally:
            proxy.terminate()
            with contextlib.suppress(ProcessLookupError):
                await asyncio.wait_for(proxy.wait(), 10)
    return {
        "unloaded": {
            "requests": len(unloaded),
            "p50_ms": round(statistics.median(unloaded) * 1000, 1),
            "p99_ms": round(p99(unloaded) * 1000, 1),
        },
        "loaded": {
            "requests": len(loaded),
            "p50_ms": round(statistics.median(loaded) * 1000, 1),
            "p99_ms": round(p99(loaded) * 1000, 1),
        },
        "p99_ratio": round(p99(loaded) / p99(unloaded), 2),
        "noisy_statuses": noisy_statuses,
        "loadavg": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--noisy", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.noisy:
        asyncio.run(noisy_client(args.noisy, args.rate))
        return 0
    result = asyncio.run(measure(args.seconds, args.rate))
    print(json.dumps(result, indent=2))
    return 0 if result["p99_ratio"] <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
