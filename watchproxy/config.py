"""One frozen, validated configuration built from defaults, a YAML file, the environment and flags.

Precedence: flags > environment (``WATCHPROXY_<SECTION>_<KEY>``) > file > defaults. Every
problem is a :class:`ConfigError` whose message names the source and the key, so the CLI can
print one line and exit 2.

Kubernetes puts "service link" variables into every container for every Service of the
namespace; a Service named ``watchproxy`` (or ``watchproxy-<anything>``) gives
``WATCHPROXY_SERVICE_HOST``, ``WATCHPROXY_PORT=tcp://...`` and more. :func:`read_env` recognises
those shapes and ignores them; every other ``WATCHPROXY_*`` variable must name a known section
and key, so a misspelt setting stops the program instead of being silently dropped.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

import yaml

ENV_PREFIX = "WATCHPROXY_"
ENV_CONFIG_FILE = ENV_PREFIX + "CONFIG"

# The kubelet's service-link variables (pkg/kubelet/envvars) for a Service whose name, upper-cased
# with "-" as "_", starts with WATCHPROXY: <NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT,
# <NAME>_SERVICE_PORT_<PORT NAME>, <NAME>_PORT (first port, as a URL) and
# <NAME>_PORT_<number>_<PROTOCOL>[_PROTO|_PORT|_ADDR].
_SERVICE_LINK_NAME = re.compile(
    r"WATCHPROXY(?:_[A-Z0-9_]+?)?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_PROTO|_PORT|_ADDR)?)?)"
)
# <NAME>_PORT is the one shape that can also be a setting (watchproxy-admin gives
# WATCHPROXY_ADMIN_PORT); the kubelet's value is then a URL, a setting's value a number.
_SERVICE_LINK_VALUE = re.compile(r"(?:tcp|udp|sctp)://")


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
    qps: float = 50.0
    burst: int = 100
    max_concurrent: int = 64
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
    action: Literal["allow", "deny"]
    path: str
    methods: tuple[str, ...] = ()


@dataclass(frozen=True)
class SecurityConfig:
    identity: Literal["serviceaccount", "forward"] = "serviceaccount"
    impersonation: Literal["refuse", "forward"] = "refuse"
    rules: tuple[AccessRule, ...] = ()
    read_only: bool = False


@dataclass(frozen=True)
class LimitsConfig:
    header_timeout_seconds: float = 10.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_connections: int = 1024
    max_watches: int = 1000
    shutdown_grace_seconds: float = 5.0
    # Identical LISTs without a resourceVersion share one upstream request when its answer is
    # at most this big (0: never batch).
    list_batch_max_bytes: int = 64 * 1024 * 1024


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


_SECTIONS: dict[str, type[Any]] = dict(typing.get_type_hints(Config))


def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any, where: str, from_text: bool) -> Any:
    """Check (and, for text from env/flags, parse) one value against a field's type."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        is_null = value is None or (from_text and value in ("", "null", "none"))
        if is_null and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _coerce(value, inner[0], where, from_text)
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise ConfigError(
                f"{where}: must be one of {', '.join(map(str, allowed))}, got {value!r}"
            )
        return value
    if hint is bool:
        if from_text and isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if from_text and isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if from_text and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        (item_hint, _ellipsis) = get_args(hint)
        if from_text and isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
            value = [v.strip() if isinstance(v, str) else v for v in value if v != ""]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(
            _coerce(item, item_hint, f"{where}[{i}]", False) for i, item in enumerate(value)
        )
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(hint, value, where)
    raise ConfigError(f"{where}: unsupported type")  # pragma: no cover - a programming error


def _build(cls: type[Any], values: Mapping[str, Any], where: str) -> Any:
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(f"{where}.{key}: unknown key (known: {known})")
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}", False)
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for name in required:
        if name not in kwargs:
            raise ConfigError(f"{where}.{name}: required key is missing")
    return cls(**kwargs)


