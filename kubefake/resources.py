"""The resource types the fake apiserver serves, and how they are named in URLs and discovery."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceType:
    """One served resource (plural name as in URLs), its kind, group/version and scope."""

    name: str
    singular: str
    kind: str
    group: str
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    has_generation: bool = False
    field_labels: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


_ALL = (
    ResourceType(
        "pods",
        "pod",
        "Pod",
        "",
        "v1",
        True,
        ("po",),
        ("status", "log", "exec", "attach", "portforward"),
        field_labels=(
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
    ),
    ResourceType("configmaps", "configmap", "ConfigMap", "", "v1", True, ("cm",)),
    ResourceType("secrets", "secret", "Secret", "", "v1", True, (), field_labels=("type",)),
    ResourceType("services", "service", "Service", "", "v1", True, ("svc",), ("status",)),
    ResourceType(
        "namespaces",
        "namespace",
        "Namespace",
        "",
        "v1",
        False,
        ("ns",),
        ("status",),
        field_labels=("status.phase",),
    ),
    ResourceType(
        "deployments",
        "deployment",
        "Deployment",
        "apps",
        "v1",
        True,
        ("deploy",),
        ("status", "scale"),
        has_generation=True,
    ),
)

RESOURCES: dict[str, ResourceType] = {r.name: r for r in _ALL}


def resource_type(name: str) -> ResourceType:
    """The type of a resource name (KeyError for unknown names)."""
    return RESOURCES[name]


def in_group_version(group: str, version: str) -> list[ResourceType]:
    return [r for r in _ALL if r.group == group and r.version == version]


def lookup(group: str, version: str, name: str) -> ResourceType | None:
    rt = RESOURCES.get(name)
    if rt is None or rt.group != group or rt.version != version:
        return None
    return rt
