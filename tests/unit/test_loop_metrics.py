"""The lock-free request metrics (metricsbase.LoopCounter / LoopHistogram) expose exactly what
prometheus_client's own Counter and Histogram expose for the same updates."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from watchproxy.metricsbase import LATENCY_BUCKETS, STREAM_BUCKETS, LoopCounter, LoopHistogram

_CREATED = re.compile(rb"^(\S+_created\{[^}]*\}) \S+$", re.MULTILINE)


def exposed(counter: type[Counter], histogram: type[Histogram], updates: list[float]) -> bytes:
    registry = CollectorRegistry()
    requests = counter("t_requests", "help", ["verb", "code"], registry=registry)
    latency = histogram("t_seconds", "help", ["verb"], registry=registry, buckets=LATENCY_BUCKETS)
    streams = histogram("t_streams", "help", ["verb"], registry=registry, buckets=STREAM_BUCKETS)
    for i, seconds in enumerate(updates):
        verb = ("get", "list", "watch")[i % 3]
        requests.labels(verb, str(200 + i % 2)).inc()
        latency.labels(verb).observe(seconds)
        streams.labels(verb).observe(seconds * 100)
    # When each series was created differs between the two runs, not what it says.
    return _CREATED.sub(rb"\1 T", generate_latest(registry))


bucket_edges = st.sampled_from([*LATENCY_BUCKETS, *(b / 100 for b in STREAM_BUCKETS)])


@given(st.lists(st.one_of(bucket_edges, st.floats(0, 100)), max_size=40))
def test_the_same_updates_expose_the_same_text(updates: list[float]) -> None:
    assert exposed(LoopCounter, LoopHistogram, updates) == exposed(Counter, Histogram, updates)


def test_a_counter_still_refuses_to_go_down() -> None:
    counter = LoopCounter("t_down", "help", ["verb"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("get").inc(-1)
