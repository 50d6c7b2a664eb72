"""Clients that come and go at random through watchproxy leave nothing behind at the real
apiserver, nor in watchproxy: the apiserver's own count of WATCHes of configmaps, and the
proxy's requests in flight, client connections, tasks and file descriptors, are back at their
baseline after the last client left.

Kinds: a client-go metadata informer's protobuf watch and a legacy ``/watch/`` path (both
passed through), Table, protobuf and JSON watches (shared by the hub), and LISTs. Each client
leaves at a random moment with a FIN, a reset, or right after sending its request. The default
run is short (``WATCHPROXY_CHURN_SECONDS``, 15 s; ``WATCHPROXY_CHURN_CLIENTS``, 300 clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.component.test_client_churn import reset
from tests.component.test_client_gone import JSON, TABLE, RawClient
from tests.harness import RunningProxy, wait_for
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_client_gone_real import PROTOBUF, PROTOBUF_METADATA, configmap_watches
from tests.realapi.test_real_apiserver import configmap, proxy

CHURN_SECONDS = float(os.environ.get("WATCHPROXY_CHURN_SECONDS", "15"))
CHURN_CLIENTS = int(os.environ.get("WATCHPROXY_CHURN_CLIENTS", "300"))
MAX_STAY = 1.5
SETTLE = 20.0  # linger, and the Go apiserver's late answers to TLS shutdowns


@dataclass(frozen=True)
class ProxyCensus:
    in_flight: float
    shared_watches: int
    client_connections: float
    upstream_connections: float
    tasks: int
    fds: int


def proxy_census(running: RunningProxy) -> ProxyCensus:
    registry = running.proxy.metrics.registry

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return registry.get_sample_value(name, labels or {}) or 0.0

    return ProxyCensus(
        in_flight=sum(
            sample("watchproxy_requests_in_flight", {"kind": k}) for k in ("request", "stream")
        ),
        shared_watches=len(running.proxy.debug_watches()),
        client_connections=sample("watchproxy_client_connections"),
        upstream_connections=sample("watchproxy_upstream_connections"),
        tasks=len(asyncio.all_tasks()),
        fds=len(os.listdir("/proc/self/fd")),
    )


def proxy_leftovers(before: ProxyCensus, after: ProxyCensus) -> list[str]:
    """What ``after`` holds beyond ``before``; an idle pooled upstream connection is one
    descriptor of this process (the apiserver is another process) and no task."""
    pooled = int(after.upstream_connections - before.upstream_connections)
    problems = [
        f"{name}: {getattr(before, name)} -> {getattr(after, name)}"
        for name in ("in_flight", "shared_watches", "client_connections", "tasks")
        if getattr(after, name) != getattr(before, name)
    ]
    if after.fds - before.fds != pooled:
        problems.append(f"fds: {before.fds} -> {after.fds} with {pooled:+d} pooled")
    return problems


async def one_client(port: int, cms: str, rng: random.Random) -> str:
    requests = {
        "metadata-watch": (cms + "?watch=true", PROTOBUF_METADATA + ", application/json"),
        "legacy-watch": (cms.replace("/api/v1/", "/api/v1/watch/"), JSON),
        "table-watch": (cms + "?watch=true", TABLE),
        "protobuf-watch": (cms + "?watch=true", PROTOBUF + ", application/json"),
        "json-watch": (cms + "?watch=true", JSON),
        "list": (cms, JSON),
    }
    kind = rng.choice(sorted(requests))
    path, accept = requests[kind]
    stay = rng.uniform(0, MAX_STAY)
    how = rng.choice(("fin", "reset", "at-once"))
    raw = await RawClient.send(port, path, accept=accept)
    try:
        if how != "at-once":
            with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError):
                async with asyncio.timeout(stay):
                    await raw.reader.readuntil(b"\r\n\r\n")
                    await raw.reader.read(65536)
            await asyncio.sleep(stay)
    finally:
        if how == "reset":
            reset(raw.writer)
        await raw.leave()
    return kind


async def churn(port: int, cms: str, *, seconds: float, clients: int, seed: int) -> set[str]:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.TaskGroup() as group:
        tasks = []
        for index in range(clients):
            tasks.append(group.create_task(one_client(port, cms, random.Random(rng.random()))))
            await asyncio.sleep(max(0.0, start + (index + 1) * seconds / clients - loop.time()))
    return {task.result() for task in tasks}


@pytest.mark.long(18)
async def test_clients_that_come_and_go_leave_nothing_at_the_apiserver(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(3):
        await direct.ok("POST", cms, body=configmap(f"c{i}", "x"))
    async with proxy(tmp_path, real_apiserver) as (running, _via):
        port = running.proxy.api_port
        baseline, _ = await configmap_watches(direct)
        await churn(port, cms, seconds=1, clients=12, seed=0)  # warm-up: the pool fills
        await wait_for(lambda: not running.proxy.debug_watches(), timeout=SETTLE)
        before = proxy_census(running)
        kinds = await churn(port, cms, seconds=CHURN_SECONDS, clients=CHURN_CLIENTS, seed=1)
        assert len(kinds) == 6, kinds
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE
        while (watches := (await configmap_watches(direct))[0]) != baseline:
            assert loop.time() < deadline, f"the apiserver serves {watches - baseline} watch(es)"
            await asyncio.sleep(0.2)
        try:
            await wait_for(
                lambda: not proxy_leftovers(before, proxy_census(running)),
                timeout=SETTLE,
                what="the proxy's census back to its baseline",
            )
        except AssertionError:
            raise AssertionError(
                f"left behind after {CHURN_CLIENTS} clients: "
                f"{proxy_leftovers(before, proxy_census(running))}"
            ) from None
