"""Merging the sources into one validated :class:`Config`, and the rules across keys.

Precedence: flags > environment (``WATCHPROXY_<SECTION>_<KEY>``) > file > defaults. Every
problem is a :class:`ConfigError` whose message names the source and the key, so the CLI can
print one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from watchproxy.config import memory
from watchproxy.config.schema import SECTIONS, AccessRule, Config, ConfigError, field_types
from watchproxy.config.sources import read_env
from watchproxy.config.values import build_section, coerce


def _merge_section(
    merged: dict[str, dict[str, Any]], section: str, key: str, value: Any, where: str
) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown section {section!r} (known: {', '.join(SECTIONS)})")
    hints = field_types(SECTIONS[section])
    if key not in hints:
        raise ConfigError(f"{where}: unknown key {section}.{key}")
    merged.setdefault(section, {})[key] = coerce(value, hints[key], where, True)


def build_config(
    file_data: Mapping[str, Any] | None = None,
    *,
    file_name: str = "config",
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
    memory_limit: int | None = None,
) -> Config:
    """Merge the sources and validate. ``overrides`` maps ``section.key`` to text (from flags).
    ``memory_limit``: the container's, in bytes; the memory budgets not set are derived from
    it, and set ones that exceed it are refused (:mod:`.memory`)."""
    merged: dict[str, dict[str, Any]] = {}
    for section, values in (file_data or {}).items():
        if section not in SECTIONS:
            raise ConfigError(
                f"{file_name}: {section}: unknown section (known: {', '.join(SECTIONS)})"
            )
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(f"{file_name}: {section}: expected a mapping, got {values!r}")
        hints = field_types(SECTIONS[section])
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(
                    f"{file_name}: {section}.{key}: unknown key (known: {', '.join(hints)})"
                )
            merged.setdefault(section, {})[key] = value
    for name, section, key, text in read_env(env or {}).settings:
        _merge_section(merged, section, key, text, f"environment {name}")
    for dotted, text in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        _merge_section(merged, section, key, text, f"flag {dotted}")

    sections: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        values = merged.get(section, {})
        sections[section] = build_section(cls, values, f"{file_name}: {section}")
    config = Config(**sections)
    if memory_limit is not None:
        config = _fit_memory(config, merged, memory_limit, file_name)
    _check(config, file_name)
    return config


def memory_budgets(config: Config) -> dict[str, int]:
    """The memory budgets in force (see :mod:`.memory`), by ``section.key``."""
    return {
        b.key: getattr(getattr(config, b.key.split(".")[0]), b.key.split(".")[1])
        for b in memory.BUDGETS
    }


def _fit_memory(
    config: Config, merged: Mapping[str, Mapping[str, Any]], limit: int, where: str
) -> Config:
    """``config`` with its memory budgets fitted to ``limit`` (see :mod:`.memory`)."""
    set_keys = frozenset(f"{section}.{key}" for section, values in merged.items() for key in values)
    configured = memory_budgets(config)
    try:
        budgets = memory.fitted(limit, configured, set_keys)
    except memory.OverBudget as error:
        raise ConfigError(f"{where}: {error}") from None
    changed: dict[str, dict[str, int]] = {}
    for dotted, value in budgets.items():
        section, key = dotted.split(".")
        changed.setdefault(section, {})[key] = value
    return dataclasses.replace(
        config,
        **{
            section: dataclasses.replace(getattr(config, section), **values)
            for section, values in changed.items()
        },
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _overlap(host_a: str, host_b: str) -> bool:
    """Whether two listen addresses can collide on one port (a wildcard meets every address)."""
    wildcards = {"", "0.0.0.0", "::", "[::]"}
    return host_a == host_b or host_a in wildcards or host_b in wildcards


def _check(config: Config, where: str) -> None:
    """Cross-field rules, each reported against the key that breaks it."""
    positive = {
        "listen.port": config.listen.port,
        "admin.port": config.admin.port,
    }
    for key, port in positive.items():
        if not 0 <= port <= 65535:
            raise ConfigError(f"{where}: {key}: must be a port number 0-65535, got {port}")
    if config.listen.port == config.admin.port != 0 and _overlap(
        config.listen.host, config.admin.host
    ):
        raise ConfigError(
            f"{where}: admin.port: {config.admin.port} is also listen.port on an overlapping "
            "address; the API and the admin endpoints need a port each"
        )
    if not config.listen.allow_non_loopback and not _is_loopback(config.listen.host):
        raise ConfigError(
            f"{where}: listen.host: {config.listen.host!r} is not a loopback address; "
            "set listen.allow_non_loopback: true to expose the API port"
        )
    b = config.backoff
    if b.initial_seconds <= 0:
        raise ConfigError(f"{where}: backoff.initial_seconds: must be > 0")
    if b.factor < 1:
        raise ConfigError(f"{where}: backoff.factor: must be >= 1")
    if b.max_seconds < b.initial_seconds:
        raise ConfigError(f"{where}: backoff.max_seconds: must be >= backoff.initial_seconds")
    if b.probe_max_seconds < b.initial_seconds:
        raise ConfigError(f"{where}: backoff.probe_max_seconds: must be >= backoff.initial_seconds")
    lim = config.limits
    if lim.max_buffered_body_bytes != 0 and lim.max_buffered_body_bytes < lim.max_body_bytes:
        # Else the largest bodies would never fit, and their clients retry a 503 for ever.
        raise ConfigError(
            f"{where}: limits.max_buffered_body_bytes: must be 0 (no bound) or at least "
            f"limits.max_body_bytes ({lim.max_body_bytes})"
        )
    if config.limits.list_batch_max_bytes < 0:
        raise ConfigError(f"{where}: limits.list_batch_max_bytes: must be >= 0 (0: never)")
    if config.limits.max_buffered_list_bytes < 0:
        raise ConfigError(f"{where}: limits.max_buffered_list_bytes: must be >= 0 (0: no bound)")
    h = config.hub
    if h.history_size < 1:
        raise ConfigError(f"{where}: hub.history_size: must be >= 1")
    for name in ("history_max_bytes", "history_max_bytes_per_key", "cache_max_bytes"):
        if getattr(h, name) < 0:
            raise ConfigError(f"{where}: hub.{name}: must be >= 0 (0: no bound)")
    if h.consistent_list_wait_seconds < 0:
        raise ConfigError(f"{where}: hub.consistent_list_wait_seconds: must be >= 0 (0: never)")
    if h.client_watch_max_seconds < h.client_watch_min_seconds:
        raise ConfigError(f"{where}: hub.client_watch_max_seconds: must be >= the min")
    if h.upstream_watch_max_seconds < h.upstream_watch_min_seconds:
        raise ConfigError(f"{where}: hub.upstream_watch_max_seconds: must be >= the min")
    if not 0 < h.fanout_cpu_share <= 1:
        raise ConfigError(f"{where}: hub.fanout_cpu_share: must be > 0 and <= 1")
    if h.bookmark_interval_seconds <= 0:
        raise ConfigError(f"{where}: hub.bookmark_interval_seconds: must be > 0")
    if h.upstream_silence_seconds <= 0:
        raise ConfigError(f"{where}: hub.upstream_silence_seconds: must be > 0")
    non_negative = {
        "ratelimit.qps": config.ratelimit.qps,
        "ratelimit.burst": config.ratelimit.burst,
        "ratelimit.max_concurrent": config.ratelimit.max_concurrent,
        "ratelimit.max_wait_seconds": config.ratelimit.max_wait_seconds,
        "ratelimit.per_client_qps": config.ratelimit.per_client_qps,
        "ratelimit.watch_errors_per_second": config.ratelimit.watch_errors_per_second,
        "hub.linger_seconds": h.linger_seconds,
        "hub.fanout_max_delay_seconds": h.fanout_max_delay_seconds,
        "limits.shutdown_grace_seconds": config.limits.shutdown_grace_seconds,
        "limits.header_timeout_seconds": config.limits.header_timeout_seconds,
        "limits.body_timeout_seconds": config.limits.body_timeout_seconds,
        "limits.body_min_bytes_per_second": config.limits.body_min_bytes_per_second,
        "upstream.token_reload_seconds": config.upstream.token_reload_seconds,
        "upstream.stream_idle_timeout_seconds": config.upstream.stream_idle_timeout_seconds,
        "security.authorization_cache_seconds": config.security.authorization_cache_seconds,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise ConfigError(f"{where}: {key}: must be >= 0, got {value}")
    r = config.ratelimit
    if r.qps > 0 and r.burst < 1:
        raise ConfigError(f"{where}: ratelimit.burst: must be >= 1 when ratelimit.qps is set")
    if r.adaptive_min_limit < 1:
        raise ConfigError(f"{where}: ratelimit.adaptive_min_limit: must be >= 1")
    if not r.adaptive_min_limit <= r.adaptive_initial_limit <= r.adaptive_max_limit:
        raise ConfigError(
            f"{where}: ratelimit.adaptive_initial_limit: must be between "
            "ratelimit.adaptive_min_limit and ratelimit.adaptive_max_limit"
        )
    if config.ratelimit.watch_errors_per_second > 0 and config.ratelimit.watch_errors_burst < 1:
        raise ConfigError(f"{where}: ratelimit.watch_errors_burst: must be >= 1")
    for index, rule in enumerate(config.security.rules):
        _check_rule(rule, f"{where}: security.rules[{index}]")


# What a rule may name. Verbs: those a request resolves to (kube.requestinfo), "connect" for the
# connect subresources, and a non-resource request's method in lower case.
RULE_VERBS = frozenset(
    {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
    | {"proxy", "connect", "head", "post", "put", "options", "*"}
)
_METHOD_RE = re.compile(r"[A-Za-z]+")
_NAME = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
_RESOURCE_RE = re.compile(rf"\*|{_NAME}(/{_NAME})?|\*/{_NAME}")
_GROUP_RE = re.compile(rf"\*|{_NAME}|")
_NAMESPACE_RE = re.compile(r"\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _check_rule(rule: AccessRule, where: str) -> None:
    """One rule's values: what could never match a request is a typo, and a deny rule that
    never matches denies nothing."""
    if rule.path is not None and not rule.path.startswith("/"):
        raise ConfigError(f"{where}.path: must start with '/', got {rule.path!r}")
    for i, method in enumerate(rule.methods):
        if not _METHOD_RE.fullmatch(method):
            raise ConfigError(f"{where}.methods[{i}]: not an HTTP method: {method!r}")
    for i, verb in enumerate(rule.verbs):
        if verb not in RULE_VERBS:
            known = ", ".join(sorted(RULE_VERBS))
            raise ConfigError(f"{where}.verbs[{i}]: unknown verb {verb!r} (known: {known})")
    checks = (
        ("resources", rule.resources, _RESOURCE_RE, "'pods', 'pods/exec', '*/scale' or '*'"),
        ("api_groups", rule.api_groups, _GROUP_RE, "'' (core), 'apps', '*'"),
        ("namespaces", rule.namespaces, _NAMESPACE_RE, "a namespace name or '*'"),
    )
    for key, values, pattern, expected in checks:
        for i, value in enumerate(values):
            if not pattern.fullmatch(value):
                raise ConfigError(f"{where}.{key}[{i}]: expected {expected}, got {value!r}")
