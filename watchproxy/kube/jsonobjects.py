"""Kubernetes objects as parsed JSON: their key, resourceVersion, kind and apiVersion, the
fields of a list, and the compact encoding the apiserver uses. Pure helpers shared by every
representation (:mod:`watchproxy.kube.representation`, :mod:`watchproxy.kube.tables`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")
JSON = "application/json"

Obj = dict[str, Any]


def encode_json(value: Any) -> bytes:
    """Compact JSON (no spaces), UTF-8 like the apiserver; ASCII-escaped if not encodable."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # lone surrogates decoded from \\ud800-style escapes
        return json.dumps(value, separators=(",", ":")).encode()


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValueError("object has no metadata")
    return meta


def key_of(obj: Mapping[str, Any]) -> str:
    meta = metadata_of(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("object has no metadata.name")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def rv_of(obj: Mapping[str, Any]) -> str:
    rv = metadata_of(obj).get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise ValueError("object has no metadata.resourceVersion")
    return rv


def replace_rv(obj: Mapping[str, Any], rv: str) -> Obj:
    out = dict(obj)
    out["metadata"] = {**metadata_of(obj), "resourceVersion": rv}
    return out


def typed(obj: Mapping[str, Any], api_version: str | None, kind: str | None) -> Obj:
    """``obj`` with kind and apiVersion first (list items omit them; events carry them)."""
    head: Obj = {}
    kind = obj.get("kind", kind)
    api_version = obj.get("apiVersion", api_version)
    if kind is not None:
        head["kind"] = kind
    if api_version is not None:
        head["apiVersion"] = api_version
    head.update((k, v) for k, v in obj.items() if k not in ("kind", "apiVersion"))
    return head


def bookmark_metadata(rv: str, initial_events_end: bool) -> Obj:
    meta: Obj = {"resourceVersion": rv}
    if initial_events_end:
        meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
    return meta


def list_of(body: Mapping[str, Any], field: str) -> list[Any]:
    items = body.get(field)
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError(f"list body has no {field} array")
    return items


def list_rv(body: Mapping[str, Any]) -> str:
    rv = metadata_of(body).get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise ValueError("list has no metadata.resourceVersion")
    return rv
