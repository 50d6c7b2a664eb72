"""Clients that come and go at random leave nothing behind: no upstream request, task, socket or
file descriptor.

Every kind of request a client can hold open goes through watchproxy to the fake apiserver:
shared watches (JSON and Table), watches the hub passes through (the legacy ``/watch/`` path,
metadata-only), ``logs -f`` of a silent container, LISTs the apiserver holds before answering,
and exec sessions. Each client leaves at a random moment and in a random way: a FIN, a reset,
or right after sending its request. Before and after, the test counts what the proxy and the
fake hold (the whole process's tasks and file descriptors, since both run in it).

The default run is short (``CHURN_SECONDS``, 20 s, 1,000 clients); the long one is
``WATCHPROXY_CHURN_SECONDS=300 pytest tests/component/test_client_churn.py`` (the issue's
"1,000 clients for 5 minutes": ``WATCHPROXY_CHURN_CLIENTS`` sets the number).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
from dataclasses import dataclass
from typing import Any

import pytest

from tests.component.test_client_gone import (
    JSON,
    METADATA,
    PODS,
    TABLE,
    RawClient,
    pod,
    quiet_proxy,
)
from tests.component.test_upgrade_faults import ExecClient
from tests.harness import Running, wait_for

CHURN_SECONDS = float(os.environ.get("WATCHPROXY_CHURN_SECONDS", "20"))
CHURN_CLIENTS = int(os.environ.get("WATCHPROXY_CHURN_CLIENTS", "1000"))
MAX_STAY = 1.5  # a client stays up to this long before it leaves
SETTLE = 15.0  # after the last client: linger, TLS shutdowns, in-flight LISTs answered

REQUESTS = {
    "shared-watch": (PODS + "?watch=true", JSON),
    "shared-table-watch": (PODS + "?watch=true", TABLE),
    "passthrough-watch": ("/api/v1/watch/namespaces/default/pods", JSON),
    "metadata-watch": ("/api/v1/watch/namespaces/default/pods", METADATA),
    "log-follow": (PODS + "/web-0/log?follow=true", "*/*"),
    "list": (PODS + "?limit=2", JSON),
}
KINDS = (*REQUESTS, "exec")


@dataclass(frozen=True)
class Census:
    upstream_requests: int  # requests the fake apiserver is serving
    proxy_in_flight: float  # watchproxy_requests_in_flight, all kinds
    shared_watches: int
    client_connections: float  # watchproxy_client_connections
    upstream_connections: float  # watchproxy_upstream_connections: busy or idle in the pool
    tasks: int
    fds: int


def sample(running: Running, name: str, labels: dict[str, str] | None = None) -> float:
    value = running.proxy.metrics.registry.get_sample_value(name, labels or {})
    return value or 0.0


def census(running: Running) -> Census:
    return Census(
        upstream_requests=running.fake.stats.in_flight,
        proxy_in_flight=sum(
            sample(running, "watchproxy_requests_in_flight", {"kind": kind})
            for kind in ("request", "stream")
        ),
        shared_watches=len(running.proxy.debug_watches()),
        client_connections=sample(running, "watchproxy_client_connections"),
        upstream_connections=sample(running, "watchproxy_upstream_connections"),
        tasks=len(asyncio.all_tasks()),
        fds=len(os.listdir("/proc/self/fd")),
    )


def fake_connections_settled(running: Running) -> bool:
    """Whether the fake runs one connection handler task per open connection. When a connection
    ends, aiohttp drops it from its connections and cancels its handler task, which ends a few
    loop turns later (or the handler ends first and the connection is dropped a turn later). A
    baseline taken in between counts a task on its way out, and the census after the churn
    then looks one task short (CI, 2026-12-07: "tasks: 6 -> 4 with -1 pooled")."""
    handlers = sum(
        1
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "") == "RequestHandler.start"
    )
    return handlers == running.fake.open_connections()


def leftovers(before: Census, after: Census) -> list[str]:
    """What ``after`` holds beyond ``before``. Idle upstream connections kept for reuse are
    not a leak, and both ends of each are in this process: two descriptors, and the fake's
    task that serves the connection. So those are counted per pooled connection."""
    pooled = int(after.upstream_connections - before.upstream_connections)
    problems = []
    for name in ("upstream_requests", "proxy_in_flight", "shared_watches", "client_connections"):
        if getattr(after, name) != getattr(before, name):
            problems.append(f"{name}: {getattr(before, name)} -> {getattr(after, name)}")
    if after.tasks - before.tasks != pooled:
        problems.append(f"tasks: {before.tasks} -> {after.tasks} with {pooled:+d} pooled")
    if after.fds - before.fds != 2 * pooled:
        problems.append(f"fds: {before.fds} -> {after.fds} with {pooled:+d} pooled")
    return problems


def reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # Linger 0: the close sends a RST.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def one_client(running: Running, rng: random.Random) -> str:
    """One client of a random kind that leaves at a random moment, in a random way."""
    kind = rng.choice(KINDS)
    port = running.proxy.api_port
    stay = rng.uniform(0, MAX_STAY)
    if kind == "exec":
        client = await ExecClient.open(port)
        try:
            assert await client.echo(b"ping") == b"ping"
            await asyncio.sleep(stay)
        finally:
            if rng.random() < 0.5:
                reset(client.writer)
            client.close()
        return kind
    path, accept = REQUESTS[kind]
    raw = await RawClient.send(port, path, accept=accept)
    how = rng.choice(("fin", "reset", "at-once"))
    try:
        if how != "at-once":
            if kind != "list" or not running.fake.faults.lists_held:
                with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError):
                    async with asyncio.timeout(stay):
                        await raw.reader.readuntil(b"\r\n\r\n")
                        await raw.reader.read(65536)
            await asyncio.sleep(max(0.0, stay))
    finally:
        if how == "reset":
            reset(raw.writer)
        await raw.leave()
    return kind


async def churn(running: Running, *, seconds: float, clients: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    kinds: dict[str, int] = {}
    gap = seconds / clients
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.TaskGroup() as group:
        tasks = []
        for index in range(clients):
            # Half the LISTs find the apiserver holding LISTs: those leave before any answer.
            running.fake.faults.hold_lists(index % 200 < 100)
            tasks.append(group.create_task(one_client(running, random.Random(rng.random()))))
            await asyncio.sleep(max(0.0, start + (index + 1) * gap - loop.time()))
        running.fake.faults.hold_lists(False)
    for task in tasks:
        kind = task.result()
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


@pytest.mark.long(27)
async def test_clients_that_come_and_go_leave_nothing_behind(tmp_path: Any) -> None:
    async with quiet_proxy(tmp_path) as running:
        running.fake.store.create("pods", "default", pod("shell"))
        # Warm up: one client of each kind, so that the pool and the fake's per-connection
        # state are what they are in steady state.
        await churn(running, seconds=1, clients=len(KINDS) * 3, seed=0)
        await wait_for(
            lambda: (
                census(running).shared_watches == 0
                and running.fake.stats.in_flight == 0
                and fake_connections_settled(running)
            ),
            timeout=SETTLE,
            what="the warm-up's requests and connections to end",
        )
        before = census(running)
        kinds = await churn(running, seconds=CHURN_SECONDS, clients=CHURN_CLIENTS, seed=1)
        assert set(kinds) == set(KINDS), kinds
        try:
            await wait_for(
                lambda: not leftovers(before, census(running)),
                timeout=SETTLE,
                what="the census back to its baseline",
            )
        except AssertionError:
            raise AssertionError(
                f"left behind after {CHURN_CLIENTS} clients ({kinds}): "
                f"{leftovers(before, census(running))}"
            ) from None
