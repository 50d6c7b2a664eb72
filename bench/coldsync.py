"""The first client of a cold key: how long its watch takes to sync through watchproxy, beside
``kubectl proxy`` and the apiserver stand-in directly, side by side in one run.

    .venv/bin/python -m bench.coldsync [--pods 10000,50000] [--rounds 5]
                                       [--kind watch,watch-list] [--kubectl kubectl]
                                       [--per-event]

The upstream is a stand-in for the apiserver (``python -m bench.coldsync stand-in``, its own
process) that holds ``--pods`` pods shaped like a Deployment's (``bench.collection``: 2.8 KB of
JSON each, 10,000 pods = 28 MB) as encoded bytes and writes every answer at once: a LIST page
(``limit``/``continue`` honoured, but for ``resourceVersion=0``: served whole, as the
apiserver's watch cache does) in 256 KiB writes, a watch's initial events in 256 KiB chunks
(``--per-event``: one HTTP chunk per event, as kube-apiserver flushes them, written 256 KiB at
a time), then nothing until ``timeoutSeconds``. What is measured is then what a proxy adds.

Per round, each target in turn gets one watch of the pods from a raw socket, read until it has
synced: ``watch``: a watch without a resourceVersion, read to its last initial ADDED (what
``bench.collection`` times); ``watch-list``: ``sendInitialEvents=true`` (client-go's informers
from 1.35), read to its ``k8s.io/initial-events-end`` bookmark. watchproxy's key is cold in
every round: ``hub.linger_seconds`` is 0.05, and each round starts once watchproxy reports no
shared watch (``watchproxy_shared_watches``, its admin port) and the stand-in no open watch.
Reported: the median and the minimum over ``--rounds`` per target, and watchproxy's median over
kubectl proxy's (issue 43's bound: at most 1.2x); and the median CPU the serving process used
from the request to the sync (``cpu_s``: the stand-in's for ``direct``; every thread's run time
from ``/proc/PID/task/*/schedstat``, in nanoseconds, so that it does not hang on the wall clock
of a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench.collection import realistic_pod

PODS = "/api/v1/namespaces/default/pods"
REPO = str(Path(__file__).resolve().parent.parent)
PAGE_CHUNK = 256 * 1024
INITIAL_EVENTS_END = b'"k8s.io/initial-events-end":"true"'


# ---- the stand-in ------------------------------------------------------------------------


class Collection:
    """Every answer the stand-in gives, encoded once."""

    def __init__(self, pods: int) -> None:
        self.rv = str(pods + 1)
        self.items: list[bytes] = []
        self.events: list[bytes] = []
        for i in range(pods):
            pod = realistic_pod(i)
            pod["metadata"].update(
                namespace="default", uid=f"uid-{i:08}", resourceVersion=str(i + 1)
            )
            item = json.dumps(pod, separators=(",", ":")).encode()
            self.items.append(item)
            self.events.append(
                b'{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1",' + item[1:] + b"}\n"
            )
        self.json_bytes = sum(len(i) for i in self.items)
        self._whole: bytes | None = None

    def page(self, start: int, limit: int) -> bytes:
        if start == 0 and limit <= 0:
            if self._whole is None:  # the same for every client: made once
                self._whole = self._page(0, 0)
            return self._whole
        return self._page(start, limit)

    def _page(self, start: int, limit: int) -> bytes:
        end = len(self.items) if limit <= 0 else min(len(self.items), start + limit)
        meta: dict[str, Any] = {"resourceVersion": self.rv}
        if end < len(self.items):
            meta["continue"] = str(end)
            meta["remainingItemCount"] = len(self.items) - end
        head = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta})
        return head[:-1].encode() + b',"items":[' + b",".join(self.items[start:end]) + b"]}"

    def bookmark(self, end_of_initial: bool) -> bytes:
        annotations = ',"annotations":{"k8s.io/initial-events-end":"true"}' * end_of_initial
        return (
            b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":'
            b'{"resourceVersion":"' + self.rv.encode() + b'"' + annotations.encode() + b"}}}\n"
        )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class StandIn:
    """A minimal apiserver for one collection over plain HTTP/1.1 with keep-alive."""

    def __init__(self, collection: Collection, *, per_event: bool) -> None:
        self.collection = collection
        self.per_event = per_event  # one HTTP chunk per event, as kube-apiserver flushes
        self.watches_open = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1].decode()
                if not await self.answer(target, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Write one answer; False when the connection ends with it."""
        path, _, query_string = target.partition("?")
        query = dict(urllib.parse.parse_qsl(query_string))
        c = self.collection
        if path != PODS:
            body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":404}'
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n")
            writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        if query.get("watch") not in ("1", "true"):
            start = int(query.get("continue") or 0)
            # resourceVersion=0 is served from the apiserver's watch cache, which has long
            # ignored limit there: one page (client-go's reflector lists so).
            limit = 0 if query.get("resourceVersion") == "0" else int(query.get("limit") or 0)
            body = c.page(start, limit)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            writer.write(b"Content-Length: %d\r\n\r\n" % len(body))
            view = memoryview(body)
            for at in range(0, len(body), PAGE_CHUNK):  # not a copy of the body per client
                writer.write(view[at : at + PAGE_CHUNK])
                await writer.drain()
            return True
        if query.get("fieldSelector"):  # watchproxy asks whether watch-lists are served
            body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":400}'
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n")
            writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        self.watches_open += 1
        try:
            rv = query.get("resourceVersion") or ""
            initial = query.get("sendInitialEvents") == "true"
            if initial or rv == "":
                pending: list[bytes] = []
                size = 0
                for event in c.events:
                    pending.append(_chunk(event) if self.per_event else event)
                    size += len(event)
                    if size >= PAGE_CHUNK:
                        data = b"".join(pending)
                        writer.write(data if self.per_event else _chunk(data))
                        pending, size = [], 0
                        await writer.drain()
                if initial:
                    end = c.bookmark(True)
                    pending.append(_chunk(end) if self.per_event else end)
                if pending:
                    data = b"".join(pending)
                    writer.write(data if self.per_event else _chunk(data))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(float(query.get("timeoutSeconds") or 1800)):
                    await reader.read(1)  # the client's end (or a byte it should not send)
            writer.write(b"0\r\n\r\n")
            return False
        finally:
            self.watches_open -= 1


