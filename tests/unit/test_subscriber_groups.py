"""A subscriber never leaves a client holding a relist group's RV without the whole group.

A resume at a relist's list RV is trusted (see ``watchproxy.hub.watchcache``), so a stream the
hub ends by itself must end after a group, or with a 410 when it cannot write the rest. The
shared watch, its cache and the subscriber are the real ones (the upstream side is never
started); the sink is a fake of the port whose writes wait on a gate the test opens.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from typing import Any

from watchproxy.config import HubConfig
from watchproxy.hub.cachetypes import StartPlan
from watchproxy.hub.sharedwatch import SharedWatch
from watchproxy.hub.subscriber import WRITE_BATCH_BYTES, Subscriber, SubscriberOptions
from watchproxy.hub.watchkey import WatchKey
from watchproxy.kube.representation import JsonRepresentation
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import BackoffPolicy

PADDING = "x" * 10_000
GROUP = 3 * WRITE_BATCH_BYTES // len(PADDING)  # DELETEs enough for three batches


def pod(name: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
        "data": PADDING,
    }


class GatedSink:
    """Every batch fills the client's buffer, and each wait for it to drain (or each write of
    a line of the subscriber's own) waits until the test opens the gate once more."""

    coding = "identity"

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.writes = 0
        self._gate = asyncio.Semaphore(0)
        self.waiting = asyncio.Event()
        self.eof = False
        self.gone = False
        self.gone_at_write: int | None = None  # this write finds the client gone

    async def _through_gate(self) -> None:
        self.waiting.set()
        await self._gate.acquire()
        self.waiting.clear()

    async def write(self, data: bytes) -> None:
        await self._through_gate()
        if self.writes == self.gone_at_write:
            raise ConnectionResetError("the client went away")
        self.writes += 1
        self.lines += [json.loads(line) for line in data.splitlines()]

    def open_gate(self, writes: int) -> None:
        for _ in range(writes):
            self._gate.release()

    def frame(self, data: bytes) -> bytes:
        return data

    def send_lines(self, lines: Sequence[bytes], size: int) -> bool:
        return self.send_framed(self.frame(b"".join(lines)))

    def send_framed(self, framed: bytes) -> bool:
        if self.writes == self.gone_at_write:
            self.gone = True
            return False
        self.writes += 1
        self.lines += [json.loads(line) for line in framed.splitlines()]
        return False  # over the high-water mark: the subscriber drains before the next

    async def drain(self) -> None:
        await self._through_gate()
        if self.gone:
            raise ConnectionResetError("the client went away")

    async def write_eof(self) -> None:
        self.eof = True

    def client_gone(self) -> bool:
        return self.gone

    def abort(self) -> None:
        raise AssertionError("no write is slow enough to be aborted here")

    def close(self) -> None:
        return None


def shared_watch(metrics: Metrics) -> SharedWatch:
    key = WatchKey("/api/v1/namespaces/ns/pods", "pods", "", "", "json", "", "")
    return SharedWatch(
        key,
        JsonRepresentation(),
        source=None,  # type: ignore[arg-type]  # never started: no upstream
        health=None,  # type: ignore[arg-type]
        hub_config=HubConfig(max_subscriber_lag=GROUP + 5),
        backoff_policy=BackoffPolicy(),
        metrics=metrics,
        rng=random.Random(1),
    )


def subscriber(shared: SharedWatch, sink: GatedSink, metrics: Metrics) -> Subscriber:
    options = SubscriberOptions(
        deadline_seconds=60,
        bookmarks=False,
        bookmark_interval=60,
        max_lag=shared.hub_config.max_subscriber_lag,
        write_timeout=60,
    )
    return Subscriber(shared, sink, options, metrics)  # type: ignore[arg-type]


def relisted(shared: SharedWatch) -> tuple[StartPlan, int]:
    """Listed at 10 with GROUP pods, a client at 10, then a relist at 20 that deletes them."""
    cache = shared.cache
    cache.replace([pod(f"p{i:03}", 5) for i in range(GROUP)], "10")
    plan = cache.plan("10")
    group = cache.replace([], "20")
    assert len(group) == GROUP and all(e.rv == 20 for e in group)
    return plan, len(group)


async def test_a_client_too_far_behind_inside_a_group_ends_with_a_410() -> None:
    metrics = Metrics()
    shared = shared_watch(metrics)
    plan, group = relisted(shared)
    sink = GatedSink()
    run = asyncio.create_task(subscriber(shared, sink, metrics).run(plan))
    await sink.waiting.wait()  # the first batch of the group is being written
    for rv in range(21, 21 + GROUP):  # meanwhile it falls past max_lag
        shared.cache.apply("ADDED", pod(f"n{rv}", rv))
    sink.open_gate(2)  # the first batch, then the 410
    await asyncio.wait_for(run, 5)
    deletes = [e for e in sink.lines if e["type"] == "DELETED"]
    assert 0 < len(deletes) < group
    assert sink.lines[-1]["type"] == "ERROR" and sink.lines[-1]["object"]["code"] == 410
    assert sink.eof
    assert metrics.expired._value.get() == 1
    assert metrics.relist_group_cuts._value.get() == 0


async def test_a_shared_watch_closing_inside_a_group_first_writes_the_rest_of_it() -> None:
    metrics = Metrics()
    shared = shared_watch(metrics)
    plan, group = relisted(shared)
    sink = GatedSink()
    run = asyncio.create_task(subscriber(shared, sink, metrics).run(plan))
    await sink.waiting.wait()
    await shared.close()  # the proxy shuts down while the group is going out
    sink.open_gate(10)
    await asyncio.wait_for(run, 5)
    assert sink.writes > 1  # the group really was split into batches
    assert [e["type"] for e in sink.lines] == ["DELETED"] * group
    assert sink.eof
    assert metrics.relist_group_cuts._value.get() == 0
    assert metrics.expired._value.get() == 0


async def test_a_client_gone_inside_a_group_is_counted() -> None:
    metrics = Metrics()
    shared = shared_watch(metrics)
    plan, _ = relisted(shared)
    sink = GatedSink()
    sink.gone_at_write = 1  # the first batch goes out; the second finds the client gone
    sink.open_gate(2)
    await asyncio.wait_for(subscriber(shared, sink, metrics).run(plan), 5)
    assert sink.writes == 1 and sink.lines[-1]["type"] == "DELETED"
    assert metrics.relist_group_cuts._value.get() == 1
