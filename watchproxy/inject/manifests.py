"""Manifests as text in and text out: one JSON value or a YAML stream, parsed and dumped.

Still pure: the caller reads and writes the text. :class:`InjectError` is the one error of
``watchproxy inject``, for input that is not manifests it can patch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml


class InjectError(ValueError):
    """The input is not a set of Kubernetes manifests this module can patch. One line."""


def parse_manifests(text: str, source: str = "input") -> list[Any]:
    """The documents in ``text``: one JSON value, or a YAML stream (``---`` separated)."""
    if text.lstrip().startswith(("{", "[")):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            json_error: json.JSONDecodeError | None = error
        else:
            return value if isinstance(value, list) else [value]
    else:
        json_error = None
    try:
        return list(yaml.load_all(text, Loader=_LOADER))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        where = f" at line {mark.line + 1}" if mark is not None else ""
        if json_error is not None:  # it looked like JSON: that error is the helpful one
            raise InjectError(f"{source}: not valid JSON: {json_error}") from None
        raise InjectError(f"{source}: not valid YAML{where}: {problem}") from None


def _represent_str(dumper: yaml.representer.SafeRepresenter, value: str) -> yaml.ScalarNode:
    # Block style for multi-line strings: the config and the kubeconfig stay readable.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _represent_str)
# libyaml's parser and emitter when PyYAML was built with it: ten times faster on big inputs.
_LOADER: type[Any] = yaml.SafeLoader
_DUMPER: type[Any] = _Dumper
if yaml.__with_libyaml__:

    class _CDumper(yaml.CSafeDumper):
        pass

    _CDumper.add_representer(str, _represent_str)
    _LOADER, _DUMPER = yaml.CSafeLoader, _CDumper


def dump_manifests(docs: Sequence[dict[str, Any]]) -> str:
    """A YAML stream, one document per object, keys in the order they came."""
    return yaml.dump_all(docs, Dumper=_DUMPER, sort_keys=False, default_flow_style=False)
