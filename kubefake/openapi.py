"""A minimal OpenAPI v3 surface: enough for kubectl to see that the server validates fields
itself (``fieldValidation``), so that ``kubectl create/apply`` send fieldValidation=Strict
instead of downloading schemas for client-side validation. Pure."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import RESOURCES, ResourceType

_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "description": "fieldValidation instructs the server on how to handle unknown fields.",
    "schema": {"type": "string", "uniqueItems": True},
}


def _gv_path(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"


def _operation(rt: ResourceType, verb: str) -> dict[str, Any]:
    return {
        "operationId": f"{verb}{rt.kind}",
        "parameters": [_FIELD_VALIDATION],
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": verb,
        "x-kubernetes-group-version-kind": {
            "group": rt.group,
            "version": rt.version,
            "kind": rt.kind,
        },
    }


def group_version_doc(gv_path: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one group/version path such as "api/v1" (None if unknown)."""
    paths: dict[str, Any] = {}
    for rt in RESOURCES.values():
        if _gv_path(rt) != gv_path:
            continue
        prefix = f"/{gv_path}/namespaces/{{namespace}}" if rt.namespaced else f"/{gv_path}"
        paths[f"{prefix}/{rt.name}"] = {"post": _operation(rt, "post")}
        paths[f"{prefix}/{rt.name}/{{name}}"] = {
            "put": _operation(rt, "put"),
            "patch": _operation(rt, "patch"),
        }
    if not paths:
        return None
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0-fake"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def root_doc() -> dict[str, Any]:
    """GET /openapi/v3: where each group/version document lives."""
    out: dict[str, Any] = {}
    for gv in sorted({_gv_path(rt) for rt in RESOURCES.values()}):
        digest = hashlib.sha512(json.dumps(group_version_doc(gv)).encode()).hexdigest().upper()
        out[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest}"}
    return {"paths": out}
