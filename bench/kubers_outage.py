"""kube-rs without back-off: how hard do N ``kube_runtime::watcher``s hit an apiserver that is
down, straight and through watchproxy?

    .venv/bin/python -m bench.kubers_outage [--outage 30] [--watchers 20] [--only direct|watchproxy]
    .venv/bin/python -m bench.kubers_outage --real   # a real kube-apiserver, really stopped

The watchers are one ``kubewatch --backoff none --watchers N`` process (tests/clients/rust,
built by ``python -m tests.clients.build_rust_node``): N kube-rs watchers on the pods of one
namespace, each with its own client and connections, polled again the moment they fail, as in
the kube-rs issue "Add backoff to watcher reconnection". The fake apiserver (TLS, bearer token)
runs in this process in "reset" outage mode: it accepts every TCP connection and resets it at
once, counting it, so every attempt to reach it is seen. Its accept loop is Python: the direct
count is what it could accept, a floor for what a real apiserver would see.

With ``--real`` the apiserver is a real kube-apiserver with etcd (tests/realapi/kubetestenv,
built by ``bash tests/realapi/build.sh``) behind a loopback TCP relay that both routes go
through and that counts every connection it accepts. For the outage the apiserver process is
stopped (SIGTERM), left down for ``--outage`` seconds and started again on the same state
(etcd data, port, credentials); the relay accepts and resets each connection meanwhile, so the
count is every attempt made until the restarted apiserver is ready. The pods "during" the
outage are created the moment it is back (nothing can be written while it is down); the
restarted watch cache has no history, so resuming watches get 410 Expired: straight, kube-rs
relists; through watchproxy, the hub relists and clients get the missed pods as events.
Recovery is counted in connections, not requests (the relay sees no HTTP).

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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from kubefake import FakeApiServer
from watchproxy.kube.kubeconfig import render_kubeconfig

if TYPE_CHECKING:
    from tests.realapi.fixture import RealApiServer
    from tests.realapi.kubeapi import TcpRelay

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


class Target(Protocol):
    """The apiserver a run points the watchers at, and how it goes down and comes back."""

    writable_while_down: bool
    load_unit: str  # what ``load()`` counts: requests (the fake) or connections (the relay)

    def kubeconfig(self, path: Path) -> str: ...
    async def create(self, name: str) -> None: ...
    async def go_down(self) -> None: ...
    async def come_back(self) -> None: ...
    def attempts(self) -> int: ...
    def load(self) -> int: ...


class FakeTarget:
    """The fake apiserver in "reset" outage mode (accepts every connection and resets it)."""

    writable_while_down = True
    load_unit = "requests"

    def __init__(self, fake: FakeApiServer) -> None:
        self.fake = fake

    def kubeconfig(self, path: Path) -> str:
        return self.fake.write_kubeconfig(str(path))

    async def create(self, name: str) -> None:
        self.fake.store.create("pods", NAMESPACE, pod(name))

    async def go_down(self) -> None:
        self.fake.stats.reset()
        await self.fake.faults.outage("reset")

    async def come_back(self) -> None:
        await self.fake.faults.recover()

    def attempts(self) -> int:
        return self.fake.stats.outage_connection_attempts

    def load(self) -> int:
        return len(self.fake.stats.requests)


class RealTarget:
    """A real kube-apiserver behind a counting relay; down means its process is stopped."""

    writable_while_down = False
    load_unit = "connections"

    def __init__(self, real: RealApiServer, relay: TcpRelay, session: aiohttp.ClientSession):
        self.real = real
        self.relay = relay
        self.session = session
        self._down_at = 0

    def kubeconfig(self, path: Path) -> str:
        return self.real.write_kubeconfig(path, token=self.real.token, server=self.relay.url)

    async def create(self, name: str) -> None:
        # Straight to the apiserver's own port: the relay counts only what the watchers do.
        async with self.session.post(
            f"{self.real.url}/api/v1/namespaces/{NAMESPACE}/pods",
            json={"apiVersion": "v1", "kind": "Pod", **pod(name)},
            headers=self.real.auth(),
            ssl=self.real.ssl_context(),
        ) as response:
            if response.status != 201:
                raise RuntimeError(f"creating {name}: {response.status} {await response.text()}")

    async def go_down(self) -> None:
        self._down_at = self.relay.accepted
        await asyncio.to_thread(self.real.stop)

    async def come_back(self) -> None:
        from tests.realapi.fixture import start_kubetestenv

        real = self.real
        self.real = await asyncio.to_thread(
            start_kubetestenv, real.dir, port=real.port, etcd_port=real.etcd_port
        )

    def attempts(self) -> int:
        return self.relay.accepted - self._down_at

    def load(self) -> int:
        return self.relay.accepted


async def scenario(
    route: str,
    *,
    outage: float,
    watchers: int,
    kubewatch: Path,
    workdir: Path | None = None,
    real: bool = False,
) -> dict[str, Any]:
    """One run, ``route`` "direct" or "watchproxy", against the fake apiserver or (``real``)
    a real one; returns the counts and the verdict. kubewatch's output stays in ``workdir``
    (a new temporary directory if None)."""
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix=f"kubers-{route}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        target: Target
        if real:
            target = await stack.enter_async_context(real_target(workdir))
        else:
            fake = await stack.enter_async_context(FakeApiServer(bookmark_interval=1.0))
            target = FakeTarget(fake)
        for i in range(SEED_PODS):
            await target.create(f"seed-{i}")
        upstream = target.kubeconfig(workdir / "upstream.kubeconfig")
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
                result = await _run(target, out, route, outage=outage, watchers=watchers)
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


@contextlib.asynccontextmanager
async def real_target(workdir: Path) -> AsyncIterator[RealTarget]:
    from tests.realapi.fixture import start_kubetestenv
    from tests.realapi.kubeapi import TcpRelay

    real = await asyncio.to_thread(start_kubetestenv, workdir / "kubetestenv")
    try:
        async with TcpRelay(real.port) as relay, aiohttp.ClientSession() as session:
            target = RealTarget(real, relay, session)
            try:
                yield target
            finally:
                real = target.real
    finally:
        await asyncio.to_thread(real.stop)


async def _run(
    target: Target, out: Output, route: str, *, outage: float, watchers: int
) -> dict[str, Any]:
    # Every watcher listed, then a probe pod reaches every one: all watches are open.
    await until(
        lambda: sum(1 for line in out.read() if line["type"] == "InitDone") >= watchers,
        timeout=30,
        what="every watcher's first list",
    )
    await target.create("probe")
    await until(
        lambda: all("probe" in out.applied(w) for w in range(watchers)) if out.read() else False,
        timeout=30,
        what="every watcher to see the probe pod",
    )
    await target.go_down()
    started = time.monotonic()
    if target.writable_while_down:
        for i in range(DURING_PODS):
            await target.create(f"during-{i}")
    await asyncio.sleep(outage)
    await target.come_back()
    attempts = target.attempts()
    outage_seconds = time.monotonic() - started
    recovered = time.monotonic()
    if not target.writable_while_down:
        for i in range(DURING_PODS):
            await target.create(f"during-{i}")
    load_before = target.load()
    await target.create("after")
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
        f"{target.load_unit}_during_recovery": target.load() - load_before,
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
            await scenario(
                route,
                outage=args.outage,
                watchers=args.watchers,
                kubewatch=kubewatch,
                real=args.real,
            )
        )
    print(json.dumps(results, indent=2))
    unit = "connections" if args.real else "requests"
    print(
        f"{'route':<12}{'attempts':>10}{'recovery ' + unit[:4] + 's':>15}{'recovery s':>12}"
        f"{'kube-rs errors':>16}  complete"
    )
    for r in results:
        print(
            f"{r['route']:<12}{r['connection_attempts_during_outage']:>10}"
            f"{r[unit + '_during_recovery']:>15}{r['recovery_seconds']:>12}"
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
    parser.add_argument("--real", action="store_true", help="a real kube-apiserver, stopped")
    sys.exit(asyncio.run(main(parser.parse_args())))
