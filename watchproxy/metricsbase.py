"""What the metrics module is built from: bucket layouts, the rows of the metrics table, and
the event-loop lag sampler."""

from __future__ import annotations

import asyncio
import bisect
import builtins
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# prometheus_client's own spelling of a bucket bound (its ``le`` label), typed.
_le = cast(Callable[[float], str], floatToGoString)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Client watches live 30 to 60 minutes by default (hub.client_watch_*_seconds); exec sessions and
# followed logs as long as the user likes. Fine steps early, where a broken client shows.
STREAM_BUCKETS = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 2400.0, 3000.0, 3600.0,
)  # fmt: skip
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


Child = TypeVar("Child")
_TYPE_NAMES = ((Counter, "counter"), (Gauge, "gauge"), (Histogram, "histogram"))


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


# Lock-free children for the series every proxied request touches (four updates a request).
# prometheus_client takes a lock and checks the metric on every update, and a histogram walks
# its buckets in Python: together a tenth of the proxy's CPU per request. These series are only
# ever updated and read on the event loop's thread (the scrape is served there too), so a plain
# attribute is enough. The parents (labels(), collect(), exposition) are prometheus_client's.


class LoopCounter(Counter):
    """A Counter whose children are updated on the event loop's thread only."""

    def _metric_init(self) -> None:
        self._count = 0.0
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._count += amount

    def _child_samples(self) -> Iterable[Sample]:
        total = Sample("_total", {}, self._count, None, None)
        if prometheus_metrics._use_created:
            return (total, Sample("_created", {}, self._created, None, None))
        return (total,)


class LoopHistogram(Histogram):
    """A Histogram whose children are updated on the event loop's thread only."""

    def _metric_init(self) -> None:
        self._counts = [0] * len(self._upper_bounds)
        self._total = 0.0
        self._created = time.time()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        self._total += amount
        # The first bucket whose upper bound is >= amount (the last bound is +Inf).
        self._counts[bisect.bisect_left(self._upper_bounds, amount)] += 1

    def _child_samples(self) -> Iterable[Sample]:
        samples, seen = [], 0.0
        for bound, count in zip(self._upper_bounds, self._counts, strict=True):
            seen += count
            samples.append(Sample("_bucket", {"le": _le(bound)}, seen, None, None))
        samples.append(Sample("_count", {}, seen, None, None))
        samples.append(Sample("_sum", {}, self._total, None, None))
        if prometheus_metrics._use_created:
            samples.append(Sample("_created", {}, self._created, None, None))
        return tuple(samples)


@dataclass(frozen=True)
class MetricDoc:
    """One row of the metrics table: the exposed name, type, label names and help text."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str

    @classmethod
    def of(
        cls, kind: builtins.type, name: str, documentation: str, labels: tuple[str, ...]
    ) -> MetricDoc:
        """The row of a metric made as ``kind(name, documentation, labels)``."""
        exposed = name + "_total" if issubclass(kind, Counter) else name
        type_name = next(t for base, t in _TYPE_NAMES if issubclass(kind, base))
        return cls(exposed, type_name, labels, documentation)


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
