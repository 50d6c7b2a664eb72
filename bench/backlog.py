"""A watch client that stops reading, beside one that keeps up: how far does watchproxy's
memory grow while the stalled client's backlog grows?

    .venv/bin/python -m bench.backlog [--megabytes 37] [--budget-mib 16] [--event-kib 10]

watchproxy runs as its own process with ``WATCHPROXY_HUB_HISTORY_MAX_BYTES`` set to the budget;
the fake apiserver runs here. One client opens a watch on the pods and never reads (a small
receive buffer, so the backlog stays in the proxy); another watches the same key and reads
everything. One pod is modified with ``--event-kib`` of padding until ``--megabytes`` of events
have gone out, in bursts that the live client reads before the next. Reported: watchproxy's RSS
before and at its peak (from /proc), the growth against the budget, and whether the live client
got every event. The stalled client holds nothing in the proxy beyond its socket buffers: it
reads the shared history, and it is ended once it falls out of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
from typing import Any

import aiohttp

from bench.outage import PODS, start_target
from kubefake import FakeApiServer


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def measure(megabytes: float, budget: int, event_kib: int) -> dict[str, Any]:
    os.environ["WATCHPROXY_HUB_HISTORY_MAX_BYTES"] = str(budget)
    padding = "x" * (event_kib * 1024)
    async with FakeApiServer() as fake:
        fake.store.create("pods", "default", {"metadata": {"name": "p"}, "spec": {}})
        kubeconfig = fake.write_kubeconfig(os.path.join(tempfile.mkdtemp(), "kubeconfig"))
        proxy, base = await start_target("watchproxy", kubeconfig)
        port = int(base.rsplit(":", 1)[1])
        try:
            before = rss_bytes(proxy.pid)
            stalled = socket.socket()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", port))
            stalled.sendall(
                f"GET {PODS}?watch=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
            )
            received = 0
            async with (
                aiohttp.ClientSession() as session,
                session.get(
                    f"{base}{PODS}?watch=1", timeout=aiohttp.ClientTimeout(total=None)
                ) as live,
            ):
                await live.content.readline()  # the ADDED of the one pod
                events = int(megabytes * 1e6 / (event_kib * 1024)) + 1
                peak = before
                for burst in range(0, events, 20):
                    count = min(20, events - burst)
                    for i in range(count):
                        fake.store.modify(
                            "pods", "default", "p", lambda o, n=burst + i: _pad(o, n, padding)
                        )
                    for _ in range(count):
                        async with asyncio.timeout(30):
                            line = await live.content.readline()
                        if json.loads(line)["type"] == "MODIFIED":
                            received += 1
                    peak = max(peak, rss_bytes(proxy.pid))
            stalled.close()
        finally:
            proxy.terminate()
            await proxy.wait()
    return {
        "megabytes_sent": round(events * event_kib * 1024 / 1e6, 1),
        "budget_bytes": budget,
        "rss_before_bytes": before,
        "rss_peak_bytes": peak,
        "rss_growth_bytes": peak - before,
        "growth_within_budget": peak - before < budget,
        "live_client_got_every_event": received == events,
        "loadavg": os.getloadavg()[0],
    }


def _pad(obj: dict[str, Any], n: int, padding: str) -> None:
    obj["metadata"].setdefault("annotations", {})["pad"] = f"{n}{padding}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=37.0)
    parser.add_argument("--budget-mib", type=float, default=16.0)
    parser.add_argument("--event-kib", type=int, default=10)
    args = parser.parse_args()
    result = asyncio.run(measure(args.megabytes, int(args.budget_mib * 2**20), args.event_kib))
    print(json.dumps(result, indent=2))
    return 0 if result["growth_within_budget"] and result["live_client_got_every_event"] else 1


if __name__ == "__main__":
    sys.exit(main())
