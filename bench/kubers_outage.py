"""kube-rs without back-off: how hard do N ``kube_runtime::watcher``s hit an apiserver that is
down, straight and through watchproxy?

    .venv/bin/python -m bench.kubers_outage [--outage 30] [--watchers 20] [--only direct|watchproxy]

The watchers are one ``kubewatch --backoff none --watchers N`` process (tests/clients/rust,
built by ``python -m tests.clients.build_rust_node``): N kube-rs watchers on the pods of one
namespace, each with its own client and connections, polled again the moment they fail, as in
the kube-rs issue "Add backoff to watcher reconnection". The fake apiserver (TLS, bearer token)
runs in this process in "reset" outage mode: it accepts every TCP connection and resets it at
once, counting it, so every attempt to reach it is seen. Its accept loop is Python: the direct
count is what it could accept, a floor for what a real apiserver would see.

Both runs: every watcher lists and watches, then the apiserver goes down for ``--outage``
seconds with pods created during it, comes back, one more pod is created, and every watcher
must see each of those pods exactly once, in order. Reported per run: connection attempts
during the outage, requests and seconds until every watcher has the last pod after the
apiserver came back (through watchproxy that waits for the next attempt on its back-off
schedule), and the errors kube-rs printed. Exits non-zero if a watcher through watchproxy
missed or repeated a pod.
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
from pathlib import Path
from typing import Any

import aiohttp

from kubefake import FakeApiServer
from watchproxy.kube.kubeconfig import render_kubeconfig

NAMESPACE = "default"
SEED_PODS = 5
DURING_PODS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}


class Output:
    """kubewatch's stdout, written to a file (a tight loop of errors never waits on a pipe)
    and parsed on demand from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[dict[str, Any]] = []
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self._offset += end
        self.lines += [json.loads(raw) for raw in data[:end].splitlines() if raw.strip()]
        return self.lines

    def applied(self, watcher: int) -> list[str]:
        return [
            line["name"]
            for line in self.lines
            if line.get("watcher") == watcher and line["type"] == "Apply"
        ]


async def until(predicate: Any, *, timeout: float, what: str, every: float = 0.1) -> None:
    """Poll ``predicate`` (it reads a file another process writes: nothing to await)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)


async def start_watchproxy(upstream_kubeconfig: str) -> tuple[asyncio.subprocess.Process, str]:
    port, admin_port = free_port(), free_port()
    args = [
        sys.executable, "-m", "watchproxy", "run", "--kubeconfig", upstream_kubeconfig,
        "--listen-port", str(port), "--admin-host", "127.0.0.1",
        "--admin-port", str(admin_port), "--log-level", "warning",
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    ready = f"http://127.0.0.1:{admin_port}/readyz"
    deadline = time.monotonic() + 20
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(ready) as response:
                    if response.status == 200:
                        return process, base
            if time.monotonic() > deadline:
                process.kill()
                await process.wait()
                raise RuntimeError("watchproxy did not become ready")
            await asyncio.sleep(0.1)


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
    try:
        await asyncio.wait_for(process.wait(), 10)
    except TimeoutError:
        process.kill()
        await process.wait()


async def scenario(
    route: str, *, outage: float, watchers: int, kubewatch: Path, workdir: Path | None = None
) -> dict[str, Any]:
    """One run, ``route`` "direct" or "watchproxy"; returns the counts and the verdict.
    kubewatch's output stays in ``workdir`` (a new temporary directory if None)."""
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix=f"kubers-{route}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    async with FakeApiServer(bookmark_interval=1.0) as fake:
        for i in range(SEED_PODS):
            fake.store.create("pods", NAMESPACE, pod(f"seed-{i}"))
        upstream = fake.write_kubeconfig(str(workdir / "upstream.kubeconfig"))
        proxy: asyncio.subprocess.Process | None = None
        kubeconfig = upstream
        if route == "watchproxy":
            proxy, base = await start_watchproxy(upstream)
            kubeconfig = str(workdir / "proxy.kubeconfig")
            with open(kubeconfig, "w", encoding="utf-8") as handle:
                handle.write(render_kubeconfig(base, namespace=NAMESPACE))
        out = Output(workdir / "kubewatch.jsonl")
        argv = [str(kubewatch), "--backoff", "none", "--watchers", str(watchers)]
        try:
            with open(out.path, "wb") as stdout, open(workdir / "kubewatch.stderr", "wb") as err:
                client = await asyncio.create_subprocess_exec(
                    *argv,
                    env={**os.environ, "KUBECONFIG": kubeconfig},
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=err,
                )
            try:
                result = await _run(fake, out, route, outage=outage, watchers=watchers)
            finally:
                await stop(client)
        finally:
            if proxy is not None:
                await stop(proxy)
    out.read()
    result["kube_rs_errors"] = sum(1 for line in out.lines if line["type"] == "ERROR")
    result["kube_rs_relists"] = sum(1 for line in out.lines if line["type"] == "Init") - watchers
    wanted = [f"during-{i}" for i in range(DURING_PODS)] + ["after"]
    result["every_watcher_got_every_pod_once_in_order"] = all(
        [n for n in out.applied(w) if n != "probe"] == wanted for w in range(watchers)
    )
    result["output"] = str(workdir)
    return result


