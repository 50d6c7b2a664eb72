"""Prometheus collectors, on a registry owned by one proxy instance (so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Every metric watchproxy exports. Names follow Prometheus conventions."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # Client side.
        self.requests = Counter(
            "watchproxy_requests",
            "Client requests answered, by Kubernetes verb and HTTP status code.",
            ["verb", "code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "watchproxy_request_duration_seconds",
            "Time to answer a client request (to the response headers for streams), by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "watchproxy_requests_in_flight",
            "Client requests being served now, by kind (request or stream).",
            ["kind"],
            registry=r,
        )
        self.rejected = Counter(
            "watchproxy_rejected_requests",
            "Client requests refused by the proxy itself, by reason.",
            ["reason"],
            registry=r,
        )
        self.connections = Gauge(
            "watchproxy_connections",
            "Open API-port connections, by state (head: no whole request yet; idle; active).",
            ["state"],
            registry=r,
        )
        self.connections_shed = Counter(
            "watchproxy_connections_shed",
            "API-port connections closed at the connection cap to make room, by state.",
            ["state"],
            registry=r,
        )
        # Upstream side.
        self.upstream_requests = Counter(
            "watchproxy_upstream_requests",
            "Requests sent to the apiserver, by verb and HTTP status code.",
            ["verb", "code"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "watchproxy_upstream_errors",
            "Upstream requests that failed without an HTTP answer, by reason.",
            ["reason"],
            registry=r,
        )
        self.upstream_up = Gauge(
            "watchproxy_upstream_up",
            "1 when the last upstream exchange succeeded, 0 while the apiserver is unreachable.",
            registry=r,
        )
        self.upstream_connection_attempts = Counter(
            "watchproxy_upstream_connection_attempts",
            "New TCP connections dialed to the apiserver (what it sees during an outage).",
            registry=r,
        )
        self.watch_upstream_opens = Counter(
            "watchproxy_watch_upstream_opens",
            "Upstream lists and watches opened by shared watches.",
            registry=r,
        )
        self.backoff_delay = Gauge(
            "watchproxy_backoff_delay_seconds",
            "Largest backoff delay currently being waited by any shared upstream watch.",
            registry=r,
        )
        self.backoff_seconds = Counter(
            "watchproxy_backoff_seconds",
            "Total time spent waiting in backoff before reconnecting upstream.",
            registry=r,
        )
        self.throttled = Counter(
            "watchproxy_throttled_requests",
            "Client requests answered 429 by the proxy's own rate limits, by limit.",
            ["limit"],
            registry=r,
        )
        self.upstream_throttled = Counter(
            "watchproxy_upstream_throttled",
            "429 answers received from the apiserver (API Priority and Fairness).",
            registry=r,
        )
        self.ratelimit_wait = Counter(
            "watchproxy_ratelimit_wait_seconds",
            "Total time upstream requests waited for the token bucket or a concurrency slot.",
            registry=r,
        )
        # Watch hub.
        self.shared_watches = Gauge(
            "watchproxy_shared_watches",
            "Shared upstream watches (one per distinct watch key).",
            registry=r,
        )
        self.subscribers = Gauge(
            "watchproxy_watch_subscribers",
            "Client watches served by the hub, by resource.",
            ["resource"],
            registry=r,
        )
        self.events_received = Counter(
            "watchproxy_watch_events_received",
            "Events received from upstream watches, by resource.",
            ["resource"],
            registry=r,
        )
        self.events_sent = Counter(
            "watchproxy_watch_events_sent",
            "Events written to client watches (replays and synthetic ADDED too), by resource.",
            ["resource"],
            registry=r,
        )
        self.bytes_sent = Counter(
            "watchproxy_watch_sent_bytes",
            "Bytes written to client watch streams, by resource.",
            ["resource"],
            registry=r,
        )
        self.history_events = Gauge(
            "watchproxy_watch_history_events",
            "Events held in the history rings of all shared watches.",
            registry=r,
        )
        self.replays = Counter(
            "watchproxy_watch_replays",
            "Client watches started from a resourceVersion served from the history ring.",
            registry=r,
        )
        self.expired = Counter(
            "watchproxy_watch_expired",
            "Client watches answered with an in-stream 410 Expired (resourceVersion too old).",
            registry=r,
        )
        self.slow_subscribers = Counter(
            "watchproxy_watch_slow_subscribers_ended",
            "Client watches ended because they fell too far behind.",
            registry=r,
        )
        self.relists = Counter(
            "watchproxy_watch_relists",
            "Relists of a shared watch after the upstream answered 410 Expired.",
            registry=r,
        )
        self.lists_from_cache = Counter(
            "watchproxy_lists_from_cache",
            "LIST requests with resourceVersion=0 answered from a shared watch's state.",
            registry=r,
        )
        self.passthrough_watches = Counter(
            "watchproxy_watch_passthrough",
            "Client watches passed through unshared (the hub cannot serve them), by reason.",
            ["reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
