"""Checking one configuration value against its key's type, and building a section from values.

Values from the YAML file are checked as they are; text from the environment and from flags
(``from_text``) is parsed first: ``"true"``/``"off"``, numbers, comma-separated or ``[...]``
lists.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

import yaml

from watchproxy.config.schema import ConfigError, field_types


def coerce(value: Any, hint: Any, where: str, from_text: bool) -> Any:
    """Check (and, for text from env/flags, parse) one value against a field's type."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        is_null = value is None or (from_text and value in ("", "null", "none"))
        if is_null and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return coerce(value, inner[0], where, from_text)
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
            coerce(item, item_hint, f"{where}[{i}]", False) for i, item in enumerate(value)
        )
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return build_section(hint, value, where)
    raise ConfigError(f"{where}: unsupported type")  # pragma: no cover - a programming error


def build_section(cls: type[Any], values: Mapping[str, Any], where: str) -> Any:
    """An instance of the dataclass ``cls`` from ``values``; unknown or missing keys are errors."""
    hints = field_types(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(f"{where}.{key}: unknown key (known: {known})")
        kwargs[key] = coerce(value, hints[key], f"{where}.{key}", False)
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for name in required:
        if name not in kwargs:
            raise ConfigError(f"{where}.{name}: required key is missing")
    return cls(**kwargs)
