"""What can be configured: one frozen dataclass per section, their keys, types and defaults.

Every key and its default is also in ``config.example.yaml`` (a test compares them).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal


class ConfigError(Exception):
    """A bad configuration; the message is one line naming the source and the key."""


@dataclass(frozen=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8001
    allow_non_loopback: bool = False
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class AdminConfig:
    host: str = "0.0.0.0"
    port: int = 8081
    # Who may read /debug/watches: clients connecting from a loopback address, anyone who
    # reaches the admin port, or nobody.
    debug_view: Literal["loopback", "anywhere", "off"] = "loopback"


@dataclass(frozen=True)
class UpstreamConfig:
    mode: Literal["auto", "in-cluster", "kubeconfig"] = "auto"
    kubeconfig: str | None = None
    context: str | None = None
    token_reload_seconds: float = 60.0
    connect_timeout_seconds: float = 10.0
    request_timeout_seconds: float = 60.0
    watch_read_timeout_seconds: float = 120.0
    stream_idle_timeout_seconds: float = 600.0
    max_event_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class BackoffConfig:
    initial_seconds: float = 0.8
    factor: float = 2.0
    max_seconds: float = 30.0
    jitter: Literal["proportional", "full", "none"] = "proportional"
    reset_after_seconds: float = 120.0
    probe_max_seconds: float = 8.0


@dataclass(frozen=True)
class RateLimitConfig:
    # Fixed caps, for an operator who wants them (0: none). The adaptive concurrency limit is
    # what protects the apiserver by default.
    qps: float = 0.0
    burst: int = 100
    max_concurrent: int = 0
    adaptive: bool = True
    adaptive_initial_limit: int = 64
    adaptive_min_limit: int = 1
    adaptive_max_limit: int = 1000
    max_wait_seconds: float = 5.0
    per_client_qps: float = 0.0
    per_client_burst: int = 20
    watch_errors_per_second: float = 1.0
    watch_errors_burst: int = 10


@dataclass(frozen=True)
class HubConfig:
    enabled: bool = True
    history_size: int = 10000
    history_max_age_seconds: float = 300.0
    # Bytes of encoded events all history rings may hold together (0: no bound), and one
    # ring alone (0: only the total bounds it).
    history_max_bytes: int = 64 * 1024 * 1024
    history_max_bytes_per_key: int = 0
    # Bytes of current state (the cached objects) all shared watches may hold together (0: no
    # bound); a key whose first LIST would go past it is passed through unshared.
    cache_max_bytes: int = 512 * 1024 * 1024
    # A LIST without a resourceVersion that a live shared watch covers is answered from it
    # once the watch has caught up with the apiserver's current revision, if it does within
    # this long (0: always from the apiserver).
    consistent_list_wait_seconds: float = 0.5
    linger_seconds: float = 30.0
    # Fan-out pacing (0: off, every event written as it comes): a key's fan-out that would take
    # more than fanout_cpu_share of a core batches its events, holding each at most this long.
    fanout_max_delay_seconds: float = 0.0
    fanout_cpu_share: float = 0.1
    max_subscriber_lag: int = 5000
    slow_subscriber_timeout_seconds: float = 30.0
    bookmark_interval_seconds: float = 60.0
    client_watch_min_seconds: float = 1800.0
    client_watch_max_seconds: float = 3600.0
    upstream_watch_min_seconds: float = 300.0
    upstream_watch_max_seconds: float = 600.0
    # An upstream watch with neither an event nor a bookmark for this long is dead: about
    # twice the apiserver's bookmark interval (one minute).
    upstream_silence_seconds: float = 120.0


@dataclass(frozen=True)
class AccessRule:
    """One entry of ``security.rules``: every condition it names must hold (an empty one holds
    always). ``verbs``, ``api_groups``, ``resources`` and ``namespaces`` read a request as the
    apiserver resolves it, as RBAC does; ``path`` is a glob on the decoded path."""

    action: Literal["allow", "deny"]
    path: str | None = None
    methods: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class SecurityConfig:
    identity: Literal["serviceaccount", "forward"] = "serviceaccount"
    impersonation: Literal["refuse", "forward"] = "refuse"
    rules: tuple[AccessRule, ...] = ()
    read_only: bool = False
    # identity: forward: how long the apiserver's verdict on a client's access to shared state
    # is kept (a revocation reaches new requests within it); 0 asks for every request.
    authorization_cache_seconds: float = 5.0


@dataclass(frozen=True)
class LimitsConfig:
    header_timeout_seconds: float = 10.0
    # A request body must keep arriving: at most this long between two reads (0: no limit) ...
    body_timeout_seconds: float = 10.0
    # ... and, after its first body_timeout_seconds, at least this many bytes per second on
    # average (0: no minimum).
    body_min_bytes_per_second: float = 1024.0
    max_body_bytes: int = 4 * 1024 * 1024
    # Request bodies over 64 KiB are read whole before they go upstream; all of them together
    # hold at most this many bytes (0: no bound), beyond it a 503 with Retry-After.
    max_buffered_body_bytes: int = 32 * 1024 * 1024
    max_connections: int = 1024
    max_watches: int = 1000
    shutdown_grace_seconds: float = 5.0
    # Identical LISTs without a resourceVersion share one upstream request (0: never batch);
    # an answer larger than 256 KiB is streamed to them as it arrives, and this is the most
    # one such batch holds for its slowest client ...
    list_batch_max_bytes: int = 4 * 1024 * 1024
    # ... and this what every streamed batch holds together (0: no bound; a batch beyond it
    # holds one 256 KiB piece).
    max_buffered_list_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    json: bool = False


@dataclass(frozen=True)
class Config:
    """The whole validated configuration; immutable once built."""

    listen: ListenConfig = field(default_factory=ListenConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    ratelimit: RateLimitConfig = field(default_factory=RateLimitConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# Section name -> its dataclass, in the order of Config's fields.
SECTIONS: dict[str, type[Any]] = dict(typing.get_type_hints(Config))


def field_types(cls: type[Any]) -> dict[str, Any]:
    """A section's (or any config dataclass's) keys and their resolved types."""
    return typing.get_type_hints(cls)
