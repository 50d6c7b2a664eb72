"""Prometheus collectors, on a registry owned by one proxy instance (so tests can run several).

``docs/metrics.md`` holds the table of every metric; ``python -m watchproxy.metrics`` prints it
(:func:`markdown_table`) and a test keeps the two equal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import generate_latest

from watchproxy import __version__
from watchproxy.metricsbase import (
    LATENCY_BUCKETS,
    LOOP_LAG_BUCKETS,
    STREAM_BUCKETS,
    Children,
    LoopCounter,
    LoopHistogram,
    LoopLagSampler,
    MetricDoc,
)

# policy.adaptive.LimitReason's values (a test keeps them equal): every reason's series exists.
CONCURRENCY_LIMIT_REASONS = ("initial", "growth", "429", "5xx", "timeout", "connection", "latency")

_M = TypeVar("_M", Counter, Gauge, Histogram, LoopCounter, LoopHistogram)


class BackoffDelay:
    """``watchproxy_backoff_delay_seconds``: the longest backoff wait still under way, else 0.

    Its writers (the connectivity prober and every shared watch) call ``set(delay)`` just
    before they sleep ``delay`` seconds, and no writer says when its sleep is over. So the
    gauge cannot hold the value written last (that stayed at the last delay after recovery):
    each ``set`` records a wait ending ``delay`` seconds later, and a scrape reads the longest
    wait that has not ended. A wait cut short (its shared watch closed) counts until its end.
    """

    def __init__(self, gauge: Gauge, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waits: list[tuple[float, float]] = []  # (ends at, delay)
        gauge.set_function(self.value)

    def set(self, delay: float) -> None:
        """A writer starts waiting ``delay`` seconds (0: it is not waiting)."""
        now = self._clock()
        # Bounded: at most one wait under way per shared watch, plus the prober's.
        self._waits = [wait for wait in self._waits if wait[0] > now]
        if delay > 0:
            self._waits.append((now + delay, delay))

    def value(self) -> float:
        now = self._clock()
        return max((delay for ends, delay in self._waits if ends > now), default=0.0)


class Metrics:
    """Every metric watchproxy exports. Names follow Prometheus conventions.

    ``start()`` / ``stop()`` run and end the one task this object owns, the event-loop lag
    sampler; everything else is passive.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, lag_interval: float = 0.5
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.catalog: list[MetricDoc] = []
        add = self._add
        # Build and process.
        self.build_info = add(
            Gauge,
            "watchproxy_build_info",
            "Always 1; the version label says which watchproxy.",
            ["version"],
        )
        self.build_info.labels(__version__).set(1)
        ProcessCollector(registry=self.registry)
        self.event_loop_lag = add(
            Histogram,
            "watchproxy_event_loop_lag_seconds",
            "How late the event loop ran a timer that was due (sampled twice a second): what "
            "every request and event waits on top of its own work.",
            buckets=LOOP_LAG_BUCKETS,
        )
        self._lag = LoopLagSampler(self.event_loop_lag, lag_interval)
        # Client side.
        self.requests = add(
            LoopCounter,
            "watchproxy_requests",
            "Client requests answered, by Kubernetes verb and HTTP status code (refused ones "
            "too, with the verb they asked for); a stream is counted when it ends.",
            ["verb", "code"],
        )
        self.request_duration = add(
            LoopHistogram,
            "watchproxy_request_duration_seconds",
            "Time from a client request's arrival to the end of its response, for requests "
            "that are not streams, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
        )
        self.stream_duration = add(
            LoopHistogram,
            "watchproxy_stream_duration_seconds",
            "Lifetime of client streams (watches, followed logs, exec/attach/port-forward), "
            "from the request's arrival to the end of the stream, by verb.",
            ["verb"],
            buckets=STREAM_BUCKETS,
        )
        self.in_flight = add(
            Gauge,
            "watchproxy_requests_in_flight",
            "Client requests being served now: kind=request counts all of them, kind=stream "
            "those that are streams (watches, followed logs, exec/attach/port-forward).",
            ["kind"],
        )
        self.rejected = add(
            Counter,
            "watchproxy_rejected_requests",
            "Requests and connections the proxy refused itself, by reason (host, path, read-only, "
            "policy, impersonation, upgrade-not-relayed, connections, header-timeout, "
            "body-timeout, malformed).",
            ["reason"],
        )
        self.client_connections = add(
            Gauge, "watchproxy_client_connections", "Open client TCP connections on the API port."
        )
        self.connections = add(
            Gauge,
            "watchproxy_client_connections_by_state",
            "Open client connections on the API port by state: head (no whole request yet), "
            "body (its body arriving), idle (keep-alive) or active (serving a request).",
            ["state"],
        )
        self.connections_shed = add(
            Counter,
            "watchproxy_client_connections_shed",
            "Client connections closed at the connection cap to make room for a new one, by "
            "state (idle, then head, then body, oldest or longest silent first; never active).",
            ["state"],
        )
        # Upstream side.
        self.upstream_requests = add(
            LoopCounter,
            "watchproxy_upstream_requests",
            "Requests sent to the apiserver, by verb and HTTP status code.",
            ["verb", "code"],
        )
        self.upstream_request_duration = add(
            LoopHistogram,
            "watchproxy_upstream_request_duration_seconds",
            "Time from sending a request to the apiserver to its response headers (rate-limiter "
            "waits excluded; only requests that got an HTTP answer), by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
        )
        self.upstream_errors = add(
            Counter,
            "watchproxy_upstream_errors",
            "Upstream requests that failed without an HTTP answer, by reason.",
            ["reason"],
        )
        self.upstream_up = add(
            Gauge,
            "watchproxy_upstream_up",
            "1 when the last upstream exchange succeeded, 0 while the apiserver is unreachable.",
        )
        self.upstream_connections = add(
            Gauge,
            "watchproxy_upstream_connections",
            "Open TCP connections to the apiserver (in use or idle in the keep-alive pool).",
        )
        self.upstream_connection_attempts = add(
            Counter,
            "watchproxy_upstream_connection_attempts",
            "New TCP connections dialed to the apiserver (what it sees during an outage).",
        )
        self.reused_descriptors = add(
            Counter,
            "watchproxy_loop_reused_descriptors",
            "Times the event loop reported a file descriptor still claimed by a dead transport "
            "(a socket closed twice). Anything but 0 is a bug: see upstream/pool.py.",
        )
        self.watch_upstream_opens = add(
            Counter,
            "watchproxy_watch_upstream_opens",
            "Upstream lists and watches opened by shared watches.",
        )
        backoff_delay = add(
            Gauge,
            "watchproxy_backoff_delay_seconds",
            "The longest backoff wait under way, by the connectivity prober while the apiserver "
            "is unreachable or by a shared watch after a failed upstream watch (0 when none).",
        )
        self.backoff_delay = BackoffDelay(backoff_delay)
        self.backoff_seconds = add(
            Counter,
            "watchproxy_backoff_seconds",
            "Total time spent waiting in backoff before reconnecting upstream (the prober and "
            "the shared watches, added up).",
        )
        self.throttled = add(
            Counter,
            "watchproxy_throttled_requests",
            "Client requests answered 429 by the proxy's own rate limits, by limit.",
            ["limit"],
        )
        self.upstream_throttled = add(
            Counter,
            "watchproxy_upstream_throttled",
            "429 answers received from the apiserver (API Priority and Fairness).",
        )
        self.upstream_concurrency_limit = add(
            Gauge,
            "watchproxy_upstream_concurrency_limit",
            "Upstream requests (streams excluded) that may be in flight at once now: the adaptive "
            "limit, or ratelimit.max_concurrent where that is smaller (0: no limit).",
        )
        self.upstream_concurrency_limit_changes = add(
            Counter,
            "watchproxy_upstream_concurrency_limit_changes",
            "Moves of the adaptive concurrency limit, by reason: growth (requests queued for it, "
            "answers healthy), or a cut on 429, 5xx, timeout, connection (an answer cut off) or "
            "latency (answers slowing down).",
            ["reason"],
        )
        self.upstream_concurrency_limit_reason = add(
            Gauge,
            "watchproxy_upstream_concurrency_limit_reason",
            "1 for the reason the adaptive concurrency limit last moved (initial: it never "
            "moved), 0 for the others.",
            ["reason"],
        )
        for reason in CONCURRENCY_LIMIT_REASONS:
            self.upstream_concurrency_limit_reason.labels(reason).set(reason == "initial")
        self.ratelimit_wait = add(
            Counter,
            "watchproxy_ratelimit_wait_seconds",
            "Total time upstream requests waited for the token bucket or a concurrency slot.",
        )
        # Watch hub.
        self.shared_watches = add(
            Gauge,
            "watchproxy_shared_watches",
            "Shared upstream watches (one per distinct watch key).",
        )
        self.subscribers = add(
            Gauge,
            "watchproxy_watch_subscribers",
            "Client watches served by the hub, by resource.",
            ["resource"],
        )
        self.events_received = add(
            Counter,
            "watchproxy_watch_events_received",
            "Events received from upstream watches, by resource.",
            ["resource"],
        )
        self.events_sent = add(
            Counter,
            "watchproxy_watch_events_sent",
            "Events written to client watches (replays and synthetic ADDED too), by resource.",
            ["resource"],
        )
        self.fanout_delay = add(
            Histogram,
            "watchproxy_fanout_delay_seconds",
            "How long a key's fan-out held new events to write them to its caught-up clients "
            "together (hub.fanout_cpu_share), per pass, by resource.",
            ["resource"],
            buckets=LOOP_LAG_BUCKETS,
        )
        self.bytes_sent = add(
            Counter,
            "watchproxy_watch_sent_bytes",
            "Bytes written to client watch streams, by resource.",
            ["resource"],
        )
        self.history_events = add(
            Gauge,
            "watchproxy_watch_history_events",
            "Events held in the history rings of all shared watches.",
        )
        # The hub feeds these (set_function or set); see their attributes' comments.
        # history_bytes: the encoded bytes the history rings of a resource's shared watches
        # hold together. By resource, not by watch key: every selector and representation is
        # a key of its own, and a label per key would grow without bound; /debug/watches has
        # each key's history bytes.
        self.history_bytes = add(
            Gauge,
            "watchproxy_history_bytes",
            "Bytes of encoded events held in the history rings of the shared watches of each "
            "resource.",
            ["resource"],
        )
        # history_budget_bytes: the configured cap on the sum of history_bytes (0: none).
        self.history_budget_bytes = add(
            Gauge,
            "watchproxy_history_budget_bytes",
            "Upper bound on the bytes all history rings may hold together (0 means no bound).",
        )
        self.cache_bytes = add(
            Gauge,
            "watchproxy_cache_bytes",
            "Bytes of cached objects (the current state of every shared watch) held in total.",
        )
        self.cache_budget_bytes = add(
            Gauge,
            "watchproxy_cache_budget_bytes",
            "Upper bound on watchproxy_cache_bytes when a new key is listed (0 means no bound).",
        )
        self.replays = add(
            Counter,
            "watchproxy_watch_replays",
            "Client watches started from a resourceVersion served from the history ring.",
        )
        self.expired = add(
            Counter,
            "watchproxy_watch_expired",
            "In-stream 410 Expired written by the hub (an RV a relist made ambiguous).",
        )
        self.slow_subscribers = add(
            Counter,
            "watchproxy_watch_slow_subscribers_ended",
            "Client watches ended because they fell too far behind.",
        )
        self.relist_group_cuts = add(
            Counter,
            "watchproxy_watch_relist_group_cuts",
            "Client watches that broke inside a relist group (the client stopped reading or "
            "went away): a client resuming at the group's resourceVersion misses its rest.",
        )
        self.relists = add(
            Counter,
            "watchproxy_watch_relists",
            "Relists of a shared watch after the upstream answered 410 Expired.",
        )
        self.lists_batched = add(
            LoopCounter,
            "watchproxy_lists_batched",
            "LIST requests without a resourceVersion answered by an upstream LIST they shared "
            "with identical requests that arrived while the previous one was in flight.",
        )
        self.list_batches = add(
            LoopCounter,
            "watchproxy_list_batches",
            "Upstream LISTs sent for batches of identical LIST requests (see lists_batched).",
        )
        self.list_batches_streamed = add(
            LoopCounter,
            "watchproxy_list_batches_streamed",
            "Batches whose answer (over 256 KiB) was streamed to their members as it arrived.",
        )
        self.consistent_lists = add(
            Counter,
            "watchproxy_consistent_lists",
            "LIST requests without a resourceVersion that a live shared watch covers, by "
            "outcome: hub (answered from it once current), quiet (its state had not moved "
            "lately: sent upstream at once), behind (it did not catch up in time), "
            "probe-failed (the probe's error answer, or none, was the client's), not-watching "
            "(its upstream watch was backing off or relisting: sent upstream at once), lagging "
            "(it left a LIST behind lately: sent upstream at once, no probe), one-item (limit=1, "
            "the probe's size: sent upstream as it is); and the continuations of a LIST the "
            "hub paged: page (from its snapshot), page-gone "
            "(snapshot no longer kept: sent upstream with the same token).",
            ["outcome"],
        )
        self.freshness_probes = add(
            LoopCounter,
            "watchproxy_freshness_probes",
            "Upstream LISTs with limit=1 that read the apiserver's current revision for "
            "consistent LISTs (shared by concurrent ones) and watches from now (one each).",
        )
        self.freshness_watch_lists = add(
            Counter,
            "watchproxy_freshness_watch_lists",
            "Watch-lists that showed a small key "
            "current for a watch from now, by outcome: same, caught-up, replayed, unavailable.",
            ["outcome"],
        )
        self.lists_from_cache = add(
            Counter,
            "watchproxy_lists_from_cache",
            "LIST requests with resourceVersion=0 answered from a shared watch's state.",
        )
        self.passthrough_watches = add(
            Counter,
            "watchproxy_watch_passthrough",
            "Client watches passed through unshared (the hub cannot serve them), by reason.",
            ["reason"],
        )
        # security.identity: forward (lists.sharedaccess).
        self.authorization_reviews = add(
            Counter,
            "watchproxy_authorization_reviews",
            "SelfSubjectAccessReviews sent upstream with a client's credential before serving "
            "it shared state (security.identity: forward), by outcome: allowed, denied, pass "
            "(the apiserver answers the client itself) or unanswered (no answer, 5xx, 429).",
            ["outcome"],
        )
        self.authorization_verdicts = add(
            Counter,
            "watchproxy_authorization_verdicts",
            "Requests the hub would serve from shared state in forward identity mode, by the "
            "verdict applied (from the cache or a review): allowed (served), denied (answered "
            "403) or pass (passed through to the apiserver).",
            ["verdict"],
        )
        # The series every proxied request touches: a loop family's labels() is one dict
        # lookup, the gauge's children are looked up once each.
        self.requests_by = self.requests.labels
        self.request_duration_by = self.request_duration.labels
        self.stream_duration_by = self.stream_duration.labels
        self.in_flight_by: Children[Gauge] = Children(self.in_flight)
        self.upstream_requests_by = self.upstream_requests.labels
        self.upstream_request_duration_by = self.upstream_request_duration.labels

    def _add(
        self,
        kind: type[_M],
        name: str,
        documentation: str,
        labels: list[str] | None = None,
        *,
        buckets: tuple[float, ...] | None = None,
    ) -> _M:
        extra: dict[str, Any] = {} if buckets is None else {"buckets": buckets}
        # Annotated: mypyc's check of this module reads the constrained call as Any.
        metric: _M = kind(name, documentation, labels or [], registry=self.registry, **extra)
        self.catalog.append(MetricDoc.of(kind, name, documentation, tuple(labels or ())))
        return metric

    # -- what the handlers call -----------------------------------------------------------------

    def request_done(self, verb: str, code: int, seconds: float, *, stream: bool) -> None:
        """One client request answered: counted, and timed in the histogram of its kind."""
        self.requests_by(verb, str(code)).inc()
        histograms = self.stream_duration_by if stream else self.request_duration_by
        histograms(verb).observe(seconds)

    def note_concurrency_limit_change(self, reason: str) -> None:
        """The adaptive concurrency limit moved, for ``reason``."""
        self.upstream_concurrency_limit_changes.labels(reason).inc()
        for other in CONCURRENCY_LIMIT_REASONS:
            self.upstream_concurrency_limit_reason.labels(other).set(other == reason)

    def count_client_connections(self, count: Callable[[], float]) -> None:
        self.client_connections.set_function(count)

    def count_upstream_connections(self, count: Callable[[], float]) -> None:
        self.upstream_connections.set_function(count)

    def start(self) -> None:
        """Start sampling the event loop's lag (call on the loop that serves)."""
        self._lag.start()

    async def stop(self) -> None:
        await self._lag.stop()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def markdown_table(metrics: Metrics | None = None) -> str:
    """The table of docs/metrics.md: every metric of a fresh registry, in registration order."""
    metrics = metrics or Metrics()
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for doc in metrics.catalog:
        labels = ", ".join(f"`{label}`" for label in doc.labels)
        rows.append(f"| `{doc.name}` | {doc.type} | {labels} | {doc.help} |")
    own = {doc.name for doc in metrics.catalog}
    for family in metrics.registry.collect():
        if family.name.startswith("process_") and family.name not in own:
            name = family.name + ("_total" if family.type == "counter" else "")
            rows.append(f"| `{name}` | {family.type} |  | {family.documentation} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