async def stand_in(pods: int, per_event: bool) -> None:
    collection = Collection(pods)
    server = StandIn(collection, per_event=per_event)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, limit=2**20)
    port = listener.sockets[0].getsockname()[1]
    print(json.dumps({"port": port, "json_bytes": collection.json_bytes}), flush=True)

    async def report() -> None:
        # One line per change of the number of open watches (the bench waits for 0).
        last = -1
        while True:
            if server.watches_open != last:
                last = server.watches_open
                print(json.dumps({"watches": last}), flush=True)
            await asyncio.sleep(0.01)

    reporter = asyncio.ensure_future(report())
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        reporter.cancel()
        listener.close()


# ---- the bench ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """The run time of every thread of process ``pid`` so far (schedstat's first field)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


async def first_sync(port: int, kind: str, pods: int) -> float:
    """Seconds from sending one watch to its initial events' end."""
    query = "watch=1"
    if kind == "watch-list":
        query += "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=1"
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"GET {PODS}?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json"
        writer.write(head.encode() + b"\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"the watch was answered {head!r}")
        added, tail = 0, b""
        chunked = b"chunked" in head.lower()
        while True:
            if chunked:  # proxies frame the stream their own way: read it chunk by chunk
                size = int((await reader.readline()).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                data = data[:-2]
                if not size:
                    data = b""
            else:
                data = await reader.read(1 << 20)
            if not data:
                raise RuntimeError(f"the watch ended after {added} of {pods} ADDED")
            window = tail + data
            added += window.count(b'{"type":"ADDED"') - tail.count(b'{"type":"ADDED"')
            if kind == "watch" and added >= pods:
                return time.monotonic() - started
            if kind == "watch-list" and INITIAL_EVENTS_END in window:
                if added != pods:
                    raise RuntimeError(f"the initial events held {added} of {pods} pods")
                return time.monotonic() - started
            tail = window[-64:]
    finally:
        writer.close()


class Upstream:
    """The stand-in process, and the number of watches it has open."""

    def __init__(self, process: asyncio.subprocess.Process, port: int, json_bytes: int) -> None:
        self.process = process
        self.port = port
        self.json_bytes = json_bytes
        self.watches = 0
        self._changed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.watches = json.loads(line)["watches"]
            self._changed.set()

    async def idle(self, timeout: float) -> None:
        """Until the stand-in has no watch open (watchproxy's shared watch has closed)."""
        async with asyncio.timeout(timeout):
            while self.watches:
                self._changed.clear()
                await self._changed.wait()

    async def stop(self) -> None:
        self._reader.cancel()
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()


async def start_upstream(pods: int, per_event: bool = False) -> Upstream:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.coldsync", "stand-in", "--pods", str(pods),
        *(["--per-event"] if per_event else []),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    assert process.stdout is not None
    ready = json.loads(await asyncio.wait_for(process.stdout.readline(), 300))
    return Upstream(process, ready["port"], ready["json_bytes"])


async def ready(port: int, process: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.returncode is None:
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {PODS}?limit=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the proxy did not start")


async def shared_watches(admin_port: int) -> int:
    """watchproxy's ``watchproxy_shared_watches``, from its admin port."""
    reader, writer = await asyncio.open_connection("127.0.0.1", admin_port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        text = (await reader.read()).decode()
    finally:
        writer.close()
    for line in text.splitlines():
        if line.startswith("watchproxy_shared_watches "):
            return int(float(line.split()[1]))
    raise RuntimeError("no watchproxy_shared_watches in the metrics")


async def cold(admin_port: int | None, upstream: Upstream) -> None:
    """Until nothing is left of the last round: no watch upstream, no shared watch (its state
    may still be being built after the stand-in's watch-list ended)."""
    await upstream.idle(30)
    deadline = time.monotonic() + 30
    while admin_port is not None and await shared_watches(admin_port):
        if time.monotonic() > deadline:
            raise RuntimeError("watchproxy kept its shared watch")
        await asyncio.sleep(0.02)  # another process's state: polled
    await upstream.idle(30)


async def start_proxy(kind: str, kubeconfig: str, kubectl: str) -> asyncio.subprocess.Process:
    port = free_port()
    admin_port = None
    if kind == "watchproxy":
        admin_port = free_port()
        args = [
            sys.executable, "-m", "watchproxy", "run", "--kubeconfig", kubeconfig,
            "--listen-port", str(port), "--admin-host", "127.0.0.1",
            "--admin-port", str(admin_port), "--log-level", "warning",
        ]  # fmt: skip
    else:
        args = [kubectl, "proxy", f"--kubeconfig={kubeconfig}", f"--port={port}"]
    env = dict(os.environ, WATCHPROXY_HUB_LINGER_SECONDS="0.05", PYTHONPATH=REPO)
    process = await asyncio.create_subprocess_exec(
        *args, env=env, cwd=REPO, stdout=asyncio.subprocess.DEVNULL
    )
    process.port = port  # type: ignore[attr-defined]
    process.admin_port = admin_port  # type: ignore[attr-defined]
    await ready(port, process)
    return process


def kubeconfig_for(port: int) -> str:
    path = os.path.join(tempfile.mkdtemp(), "kubeconfig")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "bench"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    with open(path, "w", encoding="utf-8") as file:
        json.dump(config, file)
    return path


async def run(
    pods_list: list[int], rounds: int, kinds: list[str], kubectl: str, per_event: bool
) -> dict[str, Any]:
    results: dict[str, Any] = {"stand-in chunks": "one per event" if per_event else "256 KiB"}
    for pods in pods_list:
        upstream = await start_upstream(pods, per_event)
        try:
            kubeconfig = kubeconfig_for(upstream.port)
            proxies = {
                name: await start_proxy(name, kubeconfig, kubectl)
                for name in ("watchproxy", "kubectl proxy")
            }
            ports = {"direct": upstream.port} | {
                name: p.port  # type: ignore[attr-defined]
                for name, p in proxies.items()
            }
            pids = {"direct": upstream.process.pid} | {name: p.pid for name, p in proxies.items()}
            admin_port: int = proxies["watchproxy"].admin_port  # type: ignore[attr-defined]
            try:
                for kind in kinds:
                    times: dict[str, list[float]] = {name: [] for name in ports}
                    cpus: dict[str, list[float]] = {name: [] for name in ports}
                    for _ in range(rounds):
                        for name, port in ports.items():  # side by side, round by round
                            await cold(admin_port, upstream)
                            cpu = cpu_seconds(pids[name])
                            times[name].append(await first_sync(port, kind, pods))
                            cpus[name].append(cpu_seconds(pids[name]) - cpu)
                    row = {
                        name: {
                            "median_s": round(statistics.median(ts), 3),
                            "min_s": round(min(ts), 3),
                            "cpu_s": round(statistics.median(cpus[name]), 3),
                        }
                        for name, ts in times.items()
                    }
                    median = {name: statistics.median(ts) for name, ts in times.items()}
                    row["watchproxy / kubectl proxy"] = round(
                        median["watchproxy"] / median["kubectl proxy"], 2
                    )
                    results[f"{pods} pods ({upstream.json_bytes / 1e6:.1f} MB), {kind}"] = row
            finally:
                for process in proxies.values():
                    process.terminate()
                    await process.wait()
        finally:
            await upstream.stop()
    results["loadavg"] = os.getloadavg()[0]
    return results


def main() -> int:
    if sys.argv[1:2] == ["stand-in"]:
        parser = argparse.ArgumentParser(prog="bench.coldsync stand-in")
        parser.add_argument("--pods", type=int, required=True)
        parser.add_argument("--per-event", action="store_true")
        args = parser.parse_args(sys.argv[2:])
        asyncio.run(stand_in(args.pods, args.per_event))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", default="10000,50000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kind", default="watch,watch-list")
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument(
        "--per-event", action="store_true", help="the stand-in writes one HTTP chunk per event"
    )
    args = parser.parse_args()
    pods = [int(p) for p in args.pods.split(",")]
    result = asyncio.run(run(pods, args.rounds, args.kind.split(","), args.kubectl, args.per_event))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
