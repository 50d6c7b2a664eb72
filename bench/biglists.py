"""Peak RSS of watchproxy and ``kubectl proxy`` under concurrent slow LISTs of a large collection.

``python -m bench.biglists [--objects 70] [--object-kib 900] [--clients 6] [--delay 5]
[--identical]`` starts kube-apiserver 1.37 + etcd (kubetestenv), fills one namespace with
``--objects`` ConfigMaps of ``--object-kib`` KiB (70 x 900 KiB: a 64.5 MB LIST), starts
watchproxy (its default configuration, ``python -m watchproxy run``) and ``kubectl proxy``
side by side, and sends each ``--clients`` concurrent LISTs without a resourceVersion from raw
sockets with a 16 KiB receive buffer that start reading ``--delay`` seconds after sending (a
slow client), then read to the end. Distinct queries by default (each LIST its own batch, as
different programs send); ``--identical`` sends one query (one batch). Reported per proxy: RSS
before, peak RSS (sampled every 20 ms from /proc), the rise, and the time to the last byte.
Issue 43's bound: watchproxy's rise at most 96 MiB for 6 slow LISTs of 64 MB.
Needs ``tests/realapi/bin/kubetestenv`` (``bash tests/realapi/build.sh``) and ``kubectl``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.realapi.fixture import RealApiServer, start_kubetestenv

NAMESPACE = "default"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
MIB = 1024 * 1024
REPO = str(Path(__file__).resolve().parent.parent)  # the watchproxy this bench runs


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def fill(server: RealApiServer, objects: int, object_kib: int) -> None:
    context = ssl.create_default_context(cafile=server.ca_file)
    async with aiohttp.ClientSession(headers=server.auth()) as session:
        value = "x" * (object_kib * 1024)

        async def create(i: int) -> None:
            body = {"metadata": {"name": f"big-{i:03}"}, "data": {"v": value}}
            async with session.post(server.url + CONFIGMAPS, json=body, ssl=context) as answer:
                assert answer.status in (201, 409), await answer.text()

        for start in range(0, objects, 8):
            await asyncio.gather(*(create(i) for i in range(start, min(objects, start + 8))))


async def slow_list(port: int, target: str, delay: float) -> int:
    """One LIST from a socket that reads nothing for ``delay`` seconds: the body's length."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        await asyncio.sleep(delay)
        status = await reader.readline()
        assert b" 200 " in status, status
        while await reader.readline() not in (b"\r\n", b""):
            pass
        length = 0
        while chunk := await reader.read(256 * 1024):
            length += len(chunk)
        return length
    finally:
        writer.close()


async def measure(
    name: str, pid: int, port: int, clients: int, delay: float, identical: bool
) -> dict[str, float]:
    before = rss(pid)
    peak = before
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss(pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.02)

    sampler = asyncio.create_task(sample())
    started = time.monotonic()
    targets = [
        CONFIGMAPS if identical else f"{CONFIGMAPS}?labelSelector=bench%21%3Dc{i}"
        for i in range(clients)
    ]
    lengths = await asyncio.gather(*(slow_list(port, t, delay) for t in targets))
    took = time.monotonic() - started
    stop.set()
    await sampler
    figures = {
        "before_mib": before / MIB,
        "peak_mib": peak / MIB,
        "rise_mib": (peak - before) / MIB,
        "seconds": took,
        "body_mb": min(lengths) / 1e6,
    }
    print(
        f"| {name} | {figures['before_mib']:.0f} | {figures['peak_mib']:.0f} | "
        f"{figures['rise_mib']:.0f} | {took:.1f} | {figures['body_mb']:.1f} |",
        flush=True,
    )
    return figures


@contextlib.asynccontextmanager
async def kubectl_proxy(kubeconfig: str, kubectl: str) -> AsyncIterator[tuple[int, int]]:
    process = await asyncio.create_subprocess_exec(
        kubectl, "proxy", "--port=0", f"--kubeconfig={kubeconfig}", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        yield process.pid, int(line.rsplit(b":", 1)[1])
    finally:
        process.terminate()
        await process.wait()


@contextlib.asynccontextmanager
async def watchproxy(kubeconfig: str) -> AsyncIterator[tuple[int, int]]:
    port, admin = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "watchproxy", "run", "--kubeconfig", kubeconfig,
        "--listen-port", str(port), "--admin-port", str(admin), "--log-level", "warning",
        env={**os.environ, "PYTHONPATH": REPO},
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{admin}/readyz") as answer:
                        if answer.status == 200:
                            break
                if time.monotonic() > deadline or process.returncode is not None:
                    raise SystemExit("watchproxy did not become ready")
                await asyncio.sleep(0.1)
        yield process.pid, port
    finally:
        process.terminate()
        await process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.biglists")
    parser.add_argument("--objects", type=int, default=70)
    parser.add_argument("--object-kib", type=int, default=900)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--delay", type=float, default=5.0)
    parser.add_argument("--identical", action="store_true")
    parser.add_argument("--kubectl", default="kubectl")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="biglists-") as tmp:
        server = await asyncio.to_thread(start_kubetestenv, Path(tmp))
        try:
            await fill(server, args.objects, args.object_kib)
            kind = "one query" if args.identical else "distinct queries"
            print(f"{args.clients} concurrent LISTs ({kind}), reading {args.delay:g} s late:")
            print("| proxy | RSS before MiB | peak MiB | rise MiB | seconds | body MB |")
            print("| --- | --- | --- | --- | --- | --- |")
            async with kubectl_proxy(server.kubeconfig, args.kubectl) as (pid, port):
                await measure("kubectl proxy", pid, port, args.clients, args.delay, args.identical)
            async with watchproxy(server.kubeconfig) as (pid, port):
                await measure("watchproxy", pid, port, args.clients, args.delay, args.identical)
        finally:
            await asyncio.to_thread(server.stop)


if __name__ == "__main__":
    asyncio.run(main())
