"""The little object validation the fake does (422 Invalid), and the write strategies
(what a create or an update may change) of resources with a status. Pure."""

from __future__ import annotations

import copy
import re
from typing import Any

from .errors import BadRequest, Invalid
from .resources import ResourceType
from .store import Obj

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_body(rt: ResourceType, body: Any) -> Obj:
    """A request body must be an object of this resource's kind (apiVersion/kind may be absent)."""
    if not isinstance(body, dict):
        raise BadRequest("the body of the request must be a JSON object")
    kind = body.get("kind")
    api_version = body.get("apiVersion")
    if (kind and kind != rt.kind) or (api_version and api_version != rt.api_version):
        raise BadRequest(
            f"the API version in the data ({api_version}) does not match the expected API "
            f"version ({rt.api_version}) or kind {kind!r} is not {rt.kind!r}"
        )
    meta = body.get("metadata", {})
    if not isinstance(meta, dict):
        raise BadRequest("metadata must be an object")
    return body


def _invalid(rt: ResourceType, name: str, problem: str) -> Invalid:
    return Invalid(
        f'{rt.kind} "{name}" is invalid: {problem}', name=name, group=rt.group or None, kind=rt.kind
    )


def validate(rt: ResourceType, obj: Obj) -> None:
    meta = obj.get("metadata", {})
    name = str(meta.get("name") or "")
    pattern, limit = (_LABEL, 63) if rt.name == "namespaces" else (_SUBDOMAIN, 253)
    if name and (len(name) > limit or not pattern.match(name)):
        raise _invalid(
            rt,
            name,
            f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 name must consist of '
            "lower case alphanumeric characters, '-' or '.'",
        )
    for field in ("labels", "annotations"):
        values = meta.get(field) or {}
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise _invalid(rt, name, f"metadata.{field}: Invalid value: values must be strings")
    if rt.name == "pods":
        containers = (obj.get("spec") or {}).get("containers")
        if not isinstance(containers, list) or not containers:
            raise _invalid(rt, name, "spec.containers: Required value")
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                raise _invalid(rt, name, f"spec.containers[{i}]: Required value: name and image")
    elif rt.name in ("configmaps", "secrets"):
        data = obj.get("data") or {}
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise _invalid(rt, name, "data: Invalid value: values must be strings")
    elif rt.name == "deployments":
        spec = obj.get("spec") or {}
        if not spec.get("selector"):
            raise _invalid(rt, name, "spec.selector: Required value")
        if not isinstance(spec.get("template"), dict):
            raise _invalid(rt, name, "spec.template: Required value")


def prepare_create(rt: ResourceType, obj: Obj) -> Obj:
    """What a create through the API stores: pods start Pending, other statuses start empty."""
    obj = copy.deepcopy(obj)
    if rt.name == "pods":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif rt.has_status and rt.name != "namespaces":
        obj["status"] = {}
    if rt.name == "deployments":
        obj.setdefault("spec", {}).setdefault("replicas", 1)
    return obj


def prepare_update(rt: ResourceType, old: Obj, new: Obj, subresource: str | None) -> Obj:
    """The main resource cannot change the status, the status subresource only the status."""
    new = copy.deepcopy(new)
    if subresource == "status":
        result = copy.deepcopy(old)
        result["status"] = new.get("status", {})
        sent_rv = new.get("metadata", {}).get("resourceVersion")
        if sent_rv:
            result["metadata"]["resourceVersion"] = sent_rv
        return result
    if rt.has_status:
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
    return new