async def _run(
    fake: FakeApiServer, out: Output, route: str, *, outage: float, watchers: int
) -> dict[str, Any]:
    # Every watcher listed, then a probe pod reaches every one: all watches are open.
    await until(
        lambda: sum(1 for line in out.read() if line["type"] == "InitDone") >= watchers,
        timeout=30,
        what="every watcher's first list",
    )
    fake.store.create("pods", NAMESPACE, pod("probe"))
    await until(
        lambda: all("probe" in out.applied(w) for w in range(watchers)) if out.read() else False,
        timeout=30,
        what="every watcher to see the probe pod",
    )
    fake.stats.reset()
    await fake.faults.outage("reset")
    started = time.monotonic()
    for i in range(DURING_PODS):
        fake.store.create("pods", NAMESPACE, pod(f"during-{i}"))
    await asyncio.sleep(outage)
    attempts = fake.stats.outage_connection_attempts
    outage_seconds = time.monotonic() - started
    await fake.faults.recover()
    recovered = time.monotonic()
    requests_before = len(fake.stats.requests)
    fake.store.create("pods", NAMESPACE, pod("after"))
    await until(
        lambda: all("after" in out.applied(w) for w in range(watchers)) if out.read() else False,
        timeout=60,
        what="every watcher to see the pod created after the outage",
    )
    return {
        "route": route,
        "watchers": watchers,
        "outage_seconds": round(outage_seconds, 1),
        "connection_attempts_during_outage": attempts,
        "requests_during_recovery": len(fake.stats.requests) - requests_before,
        "recovery_seconds": round(time.monotonic() - recovered, 1),
    }


async def main(args: argparse.Namespace) -> int:
    from tests.clients.build_rust_node import build_kubewatch  # the bench runs from the repo

    kubewatch = build_kubewatch()
    results = []
    for route in ("direct", "watchproxy"):
        if args.only and args.only != route:
            continue
        results.append(
            await scenario(route, outage=args.outage, watchers=args.watchers, kubewatch=kubewatch)
        )
    print(json.dumps(results, indent=2))
    print(
        f"{'route':<12}{'attempts':>10}{'recovery reqs':>15}{'recovery s':>12}"
        f"{'kube-rs errors':>16}  complete"
    )
    for r in results:
        print(
            f"{r['route']:<12}{r['connection_attempts_during_outage']:>10}"
            f"{r['requests_during_recovery']:>15}{r['recovery_seconds']:>12}"
            f"{r['kube_rs_errors']:>16}  "
            f"{r['every_watcher_got_every_pod_once_in_order']}"
        )
    ours = [r for r in results if r["route"] == "watchproxy"]
    return 0 if all(r["every_watcher_got_every_pod_once_in_order"] for r in ours) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=30.0)
    parser.add_argument("--watchers", type=int, default=20)
    parser.add_argument("--only", choices=("direct", "watchproxy"))
    sys.exit(asyncio.run(main(parser.parse_args())))
