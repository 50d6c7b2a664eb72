"""Prometheus collectors, on a registry owned by one proxy instance (so tests can run several).

``docs/metrics.md`` holds the table of every metric; ``python -m watchproxy.metrics`` prints it
and a test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from watchproxy import __version__
from watchproxy.backoffdelay import BackoffDelay
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

_M = TypeVar("_M", bound=MetricWrapperBase)


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
            Gauge, "watchproxy_build_info", "Always 1; the version label says which watchproxy.",
            ["version"],
        )  # fmt: skip
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
            Counter, "watchproxy_watch_upstream_opens",
            "Upstream lists and watches opened by shared watches.",
        )  # fmt: skip
        self.backoff_delay = BackoffDelay(add(
            Gauge, "watchproxy_backoff_delay_seconds",
            "The longest backoff wait under way, by the connectivity prober while the apiserver "
            "is unreachable or by a shared watch after a failed upstream watch (0 when none).",
        ))  # fmt: skip
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
            Gauge, "watchproxy_upstream_concurrency_limit",
            "Upstream requests (streams excluded) that may be in flight at once now: the adaptive "
            "limit, or ratelimit.max_concurrent where that is smaller (0: no limit).",
        )  # fmt: skip
        self.upstream_concurrency_limit_changes = add(
            Counter, "watchproxy_upstream_concurrency_limit_changes",
            "Moves of the adaptive concurrency limit, by reason: growth (requests queued for it, "
            "answers healthy), or a cut on 429, 5xx, timeout, connection (an answer cut off) or "
            "latency (answers slowing down).", ["reason"],
        )  # fmt: skip
        self.upstream_concurrency_limit_reason = add(
            Gauge, "watchproxy_upstream_concurrency_limit_reason",
            "1 for the reason the adaptive concurrency limit last moved (initial: it never "
            "moved), 0 for the others.", ["reason"],
        )  # fmt: skip
        for reason in CONCURRENCY_LIMIT_REASONS:
            self.upstream_concurrency_limit_reason.labels(reason).set(reason == "initial")
        self.ratelimit_wait = add(
            Counter,
            "watchproxy_ratelimit_wait_seconds",
            "Total time upstream requests waited for the token bucket or a concurrency slot.",
        )
        # Watch hub.
        self.shared_watches = add(
            Gauge, "watchproxy_shared_watches",
            "Shared upstream watches (one per distinct watch key).",
        )  # fmt: skip
        self.subscribers = add(
            Gauge, "watchproxy_watch_subscribers",
            "Client watches served by the hub, by resource.", ["resource"],
        )  # fmt: skip
        self.events_received = add(
            Counter, "watchproxy_watch_events_received",
            "Events received from upstream watches, by resource.", ["resource"],
        )  # fmt: skip
        self.events_sent = add(
            Counter, "watchproxy_watch_events_sent",
            "Events written to client watches (replays and synthetic ADDED too), by resource.",
            ["resource"],
        )  # fmt: skip
        self.fanout_delay = add(
            Histogram, "watchproxy_fanout_delay_seconds",
            "How long a key's fan-out held new events to write them to its caught-up clients "
            "together (hub.fanout_cpu_share), per pass, by resource.", ["resource"],
            buckets=LOOP_LAG_BUCKETS,
        )  # fmt: skip
        self.bytes_sent = add(
            Counter, "watchproxy_watch_sent_bytes",
            "Bytes written to client watch streams, by resource.", ["resource"],
        )  # fmt: skip
        self.history_events = add(
            Gauge, "watchproxy_watch_history_events",
            "Events held in the history rings of all shared watches.",
        )  # fmt: skip
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
            Gauge, "watchproxy_history_budget_bytes",
            "Upper bound on the bytes all history rings may hold together (0 means no bound).",
        )  # fmt: skip
        self.cache_bytes = add(
            Gauge, "watchproxy_cache_bytes",
            "Bytes of cached objects (the current state of every shared watch) held in total.",
        )  # fmt: skip
        self.cache_budget_bytes = add(
            Gauge, "watchproxy_cache_budget_bytes",
            "Upper bound on watchproxy_cache_bytes when a new key is listed (0 means no bound).",
        )  # fmt: skip
        self.replays = add(
            Counter, "watchproxy_watch_replays",
            "Client watches started from a resourceVersion served from the history ring.",
        )  # fmt: skip
        self.expired = add(
            Counter, "watchproxy_watch_expired",
            "In-stream 410 Expired written by the hub (an RV a relist made ambiguous).",
        )  # fmt: skip
        self.slow_subscribers = add(
            Counter, "watchproxy_watch_slow_subscribers_ended",
            "Client watches ended because they fell too far behind.",
        )  # fmt: skip
        self.relist_group_cuts = add(
            Counter,
            "watchproxy_watch_relist_group_cuts",
            "Client watches that broke inside a relist group (the client stopped reading or "
            "went away): a client resuming at the group's resourceVersion misses its rest.",
        )
        self.relists = add(
            Counter, "watchproxy_watch_relists",
            "Relists of a shared watch after the upstream answered 410 Expired.",
        )  # fmt: skip
        self.lists_batched = add(
            LoopCounter,
            "watchproxy_lists_batched",
            "LIST requests without a resourceVersion answered by an upstream LIST they shared "
            "with identical requests that arrived while the previous one was in flight.",
        )
        self.list_batches = add(
            LoopCounter, "watchproxy_list_batches",
            "Upstream LISTs sent for batches of identical LIST requests (see lists_batched).",
        )  # fmt: skip
        self.list_batches_streamed = add(
            LoopCounter, "watchproxy_list_batches_streamed",
            "Batches whose answer outgrew limits.list_batch_max_bytes, streamed to their members.",
        )  # fmt: skip
        self.consistent_lists = add(
            Counter,
            "watchproxy_consistent_lists",
            "LIST requests without a resourceVersion that a live shared watch covers, by "
            "outcome: hub (answered from it once current), quiet (its state had not moved "
            "lately: sent upstream at once), behind (it did not catch up in time), "
            "probe-failed (the apiserver's current revision could not be read); and the "
            "continuations of a LIST the hub paged: page (from its snapshot), page-gone "
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
            Counter, "watchproxy_freshness_watch_lists", "Watch-lists that showed a small key "
            "current for a watch from now, by outcome: same, caught-up, replayed, unavailable.",
            ["outcome"])  # fmt: skip
        self.lists_from_cache = add(
            Counter, "watchproxy_lists_from_cache",
            "LIST requests with resourceVersion=0 answered from a shared watch's state.",
        )  # fmt: skip
        self.passthrough_watches = add(
            Counter, "watchproxy_watch_passthrough",
            "Client watches passed through unshared (the hub cannot serve them), by reason.",
            ["reason"],
        )  # fmt: skip
        # security.identity: forward (lists.sharedaccess).
        self.authorization_reviews = add(
            Counter, "watchproxy_authorization_reviews",
            "SelfSubjectAccessReviews sent upstream with a client's credential before serving "
            "it shared state (security.identity: forward), by outcome: allowed, denied, pass "
            "(the apiserver answers the client itself) or unanswered (no answer, 5xx, 429).",
            ["outcome"],
        )  # fmt: skip
        self.authorization_verdicts = add(
            Counter, "watchproxy_authorization_verdicts",
            "Requests the hub would serve from shared state in forward identity mode, by the "
            "verdict applied (from the cache or a review): allowed (served), denied (answered "
            "403) or pass (passed through to the apiserver).", ["verdict"],
        )  # fmt: skip
        # The children touched by every proxied request, looked up once each.
        self.requests_by: Children[Counter] = Children(self.requests)
        self.request_duration_by: Children[Histogram] = Children(self.request_duration)
        self.stream_duration_by: Children[Histogram] = Children(self.stream_duration)
        self.in_flight_by: Children[Gauge] = Children(self.in_flight)
        self.upstream_requests_by: Children[Counter] = Children(self.upstream_requests)
        self.upstream_request_duration_by: Children[Histogram] = Children(
            self.upstream_request_duration
        )

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
        metric = kind(name, documentation, labels or [], registry=self.registry, **extra)
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


if __name__ == "__main__":
    from watchproxy.metricsdoc import markdown_table

    print(markdown_table(), end="")
