"""Representations other than the plain object: meta.k8s.io Table and PartialObjectMetadata.

Pure: media-type negotiation from an Accept header, and object -> Table / metadata conversion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .errors import NotAcceptable
from .resources import ResourceType
from .store import Obj

JSON = "json"
TABLE = "table"
METADATA = "metadata"


@dataclass(frozen=True)
class Representation:
    """What the client asked for: plain JSON, a Table, or PartialObjectMetadata(List)."""

    kind: str = JSON
    version: str = "v1"

    @property
    def api_version(self) -> str:
        return f"meta.k8s.io/{self.version}"


_JSON_TYPES = ("application/json", "*/*", "application/*")


def negotiate(accept: str | None) -> Representation:
    """The first acceptable alternative of an Accept header, in the client's order.

    Protobuf alternatives are skipped (this server only speaks JSON); none left is 406.
    """
    if not accept or not accept.strip():
        return Representation()
    for alternative in accept.split(","):
        parts = [p.strip() for p in alternative.split(";")]
        media_type = parts[0].lower()
        params = {}
        for p in parts[1:]:
            k, _, v = p.partition("=")
            params[k.strip().lower()] = v.strip()
        if media_type not in _JSON_TYPES:
            continue
        as_kind = params.get("as")
        if as_kind is None:
            return Representation()
        if params.get("g") != "meta.k8s.io" or params.get("v") not in ("v1", "v1beta1"):
            continue
        if as_kind == "Table":
            return Representation(TABLE, params["v"])
        if as_kind in ("PartialObjectMetadata", "PartialObjectMetadataList"):
            return Representation(METADATA, params["v"])
    raise NotAcceptable(
        "only the following media types are accepted: application/json, application/yaml"
    )


def human_duration(seconds: float) -> str:
    """Age as kubectl shows it (k8s.io/apimachinery duration.HumanDuration)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    y = d // 365
    if d < 365 * 8:
        return f"{y}y{d % 365}d" if d % 365 else f"{y}y"
    return f"{y}y"


def _age(obj: Obj, now: float) -> str:
    ts = obj.get("metadata", {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    created = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    return human_duration(now - created)


Column = tuple[str, str, str, int, Callable[[Obj, float], Any]]  # name, type, format, prio, cell


def _name(obj: Obj, _now: float) -> str:
    return str(obj["metadata"]["name"])


def _pod_ready(obj: Obj, _now: float) -> str:
    total = len(obj.get("spec", {}).get("containers", []))
    statuses = obj.get("status", {}).get("containerStatuses", [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _pod_status(obj: Obj, _now: float) -> str:
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status", {})
    return str(status.get("reason") or status.get("phase") or "Unknown")


def _pod_restarts(obj: Obj, _now: float) -> int:
    statuses = obj.get("status", {}).get("containerStatuses", [])
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def _field(*path: str, default: Any = "<none>") -> Callable[[Obj, float], Any]:
    def cell(obj: Obj, _now: float) -> Any:
        cur: Any = obj
        for p in path:
            cur = cur.get(p) if isinstance(cur, dict) else None
        return default if cur in (None, "") else cur

    return cell


def _count(*fields: str) -> Callable[[Obj, float], int]:
    return lambda obj, _now: sum(len(obj.get(f) or {}) for f in fields)


def _deploy_ready(obj: Obj, _now: float) -> str:
    st = obj.get("status", {})
    return f"{st.get('readyReplicas', 0)}/{obj.get('spec', {}).get('replicas', 1)}"


_NAME_COL: Column = ("Name", "string", "name", 0, _name)
_AGE_COL: Column = ("Age", "string", "", 0, _age)

_COLUMNS: dict[str, list[Column]] = {
    "pods": [
        _NAME_COL,
        ("Ready", "string", "", 0, _pod_ready),
        ("Status", "string", "", 0, _pod_status),
        ("Restarts", "integer", "", 0, _pod_restarts),
        _AGE_COL,
        ("IP", "string", "", 1, _field("status", "podIP")),
        ("Node", "string", "", 1, _field("spec", "nodeName")),
    ],
    "configmaps": [_NAME_COL, ("Data", "integer", "", 0, _count("data", "binaryData")), _AGE_COL],
    "secrets": [
        _NAME_COL,
        ("Type", "string", "", 0, _field("type", default="Opaque")),
        ("Data", "integer", "", 0, _count("data")),
        _AGE_COL,
    ],
    "namespaces": [_NAME_COL, ("Status", "string", "", 0, _field("status", "phase")), _AGE_COL],
    "deployments": [
        _NAME_COL,
        ("Ready", "string", "", 0, _deploy_ready),
        ("Up-to-date", "integer", "", 0, _field("status", "updatedReplicas", default=0)),
        ("Available", "integer", "", 0, _field("status", "availableReplicas", default=0)),
        _AGE_COL,
    ],
    "services": [
        _NAME_COL,
        ("Type", "string", "", 0, _field("spec", "type", default="ClusterIP")),
        ("Cluster-IP", "string", "", 0, _field("spec", "clusterIP")),
        _AGE_COL,
    ],
}


def column_definitions(rt: ResourceType) -> list[dict[str, Any]]:
    return [
        {"name": n, "type": t, "format": f, "description": n, "priority": p}
        for n, t, f, p, _ in _COLUMNS.get(rt.name, [_NAME_COL, _AGE_COL])
    ]


def partial_metadata(obj: Obj, version: str = "v1") -> Obj:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": obj.get("metadata", {}),
    }


def partial_metadata_list(
    items: Sequence[Obj], list_meta: dict[str, Any], version: str = "v1"
) -> Obj:
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": list_meta,
        "items": [partial_metadata(o, version) for o in items],
    }


def to_table(
    rt: ResourceType,
    objects: Sequence[Obj],
    *,
    now: float,
    list_meta: dict[str, Any],
    include_object: str = "Metadata",
    with_columns: bool = True,
    version: str = "v1",
) -> Obj:
    """A Table of ``objects``. Watches pass ``with_columns=False`` after their first event,
    as the apiserver's watch encoder does (columnDefinitions then encode as null)."""
    cols = _COLUMNS.get(rt.name, [_NAME_COL, _AGE_COL])
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [cell(obj, now) for *_, cell in cols]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = partial_metadata(obj, version)
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": list_meta,
        "columnDefinitions": column_definitions(rt) if with_columns else None,
        "rows": rows,
    }