def _merge_section(
    merged: dict[str, dict[str, Any]], section: str, key: str, value: Any, where: str
) -> None:
    if section not in _SECTIONS:
        raise ConfigError(f"{where}: unknown section {section!r} (known: {', '.join(_SECTIONS)})")
    hints = _hints(_SECTIONS[section])
    if key not in hints:
        raise ConfigError(f"{where}: unknown key {section}.{key}")
    merged.setdefault(section, {})[key] = _coerce(value, hints[key], where, True)


@dataclass(frozen=True)
class EnvSettings:
    """The settings found in the environment and the variables deliberately left alone."""

    settings: tuple[tuple[str, str, str, str], ...]  # (variable, section, key, text)
    ignored: tuple[str, ...]  # Kubernetes service-link variables


def read_env(env: Mapping[str, str]) -> EnvSettings:
    """Pick the ``WATCHPROXY_<SECTION>_<KEY>`` settings out of ``env``.

    Service-link variables are ignored (see the module docstring). Any other ``WATCHPROXY_*``
    variable (``WATCHPROXY_CONFIG`` aside) that does not name a known section and key is a
    ConfigError: it is almost certainly a misspelt setting.
    """
    settings: list[tuple[str, str, str, str]] = []
    ignored: list[str] = []
    for name, text in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_FILE:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
        known = section in _SECTIONS and key in _hints(_SECTIONS[section])
        link_name = _SERVICE_LINK_NAME.fullmatch(name) is not None
        if link_name and (not known or _SERVICE_LINK_VALUE.match(text) is not None):
            ignored.append(name)
        elif known:
            settings.append((name, section, key, text))
        elif section not in _SECTIONS:
            raise ConfigError(
                f"environment {name}: unknown section {section!r} (known: {', '.join(_SECTIONS)})"
            )
        else:
            raise ConfigError(f"environment {name}: unknown key {section}.{key}")
    return EnvSettings(tuple(settings), tuple(ignored))


def load_file(path: str) -> dict[str, Any]:
    """Read a YAML config file; a missing or malformed file is a ConfigError naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: invalid YAML{line}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, a timestamp that is no date, nesting
        raise ConfigError(f"{path}: invalid YAML ({type(exc).__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def build_config(
    file_data: Mapping[str, Any] | None = None,
    *,
    file_name: str = "config",
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> Config:
    """Merge the sources and validate. ``overrides`` maps ``section.key`` to text (from flags)."""
    merged: dict[str, dict[str, Any]] = {}
    for section, values in (file_data or {}).items():
        if section not in _SECTIONS:
            raise ConfigError(
                f"{file_name}: {section}: unknown section (known: {', '.join(_SECTIONS)})"
            )
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(f"{file_name}: {section}: expected a mapping, got {values!r}")
        hints = _hints(_SECTIONS[section])
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
    for section, cls in _SECTIONS.items():
        values = merged.get(section, {})
        sections[section] = _build(cls, values, f"{file_name}: {section}")
    config = Config(**sections)
    _check(config, file_name)
    return config


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check(config: Config, where: str) -> None:
    """Cross-field rules, each reported against the key that breaks it."""
    positive = {
        "listen.port": config.listen.port,
        "admin.port": config.admin.port,
    }
    for key, port in positive.items():
        if not 0 <= port <= 65535:
            raise ConfigError(f"{where}: {key}: must be a port number 0-65535, got {port}")
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
    if config.limits.list_batch_max_bytes < 0:
        raise ConfigError(f"{where}: limits.list_batch_max_bytes: must be >= 0 (0: never)")
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
        "limits.shutdown_grace_seconds": config.limits.shutdown_grace_seconds,
        "upstream.token_reload_seconds": config.upstream.token_reload_seconds,
        "upstream.stream_idle_timeout_seconds": config.upstream.stream_idle_timeout_seconds,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise ConfigError(f"{where}: {key}: must be >= 0, got {value}")
    if config.ratelimit.watch_errors_per_second > 0 and config.ratelimit.watch_errors_burst < 1:
        raise ConfigError(f"{where}: ratelimit.watch_errors_burst: must be >= 1")
    for index, rule in enumerate(config.security.rules):
        if not rule.path.startswith("/"):
            raise ConfigError(f"{where}: security.rules[{index}].path: must start with '/'")
