"""watchproxy_backoff_delay_seconds reads the longest backoff wait under way, else 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from watchproxy.metrics import BackoffDelay


def test_the_gauge_is_the_longest_wait_under_way_and_zero_after_the_last_ends() -> None:
    now = [100.0]
    registry = CollectorRegistry()
    gauge = Gauge("delay_seconds", "d", registry=registry)
    delay = BackoffDelay(gauge, clock=lambda: now[0])

    def read() -> float | None:
        return registry.get_sample_value("delay_seconds")

    assert read() == 0
    delay.set(4.0)  # the prober: 4 s, until 104
    now[0] = 101.0
    delay.set(1.5)  # a shared watch: 1.5 s, until 102.5
    assert read() == 4.0
    now[0] = 103.0
    delay.set(2.0)  # another, until 105
    assert read() == 4.0
    now[0] = 104.0
    assert read() == 2.0
    now[0] = 105.0
    assert read() == 0
