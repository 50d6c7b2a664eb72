"""Outage comparison: how hard do 50 clients hit a dead apiserver through watchproxy, and
through ``kubectl proxy``, in the same scenario?

    .venv/bin/python -m bench.outage [--outage 30] [--clients 50] [--only watchproxy|kubectl]

The fake apiserver runs here in "reset" outage mode: it keeps accepting TCP connections and
resets each one at once, counting them, so every attempt to reach it is seen. The clients have
no backoff at all: 30 hold a watch and re-open it (from their last resourceVersion) the moment
it ends or fails; 20 list in a tight loop. After the outage, every watcher must have every event
once, in order. Exits non-zero if that fails through watchproxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kubefake import FakeApiServer

PODS = "/api/v1/namespaces/default/pods"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Watcher:
    """A client like the Python client's watch loop without backoff."""

    rv: str = ""
    names: list[str] = field(default_factory=list)
    reconnects: int = 0


async def watch_forever(
    session: aiohttp.ClientSession, base: str, w: Watcher, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        url = f"{base}{PODS}?watch=1&labelSelector=app%3Dweb"
        if w.rv:
            url += f"&resourceVersion={w.rv}"
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    await response.read()
                else:
                    async for raw in response.content:
                        event = json.loads(raw)
                        if event["type"] == "ERROR":
                            w.rv = ""  # 410: start over, as the client would
                            break
                        w.rv = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] == "ADDED":
                            w.names.append(event["object"]["metadata"]["name"])
                        if stop.is_set():
                            return
        except (TimeoutError, aiohttp.ClientError):
            pass
        w.reconnects += 1
        await asyncio.sleep(0)  # no backoff: this is the client the proxy protects against


async def list_forever(session: aiohttp.ClientSession, base: str, stop: asyncio.Event) -> int:
    count = 0
    while not stop.is_set() and count < 1_000_000:
        try:
            async with session.get(f"{base}{PODS}?labelSelector=app%3Dweb") as response:
                await response.read()
        except aiohttp.ClientError:
            pass
        count += 1
        await asyncio.sleep(0)
    return count


async def start_target(
    kind: str, kubeconfig: str, *, ready_path: str = PODS
) -> tuple[asyncio.subprocess.Process, str]:
    """Start watchproxy or kubectl proxy; ready once ``ready_path`` answers 200 through it."""
    port = free_port()
    if kind == "watchproxy":
        args = [
            sys.executable, "-m", "watchproxy", "run", "--kubeconfig", kubeconfig,
            "--listen-port", str(port), "--admin-host", "127.0.0.1",
            "--admin-port", str(free_port()), "--log-level", "warning",
        ]  # fmt: skip
    else:
        args = ["kubectl", "proxy", "--kubeconfig", kubeconfig, "--port", str(port)]
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{base}{ready_path}") as response:
                    if response.status == 200:
                        return process, base
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{kind} did not start")
            await asyncio.sleep(0.1)


async def scenario(kind: str, outage: float, clients: int) -> dict[str, Any]:
    async with FakeApiServer(bookmark_interval=1.0) as fake:
        for i in range(5):
            fake.store.create("pods", "default", _pod(f"web-{i}"))
        kubeconfig = fake.write_kubeconfig(os.path.join(tempfile.mkdtemp(), "kubeconfig"))
        process, base = await start_target(kind, kubeconfig)
        stop = asyncio.Event()
        watchers = [Watcher() for _ in range(clients * 3 // 5)]
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
                tasks = [
                    asyncio.ensure_future(watch_forever(session, base, w, stop)) for w in watchers
                ]
                deadline = time.monotonic() + 30
                while not all(len(w.names) >= 5 for w in watchers):
                    if time.monotonic() > deadline:
                        raise RuntimeError("watchers did not start")
                    await asyncio.sleep(0.05)
                listers = [
                    asyncio.ensure_future(list_forever(session, base, stop))
                    for _ in range(clients - len(watchers))
                ]
                fake.stats.reset()
                await fake.faults.outage("reset")
                started = time.monotonic()
                created = [
                    fake.store.create("pods", "default", _pod(f"web-during-{i}"))["metadata"][
                        "name"
                    ]
                    for i in range(3)
                ]
                await asyncio.sleep(outage)
                attempts = fake.stats.outage_connection_attempts
                outage_seconds = time.monotonic() - started
                await fake.faults.recover()
                created.append(
                    fake.store.create("pods", "default", _pod("web-after"))["metadata"]["name"]
                )
                deadline = time.monotonic() + 60
                while not all(w.names[-1:] == ["web-after"] for w in watchers):
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                stop.set()
                fake.store.create("pods", "default", _pod("web-last"))
                requests = sum(await asyncio.wait_for(asyncio.gather(*listers), 30))
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            process.terminate()
            with contextlib.suppress(ProcessLookupError):
                await asyncio.wait_for(process.wait(), 10)
        complete = all(
            [n for n in w.names if n.startswith("web-") and not n.startswith("web-last")][5:]
            == created
            for w in watchers
        )
        return {
            "target": kind,
            "outage_seconds": round(outage_seconds, 1),
            "upstream_connection_attempts": attempts,
            "client_requests_during_outage": requests,
            "watch_reconnects": sum(w.reconnects for w in watchers),
            "every_watcher_got_every_event_once_in_order": complete,
        }


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def main(args: argparse.Namespace) -> int:
    results = []
    for kind in ("watchproxy", "kubectl"):
        if args.only and args.only != kind:
            continue
        results.append(await scenario(kind, args.outage, args.clients))
    print(json.dumps(results, indent=2))
    header = f"{'target':<12}{'attempts':>10}{'client reqs':>13}{'reconnects':>12}  complete"
    print(header)
    for r in results:
        print(
            f"{r['target']:<12}{r['upstream_connection_attempts']:>10}"
            f"{r['client_requests_during_outage']:>13}{r['watch_reconnects']:>12}  "
            f"{r['every_watcher_got_every_event_once_in_order']}"
        )
    ours = [r for r in results if r["target"] == "watchproxy"]
    return 0 if all(r["every_watcher_got_every_event_once_in_order"] for r in ours) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--only", choices=("watchproxy", "kubectl"))
    sys.exit(asyncio.run(main(parser.parse_args())))
