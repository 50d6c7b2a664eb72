"""SIGTERM on a real watchproxy process with 50 clients that re-watch the moment a stream ends.

The order pinned here (issue 18 item 3, issue 10 item 6): stop accepting, end every client
stream cleanly, close the shared watches, then the upstream; requests on open connections are
refused meanwhile. Checked against the fake apiserver's own record: no watch opened upstream
after the signal, and the process is gone within the shutdown grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from typing import Any

import aiohttp

from kubefake import FakeApiServer
from tests.harness import wait_for

PODS = "/api/v1/namespaces/default/pods"
GRACE = 3.0
CLIENTS = 50


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def rewatch_forever(
    session: aiohttp.ClientSession, url: str, seen: list[int], n: int, stop: asyncio.Event
) -> int:
    """A client with no backoff: re-opens its watch as soon as it ends, however it ends."""
    attempts = 0
    while not stop.is_set() and attempts < 10_000:
        attempts += 1
        try:
            async with session.get(url) as response:
                async for line in response.content:
                    if line.strip():
                        json.loads(line)
                        seen[n] += 1
        except (aiohttp.ClientError, OSError, ValueError):
            pass
        await asyncio.sleep(0)
    return attempts


async def test_sigterm_with_rewatching_clients_starts_nothing_upstream_and_exits_in_time(
    tmp_path: Any,
) -> None:
    async with FakeApiServer(bookmark_interval=0.5) as fake:
        for i in range(3):
            fake.store.create(
                "pods",
                "default",
                {
                    "metadata": {"name": f"web-{i}", "labels": {"app": f"a{i % 2}"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            )
        kubeconfig = fake.write_kubeconfig(os.path.join(tmp_path, "upstream.kubeconfig"))
        port, admin = free_port(), free_port()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "watchproxy",
            "run",
            "--kubeconfig",
            kubeconfig,
            "--listen-port",
            str(port),
            "--admin-host",
            "127.0.0.1",
            "--admin-port",
            str(admin),
            "--set",
            f"limits.shutdown_grace_seconds={GRACE}",
            "--log-level",
            "warning",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        stop = asyncio.Event()
        seen = [0] * CLIENTS
        clients: list[asyncio.Task[int]] = []
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                base = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 20
                while True:  # until the proxy answers
                    try:
                        async with session.get(f"http://127.0.0.1:{admin}/readyz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    assert time.monotonic() < deadline, "watchproxy did not become ready"
                    await asyncio.sleep(0.1)
                for n in range(CLIENTS):
                    url = f"{base}{PODS}?watch=1&labelSelector=app%3Da{n % 2}"
                    clients.append(
                        asyncio.create_task(rewatch_forever(session, url, seen, n, stop))
                    )
                await wait_for(lambda: all(seen), timeout=20, what="every client streaming")
                assert fake.stats.watch_opens() >= 1

                signalled = time.monotonic()
                process.send_signal(signal.SIGTERM)
                async with asyncio.timeout(GRACE + 10):
                    code = await process.wait()
                took = time.monotonic() - signalled
                stop.set()
                attempts = await asyncio.gather(*clients)
        finally:
            stop.set()
            for task in clients:
                task.cancel()
            for task in clients:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.stderr is not None
        errors = (await process.stderr.read()).decode()
        assert code == 0, errors
        assert took < GRACE + 1.0, f"exit took {took:.1f}s (grace {GRACE}s)\n{errors}"
        late = [
            r
            for r in fake.stats.requests
            if r.time > signalled and (r.watch or "watch=" in r.query_string)
        ]
        assert late == [], [f"{r.path}?{r.query_string}" for r in late]
        assert sum(attempts) > CLIENTS  # the clients did try to come back at once
