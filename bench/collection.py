"""A large collection: how long the first watch takes to sync, and what holding it costs.

    .venv/bin/python -m bench.collection [--pods 10000] [--syncs 20] [--kubectl-proxy]
                                         [--cache-budget-mib M]

The fake apiserver (in this process) holds ``--pods`` pods of about 2.8 KB of JSON each (the
size issue 13 measured: 10,000 pods = 28 MB). The target (watchproxy, and ``kubectl proxy`` when
asked, one after the other) runs as its own process; its RSS comes from /proc. Reported per
target: RSS before; the first watch without a resourceVersion read to its last initial ADDED
(seconds); RSS with that watch open (for watchproxy, the hub now caches the collection), the
growth per byte of the collection's JSON; then ``--syncs`` more such watches at once, read to
the end, and the RSS peak while they run. watchproxy serves all of them from its cache: the
fake sees one LIST; ``kubectl proxy`` sends each to the apiserver. With ``--cache-budget-mib``
(``hub.cache_max_bytes``) smaller than the collection, watchproxy passes the watches through
instead of caching: its RSS growth must stay under the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from typing import Any

import aiohttp

from bench.backlog import rss_bytes
from bench.outage import PODS, start_target
from kubefake import FakeApiServer


def realistic_pod(i: int) -> dict[str, Any]:
    """A pod shaped like a Deployment's, about 2.8 KB of compact JSON."""
    name = f"web-{i:06}"
    return {
        "metadata": {
            "name": name,
            "generateName": "web-6d4cf56db6-",
            "labels": {"app": "web", "pod-template-hash": "6d4cf56db6", "tier": "frontend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-6d4cf56db6",
                    "uid": f"{i:08x}-1111-2222-3333-444455556666",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example.com/web:1.27.3",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": f"SETTING_{k}", "value": f"value-{k}-{i}"} for k in range(12)],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "500m", "memory": "256Mi"},
                    },
                    "volumeMounts": [
                        {
                            "name": "kube-api-access",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "nodeName": f"node-{i % 100:03}",
            "serviceAccountName": "default",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            "hostIP": f"192.168.0.{i % 100}",
            "startTime": "2026-12-01T10:00:00Z",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-12-01T10:00:05Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "web",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example.com/web:1.27.3",
                    "imageID": "registry.example.com/web@sha256:" + "0" * 64,
                    "containerID": f"containerd://{i:064x}",
                    "state": {"running": {"startedAt": "2026-12-01T10:00:04Z"}},
                }
            ],
        },
    }


async def read_initial(session: aiohttp.ClientSession, base: str, pods: int) -> float:
    """Open a watch without a resourceVersion; seconds until its ``pods`` ADDED have arrived."""
    started = time.monotonic()
    added = 0
    async with session.get(f"{base}{PODS}?watch=1") as response:
        async for line in response.content:
            if line.startswith(b'{"type":"ADDED"'):
                added += 1
                if added == pods:
                    return time.monotonic() - started
    raise RuntimeError(f"the watch ended after {added} of {pods} pods")


async def measure(kind: str, kubeconfig: str, pods: int, syncs: int) -> dict[str, Any]:
    # Ready when a one-item LIST answers: a whole one would pass 24 MB through the target
    # before its "RSS before" is read.
    process, base = await start_target(kind, kubeconfig, ready_path=PODS + "?limit=1")
    try:
        before = rss_bytes(process.pid)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
        ) as session:
            # The watch ends once read; the hub keeps the key for hub.linger_seconds (30 s).
            first_seconds = await read_initial(session, base, pods)
            cached = rss_bytes(process.pid)
            peak = cached
            runs = [asyncio.ensure_future(read_initial(session, base, pods)) for _ in range(syncs)]
            while not all(run.done() for run in runs):
                await asyncio.wait(runs, timeout=0.05)
                peak = max(peak, rss_bytes(process.pid))
            seconds = [run.result() for run in runs]
    finally:
        process.terminate()
        await process.wait()
    return {
        "first_watch_synced_seconds": round(first_seconds, 3),
        "rss_before_bytes": before,
        "rss_cached_bytes": cached,
        "rss_growth_bytes": cached - before,
        f"rss_peak_during_{syncs}_syncs_bytes": peak,
        f"slowest_of_{syncs}_syncs_seconds": round(max(seconds, default=0.0), 3),
    }


async def run(pods: int, syncs: int, kubectl_proxy: bool) -> dict[str, Any]:
    async with FakeApiServer() as fake:
        for i in range(pods):
            fake.store.create("pods", "default", realistic_pod(i))
        items = fake.store.list("pods", "default")
        json_bytes = sum(len(json.dumps(o, separators=(",", ":"))) for o in items)
        kubeconfig = fake.write_kubeconfig(os.path.join(tempfile.mkdtemp(), "kubeconfig"))
        result: dict[str, Any] = {"pods": pods, "json_bytes": json_bytes}
        for kind in ("watchproxy", "kubectl-proxy") if kubectl_proxy else ("watchproxy",):
            figures = await measure(kind, kubeconfig, pods, syncs)
            figures["rss_growth_per_json_byte"] = round(figures["rss_growth_bytes"] / json_bytes, 2)
            result[kind] = figures
        result["loadavg"] = os.getloadavg()[0]
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--syncs", type=int, default=20)
    parser.add_argument("--kubectl-proxy", action="store_true")
    parser.add_argument("--cache-budget-mib", type=float, default=None)
    args = parser.parse_args()
    if args.cache_budget_mib is not None:
        os.environ["WATCHPROXY_HUB_CACHE_MAX_BYTES"] = str(int(args.cache_budget_mib * 2**20))
    print(json.dumps(asyncio.run(run(args.pods, args.syncs, args.kubectl_proxy)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
