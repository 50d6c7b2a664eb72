"""Where settings come from besides flags: ``WATCHPROXY_*`` environment variables and a YAML file.

Kubernetes puts "service link" variables into every container for every Service of the
namespace; a Service named ``watchproxy`` (or ``watchproxy-<anything>``) gives
``WATCHPROXY_SERVICE_HOST``, ``WATCHPROXY_PORT=tcp://...`` and more. :func:`read_env` recognises
those shapes and ignores them; every other ``WATCHPROXY_*`` variable must name a known section
and key, so a misspelt setting stops the program instead of being silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from watchproxy.config.schema import SECTIONS, ConfigError, field_types

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
        known = section in SECTIONS and key in field_types(SECTIONS[section])
        link_name = _SERVICE_LINK_NAME.fullmatch(name) is not None
        if link_name and (not known or _SERVICE_LINK_VALUE.match(text) is not None):
            ignored.append(name)
        elif known:
            settings.append((name, section, key, text))
        elif section not in SECTIONS:
            raise ConfigError(
                f"environment {name}: unknown section {section!r} (known: {', '.join(SECTIONS)})"
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
