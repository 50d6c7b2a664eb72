"""What the metrics module is built from: bucket layouts, the rows of the metrics table, and
the event-loop lag sampler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prometheus_client import Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Client watches live 30 to 60 minutes by default (hub.client_watch_*_seconds); exec sessions and
# followed logs as long as the user likes. Fine steps early, where a broken client shows.
STREAM_BUCKETS = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 2400.0, 3000.0, 3600.0,
)  # fmt: skip
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


Child = TypeVar("Child")


class Children(Generic[Child]):
    """A labelled metric's children, each looked up once: prometheus_client's ``labels()``
    validates, converts and takes a lock on every call, several times per proxied request.
    Only for labels whose values are already bounded (verbs, status codes, kinds)."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Child] = {}

    def __call__(self, *values: str) -> Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


@dataclass(frozen=True)
class MetricDoc:
    """One row of the metrics table: the exposed name, type, label names and help text."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


class LoopLagSampler:
    """Observes the loop's lag into ``histogram`` every ``interval`` seconds while started.

    Owns one task: ``start()`` creates it on the running loop, ``stop()`` cancels and awaits it.
    """

    def __init__(self, histogram: Histogram, interval: float) -> None:
        self._histogram = histogram
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample())

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _sample(self) -> None:
        # A timer asked for ``interval`` from now fires late by as long as the callbacks queued
        # before it took: the wait any ready work suffers at that moment.
        while True:
            due = time.monotonic() + self._interval
            await asyncio.sleep(self._interval)
            self._histogram.observe(max(0.0, time.monotonic() - due))
