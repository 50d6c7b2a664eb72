"""/metrics after a scripted scenario: every metric says what its help text says."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import read_watch, running_proxy, wait_for
from watchproxy import __version__
from watchproxy.metrics import Metrics, markdown_table

PODS = "/api/v1/namespaces/default/pods"
DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


class Scrape:
    """One /metrics exposition, parsed: samples by (name, labels) and the families' metadata."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.families: dict[str, tuple[str, str]] = {}
        for family in text_string_to_metric_families(text):
            self.families[family.name] = (family.type, family.documentation)
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


async def scrape(session: aiohttp.ClientSession, admin_url: str) -> Scrape:
    async with session.get(admin_url + "/metrics") as response:
        assert response.status == 200
        return Scrape(await response.text())


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}


async def test_metrics_after_a_scripted_scenario(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="watchproxy")
    overrides = {"security.read_only": True}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("a"))
        base = running.url + PODS

        # One ordinary request: a LIST passed through.
        async with session.get(base) as response:
            assert response.status == 200
        # A write refused by read-only mode, and a request refused for its Host header.
        async with session.post(base, json=pod("b")) as response:
            assert response.status == 403
        async with session.get(base, headers={"Host": "evil.example"}) as response:
            assert response.status == 403
        # A watch that lives about one second (timeoutSeconds), served by the hub.
        started = time.monotonic()
        events = await read_watch(
            session, base + "?watch=true&timeoutSeconds=1", until=lambda _: False, timeout=10
        )
        watch_seconds = time.monotonic() - started
        assert [e["type"] for e in events] == ["ADDED"]
        # A watch still open while we scrape: one client connection, one upstream watch.
        open_watch = asyncio.ensure_future(
            read_watch(session, base + "?watch=true&labelSelector=x%3Dy", until=lambda _: False)
        )
        try:
            await running.fake.stats.wait_until(lambda s: s.active_watches >= 1)
            lag = running.proxy.metrics.event_loop_lag
            await wait_for(lambda: _count(lag) >= 2, what="two event-loop lag samples")
            metrics = await scrape(session, running.admin_url)
        finally:
            open_watch.cancel()
            await asyncio.gather(open_watch, return_exceptions=True)

    # Build and process.
    assert metrics.value("watchproxy_build_info", version=__version__) == 1
    assert metrics.value("process_resident_memory_bytes") > 10e6
    assert metrics.value("process_open_fds") > 5
    assert metrics.value("process_cpu_seconds_total") > 0
    assert metrics.value("process_start_time_seconds") > time.time() - 3600
    # Event-loop lag: a histogram of small, non-negative delays.
    assert metrics.value("watchproxy_event_loop_lag_seconds_count") >= 2
    assert 0 <= metrics.value("watchproxy_event_loop_lag_seconds_sum") < 5
    # Client requests: the refused ones carry their real verb.
    assert metrics.value("watchproxy_requests_total", verb="list", code="200") == 1
    assert metrics.value("watchproxy_requests_total", verb="create", code="403") == 1
    assert metrics.value("watchproxy_requests_total", verb="list", code="403") == 1
    assert metrics.value("watchproxy_requests_total", verb="watch", code="200") == 1
    assert metrics.total("watchproxy_requests_total", verb="unknown") == 0
    assert metrics.value("watchproxy_rejected_requests_total", reason="read-only") == 1
    assert metrics.value("watchproxy_rejected_requests_total", reason="host") == 1
    assert any(
        "read-only" in r.getMessage() and "POST" in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    # Request durations exclude streams; the watch is in the stream histogram, with its life.
    assert metrics.value("watchproxy_request_duration_seconds_count", verb="list") == 2
    assert metrics.value("watchproxy_request_duration_seconds_count", verb="watch") == 0
    assert metrics.value("watchproxy_stream_duration_seconds_count", verb="watch") == 1
    stream_sum = metrics.value("watchproxy_stream_duration_seconds_sum", verb="watch")
    assert 0.9 <= stream_sum <= watch_seconds + 0.1, (stream_sum, watch_seconds)
    assert metrics.value("watchproxy_stream_duration_seconds_bucket", verb="watch", le="1.0") == 0
    assert metrics.value("watchproxy_stream_duration_seconds_bucket", verb="watch", le="5.0") == 1
    assert (
        metrics.value("watchproxy_stream_duration_seconds_bucket", verb="watch", le="3600.0") == 1
    )
    # Upstream latency, by verb: the LIST; each key's first list, a watch-list that goes on as
    # its shared watch (hub/firstsync.py); and the prober's GETs.
    assert metrics.value("watchproxy_upstream_request_duration_seconds_count", verb="list") >= 1
    assert metrics.value("watchproxy_upstream_request_duration_seconds_count", verb="watch") >= 1
    assert metrics.value("watchproxy_upstream_request_duration_seconds_sum", verb="list") < 10
    # Connections: the open watch's client connection, and upstream at least the watch's.
    assert metrics.value("watchproxy_client_connections") >= 1
    assert metrics.value("watchproxy_upstream_connections") >= 1
    # Defined here, fed by the hub: present with their help text. History bytes come by
    # resource (one series for the open pods watch), never one series per watch key.
    for name in ("watchproxy_history_bytes", "watchproxy_history_budget_bytes"):
        assert name in metrics.families, name
    history = [ls for (n, ls) in metrics.samples if n == "watchproxy_history_bytes"]
    assert history == [frozenset({("resource", "v1/pods")})], history


def _count(histogram: Any) -> float:
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_count"):
                return float(sample.value)
    return 0.0


async def test_event_loop_lag_sees_a_blocked_loop() -> None:
    metrics = Metrics(lag_interval=0.05)
    metrics.start()
    try:
        await wait_for(lambda: _count(metrics.event_loop_lag) >= 1, what="a first sample")
        time.sleep(0.3)  # noqa: ASYNC251 - block the loop on purpose, as a slow callback would
        await wait_for(lambda: _count(metrics.event_loop_lag) >= 3, what="the late sample")
    finally:
        await metrics.stop()
    scraped = Scrape(metrics.render().decode())
    assert scraped.value("watchproxy_event_loop_lag_seconds_sum") >= 0.2
    assert scraped.value("watchproxy_event_loop_lag_seconds_bucket", le="0.1") >= 1
    count = _count(metrics.event_loop_lag)
    await asyncio.sleep(0.15)
    assert _count(metrics.event_loop_lag) == count, "stop() ends the sampling task"


def test_help_texts_are_one_sentence_and_names_follow_conventions() -> None:
    metrics = Metrics()
    for family in metrics.registry.collect():
        assert family.documentation.endswith("."), family.name
        assert "\n" not in family.documentation
        if family.type == "counter":
            assert not family.name.endswith("_total"), family.name  # the client adds it
        if family.type == "histogram":
            assert re.search(r"_(seconds|bytes|events)$", family.name), family.name


def test_docs_metrics_table_matches_the_registry() -> None:
    text = DOC.read_text(encoding="utf-8")
    begin, end = "<!-- metrics-table:begin -->\n", "<!-- metrics-table:end -->"
    assert begin in text and end in text
    table = text[text.index(begin) + len(begin) : text.index(end)]
    assert table == markdown_table(), (
        "docs/metrics.md is out of date: regenerate with `python -m watchproxy.metrics`"
    )


async def test_backoff_delay_returns_to_zero_once_a_failed_shared_watch_is_back(
    tmp_path: Any,
) -> None:
    """A shared watch whose re-watch fails backs off (the gauge shows the delay); once it is
    watching again, nobody is backing off and the gauge says 0, as its help text promises."""
    overrides = {"backoff.initial_seconds": 0.2, "backoff.max_seconds": 0.4}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        fake, registry = running.fake, running.proxy.metrics.registry
        fake.store.create("pods", "default", pod("a"))
        async with session.get(running.url + PODS + "?watch=true") as response:
            assert response.status == 200
            await response.content.readline()
            opens = fake.stats.watch_opens()
            # The shared watch's stream is cut and its re-watches are refused twice: it backs off.
            fake.faults.fail_next(2, 500)
            fake.faults.cut_watches()
            await wait_for(
                lambda: (registry.get_sample_value("watchproxy_backoff_delay_seconds") or 0) > 0,
                what="the shared watch to back off",
            )
            await fake.stats.wait_until(lambda s: s.watch_opens() > opens, within=10)
            fake.store.create("pods", "default", pod("b"))
            line = json.loads(await response.content.readline())
            assert (line["type"], line["object"]["metadata"]["name"]) == ("ADDED", "b")
            metrics = await scrape(session, running.admin_url)
            assert metrics.value("watchproxy_backoff_delay_seconds") == 0
