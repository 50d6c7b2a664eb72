"""Legacy discovery documents (/version, /api, /apis, /api/v1, /apis/apps/v1). Pure."""

from __future__ import annotations

from typing import Any

from .resources import ResourceType, in_group_version

GROUPS: dict[str, list[str]] = {"apps": ["v1"]}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_SUB_VERBS = {
    "status": ["get", "patch", "update"],
    "log": ["get"],
    "exec": ["create", "get"],
    "attach": ["create", "get"],
    "portforward": ["create", "get"],
    "scale": ["get", "patch", "update"],
}
_CATEGORIES = {"pods": ["all"], "services": ["all"], "deployments": ["all"]}


def version_info() -> dict[str, Any]:
    return {
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.4",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def api_group(name: str) -> dict[str, Any]:
    versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in GROUPS[name]]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def api_group_list() -> dict[str, Any]:
    groups = [api_group(name) for name in GROUPS]
    for g in groups:
        del g["kind"], g["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _resource_entries(rt: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": rt.name,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": _VERBS if rt.namespaced else [v for v in _VERBS if v != "deletecollection"],
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.name in _CATEGORIES:
        main["categories"] = _CATEGORIES[rt.name]
    entries = [main]
    for sub in rt.subresources:
        entry: dict[str, Any] = {
            "name": f"{rt.name}/{sub}",
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": _SUB_VERBS[sub],
        }
        if sub == "scale":
            entry.update(group="autoscaling", version="v1", kind="Scale")
        entries.append(entry)
    return entries


def api_resource_list(group: str, version: str) -> dict[str, Any] | None:
    """The APIResourceList of a group/version (None if it is not served)."""
    if group and version not in GROUPS.get(group, []):
        return None
    if not group and version != "v1":
        return None
    resources: list[dict[str, Any]] = []
    for rt in in_group_version(group, version):
        resources.extend(_resource_entries(rt))
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
