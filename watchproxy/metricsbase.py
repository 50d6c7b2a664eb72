"""What the metrics module is built from: bucket layouts, the lock-free request series, the rows
of the metrics table, and the event-loop lag sampler."""

from __future__ import annotations

import asyncio
import bisect
import builtins
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# prometheus_client's own spelling of a bucket bound (its ``le`` label), typed.
_le = cast(Callable[[float], str], floatToGoString)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Client watches live 30 to 60 minutes by default (hub.client_watch_*_seconds); exec sessions and
# followed logs as long as the user likes. Fine steps early, where a broken client shows.
STREAM_BUCKETS = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
    1200.0,
    1800.0,
    2400.0,
    3000.0,
    3600.0,
)
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


# Lock-free series for what every proxied request updates (four updates a request).
# prometheus_client's Counter and Histogram take a lock and check the metric on every update, and
# its histogram walks its buckets in Python: bench/README.md ("Lock-free request metrics") has the
# micro-benchmark. These series are only ever updated and read on the event loop's thread (the
# scrape is served there too), so a plain attribute is enough. They reach the registry through
# prometheus_client's public collector API: each family is a collector that yields a
# CounterMetricFamily or HistogramMetricFamily, exposed exactly as prometheus_client's own Counter
# and Histogram expose the same updates (tests/unit/test_loop_metrics.py).


def created_series_exposed() -> bool:
    """Whether prometheus_client exposes ``_created`` series now (turned off by the environment
    variable PROMETHEUS_DISABLE_CREATED_SERIES or ``disable_created_metrics()``). The switch is
    private to prometheus_client; what its own counter exposes is public."""
    probe = Counter("watchproxy_probe", "", registry=None)
    return any(s.name.endswith("_created") for family in probe.collect() for s in family.samples)


class LoopCounterSeries:
    """One series of a :class:`LoopCounter`: a count that only goes up."""

    __slots__ = ("count", "created")

    def __init__(self) -> None:
        self.count = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.count += amount


class LoopHistogramSeries:
    """One series of a :class:`LoopHistogram`: a count per bucket and the sum observed."""

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.total += amount
        # The first bucket whose upper bound is >= amount (the last bound is +Inf).
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1


Series = TypeVar("Series", LoopCounterSeries, LoopHistogramSeries)


class _LoopFamily(Generic[Series]):
    """A metric family whose series are updated and scraped on the event loop's thread only;
    a collector on ``registry``. A family without labels has its one series from the start
    (prometheus_client's families do the same: 0 is exposed before the first update)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry | None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], Series] = {}
        if not self.labelnames:
            self._series[()] = self._new_series()
        if registry is not None:
            registry.register(self)

    def _new_series(self) -> Series:
        raise NotImplementedError

    def labels(self, *values: str) -> Series:
        """The series of these label values (in the order of the label names)."""
        series = self._series.get(values)
        if series is None:
            if not self.labelnames or len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} has the labels {self.labelnames}, given {values}")
            series = self._series[values] = self._new_series()
        return series

    def _only(self) -> Series:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels {self.labelnames}: update one series")
        return self._series[()]

    def _family(self) -> Metric:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        """The family with a sample set per series (prometheus_client's Collector protocol)."""
        raise NotImplementedError

    def describe(self) -> Iterator[Metric]:
        """The family without samples: how the registry learns the names it takes."""
        yield self._family()


class LoopCounter(_LoopFamily[LoopCounterSeries]):
    """A counter whose series are updated on the event loop's thread only."""

    def _new_series(self) -> LoopCounterSeries:
        return LoopCounterSeries()

    def inc(self, amount: float = 1) -> None:
        self._only().inc(amount)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        created = created_series_exposed()
        for values, series in self._series.items():
            family.add_metric(values, series.count, series.created if created else None)
        yield family


class LoopHistogram(_LoopFamily[LoopHistogramSeries]):
    """A histogram whose series are updated on the event loop's thread only."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry | None,
        buckets: Sequence[float],
    ) -> None:
        bounds = [float(bound) for bound in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets not in increasing order: {bounds}")
        if not bounds or bounds[-1] != float("inf"):
            bounds.append(float("inf"))
        self._bounds = tuple(bounds)
        self._le = tuple(_le(bound) for bound in bounds)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new_series(self) -> LoopHistogramSeries:
        return LoopHistogramSeries(self._bounds)

    def observe(self, amount: float) -> None:
        self._only().observe(amount)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        created = created_series_exposed()
        for values, series in self._series.items():
            buckets, seen = [], 0.0
            for le, count in zip(self._le, series.counts, strict=True):
                seen += count
                buckets.append((le, seen))
            family.add_metric(values, buckets, series.total)
            if created:
                # HistogramMetricFamily takes no creation time: the sample prometheus_client's
                # Histogram adds after _sum, appended the same way.
                labels = dict(zip(self.labelnames, values, strict=True))
                family.samples.append(Sample(self.name + "_created", labels, series.created))
        yield family


_TYPE_NAMES = (
    (Counter, "counter"),
    (LoopCounter, "counter"),
    (Gauge, "gauge"),
    (Histogram, "histogram"),
    (LoopHistogram, "histogram"),
)


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
        type_name = next(t for base, t in _TYPE_NAMES if issubclass(kind, base))
        exposed = name + "_total" if type_name == "counter" else name
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
