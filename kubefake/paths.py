"""Parse API request paths into (resource, namespace, name, subresource). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import NotFound
from .resources import ResourceType, lookup


@dataclass(frozen=True)
class ApiPath:
    """A resource path: a collection when ``name`` is None."""

    rt: ResourceType
    namespace: str | None
    name: str | None = None
    subresource: str | None = None
    legacy_watch: bool = False


@dataclass(frozen=True)
class GroupVersionPath:
    """A discovery path such as /api/v1 or /apis/apps/v1."""

    group: str
    version: str


def _not_found() -> NotFound:
    return NotFound("the server could not find the requested resource")


def parse_api_path(path: str) -> ApiPath | GroupVersionPath:
    """Split /api/v1/... or /apis/{group}/{version}/... (NotFound for anything else)."""
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise _not_found()
    if not rest:
        return GroupVersionPath(group, version)
    legacy_watch = rest[0] == "watch"
    if legacy_watch:
        rest = rest[1:]
    if any(not p for p in rest):
        raise _not_found()
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns_scoped = lookup(group, version, rest[2])
        if ns_scoped is not None and ns_scoped.namespaced:
            namespace, rest = rest[1], rest[2:]
    rt = lookup(group, version, rest[0])
    if rt is None or len(rest) > 3:
        raise _not_found()
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    if sub is not None and sub not in rt.subresources:
        raise _not_found()
    if rt.namespaced and name is not None and namespace is None:
        raise _not_found()
    if legacy_watch and sub is not None:
        raise _not_found()
    return ApiPath(rt, namespace, name, sub, legacy_watch)
