"""One frozen, validated configuration built from defaults, a YAML file, the environment and flags.

The keys and their defaults: :mod:`.schema`; the environment and the file: :mod:`.sources`;
type checks: :mod:`.values`; merging and the rules across keys: :mod:`.build`. Everything a
caller needs is importable from here.
"""

from __future__ import annotations

from watchproxy.config.build import build_config
from watchproxy.config.schema import (
    AccessRule,
    AdminConfig,
    BackoffConfig,
    Config,
    ConfigError,
    HubConfig,
    LimitsConfig,
    ListenConfig,
    LoggingConfig,
    RateLimitConfig,
    SecurityConfig,
    UpstreamConfig,
)
from watchproxy.config.sources import (
    ENV_CONFIG_FILE,
    ENV_PREFIX,
    EnvSettings,
    load_file,
    read_env,
)

__all__ = [
    "ENV_CONFIG_FILE",
    "ENV_PREFIX",
    "AccessRule",
    "AdminConfig",
    "BackoffConfig",
    "Config",
    "ConfigError",
    "EnvSettings",
    "HubConfig",
    "LimitsConfig",
    "ListenConfig",
    "LoggingConfig",
    "RateLimitConfig",
    "SecurityConfig",
    "UpstreamConfig",
    "build_config",
    "load_file",
    "read_env",
]
