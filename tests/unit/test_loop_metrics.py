"""The lock-free request metrics (metricsbase.LoopCounter / LoopHistogram, collectors through
prometheus_client's public collector API) expose exactly what prometheus_client's own Counter and
Histogram expose for the same updates."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import DuplicateTimeseries

from watchproxy.metricsbase import LATENCY_BUCKETS, STREAM_BUCKETS, LoopCounter, LoopHistogram

_CREATED = re.compile(rb"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def exposed(
    counter: Callable[..., Any], histogram: Callable[..., Any], updates: list[float]
) -> bytes:
    registry = CollectorRegistry()
    requests = counter("t_requests", "help", ["verb", "code"], registry=registry)
    latency = histogram("t_seconds", "help", ["verb"], registry=registry, buckets=LATENCY_BUCKETS)
    streams = histogram("t_streams", "help", ["verb"], registry=registry, buckets=STREAM_BUCKETS)
    batches = counter("t_batches", "help", registry=registry)
    lag = histogram("t_lag", "help", registry=registry, buckets=(0.5, 1, 2))
    for i, seconds in enumerate(updates):
        verb = ("get", "list", "watch")[i % 3]
        requests.labels(verb, str(200 + i % 2)).inc()
        latency.labels(verb).observe(seconds)
        streams.labels(verb).observe(seconds * 100)
        batches.inc(seconds)
        lag.observe(seconds)
    # When each series was created differs between the two runs, not what it says.
    return _CREATED.sub(rb"\1 T", generate_latest(registry))


bucket_edges = st.sampled_from([*LATENCY_BUCKETS, *(b / 100 for b in STREAM_BUCKETS)])


@given(st.lists(st.one_of(bucket_edges, st.floats(0, 100)), max_size=40))
def test_the_same_updates_expose_the_same_text(updates: list[float]) -> None:
    assert exposed(LoopCounter, LoopHistogram, updates) == exposed(Counter, Histogram, updates)


def test_families_without_updates_expose_what_prometheus_client_exposes() -> None:
    text = exposed(LoopCounter, LoopHistogram, [])
    assert text == exposed(Counter, Histogram, [])
    assert b"t_batches_total 0.0" in text and b't_lag_bucket{le="+Inf"} 0.0' in text


@pytest.fixture
def created_off() -> Iterator[None]:
    prometheus_client.disable_created_metrics()
    try:
        yield
    finally:
        prometheus_client.enable_created_metrics()


@pytest.mark.usefixtures("created_off")
def test_created_series_follow_prometheus_clients_switch() -> None:
    text = exposed(LoopCounter, LoopHistogram, [0.1, 3])
    assert b"_created" not in text
    assert text == exposed(Counter, Histogram, [0.1, 3])


def test_a_counter_still_refuses_to_go_down() -> None:
    counter = LoopCounter("t_down", "help", ["verb"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("get").inc(-1)


def test_label_values_must_match_the_label_names() -> None:
    counter = LoopCounter("t_verbs", "help", ["verb", "code"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="labels"):
        counter.labels("get")
    with pytest.raises(ValueError, match="labels"):
        LoopCounter("t_plain", "help", registry=CollectorRegistry()).labels("get")


def test_a_name_taken_in_the_registry_is_refused() -> None:
    registry = CollectorRegistry()
    Counter("t_requests", "help", registry=registry)
    with pytest.raises(DuplicateTimeseries):
        LoopCounter("t_requests", "help", registry=registry)
    LoopHistogram("t_seconds", "help", registry=registry, buckets=LATENCY_BUCKETS)
    with pytest.raises(DuplicateTimeseries):
        Histogram("t_seconds", "help", registry=registry)
