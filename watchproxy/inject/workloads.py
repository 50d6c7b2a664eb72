"""Adding the sidecar to workloads: pod specs, the kinds that hold a pod template, and
whole documents (with the ConfigMaps added once per namespace).

Every change is an upsert keyed by name, so injecting twice gives what injecting once gives.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from watchproxy.inject.manifests import InjectError
from watchproxy.inject.sidecar import (
    ADMIN_PORT,
    API_PORT,
    DEFAULT_IMAGE,
    KUBECONFIG_PATH,
    POD_LABEL,
    SIDECAR,
    app_env,
    app_mount,
    config_maps,
    sidecar_container,
    sidecar_volumes,
)

# (API group, kind) -> the path from the object to its pod template. Any version of the group:
# the path has not changed between them.
POD_TEMPLATES: dict[tuple[str, str], tuple[str, ...]] = {
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}


def _upsert(items: list[Any], item: dict[str, Any]) -> list[Any]:
    """``items`` with ``item`` where the first entry of its name was (any other entry of that
    name dropped), or appended."""

    def same(existing: Any) -> bool:
        return isinstance(existing, dict) and existing.get("name") == item["name"]

    first = next((i for i, existing in enumerate(items) if same(existing)), len(items))
    return [
        *(e for e in items[:first] if not same(e)),
        item,
        *(e for e in items[first:] if not same(e)),
    ]


def _list(owner: dict[str, Any], field: str, where: str) -> list[Any]:
    value = owner.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InjectError(f"{where}.{field} must be a list")
    return value


Warn = Callable[[str], None]


def _ignore(_: str) -> None:
    pass


def _check_pod_network(spec: dict[str, Any], where: str) -> None:
    """Refuse a pod whose network would break the sidecar's promise of a private API port."""
    if spec.get("hostNetwork") is True:
        # 127.0.0.1 would be the node's loopback: every process on the node could use the
        # pod's ServiceAccount through the API port, and two such pods on a node collide.
        raise InjectError(
            f"{where}.hostNetwork is true: watchproxy's API port would be open to the whole "
            "node (use the node-local mode, docs/deploying.md)"
        )
    ours = {API_PORT[1]: API_PORT[0], ADMIN_PORT[1]: ADMIN_PORT[0]}
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(_list(spec, kind, where)):
            if not isinstance(container, dict) or container.get("name") == SIDECAR:
                continue
            for port in _list(container, "ports", f"{where}.{kind}[{index}]"):
                number = port.get("containerPort") if isinstance(port, dict) else None
                if number in ours:
                    raise InjectError(
                        f"{where}.{kind}[{index}] ({container.get('name')}) uses port {number}, "
                        f"watchproxy's {ours[number]} port; containers of a pod share one network"
                    )


def inject_pod_spec(
    spec: dict[str, Any],
    image: str = DEFAULT_IMAGE,
    where: str = "spec",
    warn: Warn = _ignore,
) -> None:
    """Add the sidecar to a pod spec, in place. ``warn`` gets one line per change the user may
    not expect (a KUBECONFIG of the app's own replaced)."""
    containers = _list(spec, "containers", where)
    if not containers:
        raise InjectError(f"{where}.containers is missing or empty")
    _check_pod_network(spec, where)
    spec["automountServiceAccountToken"] = False
    init = [
        c
        for c in _list(spec, "initContainers", where)
        if not (isinstance(c, dict) and c.get("name") == SIDECAR)
    ]
    # First, so that the user's own init containers run with the proxy up.
    spec["initContainers"] = [sidecar_container(image), *init]
    volumes = _list(spec, "volumes", where)
    for volume in sidecar_volumes():
        volumes = _upsert(volumes, volume)
    spec["volumes"] = volumes
    for index, container in enumerate(containers):
        if not isinstance(container, dict):
            raise InjectError(f"{where}.containers[{index}] must be a mapping")
        here = f"{where}.containers[{index}]"
        env = _list(container, "env", here)
        for item in env:
            own = isinstance(item, dict) and item.get("name") == "KUBECONFIG"
            if own and item.get("value") != KUBECONFIG_PATH:
                shown = item.get("value", "valueFrom")
                warn(
                    f"{here} ({container.get('name')}): its KUBECONFIG ({shown}) is replaced "
                    f"by watchproxy's ({KUBECONFIG_PATH})"
                )
        container["env"] = _upsert(env, app_env())
        container["volumeMounts"] = _upsert(_list(container, "volumeMounts", here), app_mount())


def _mapping(owner: dict[str, Any], field: str, where: str) -> dict[str, Any]:
    value = owner.get(field)
    if value is None:
        value = owner[field] = {}
    if not isinstance(value, dict):
        raise InjectError(f"{where}.{field} must be a mapping")
    return value


def _describe(doc: dict[str, Any]) -> str:
    metadata = doc.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return f"{doc.get('kind')} {name or '(no name)'}"


def pod_template_path(doc: dict[str, Any]) -> tuple[str, ...] | None:
    """Where ``doc`` keeps its pod template, or None for a kind without one known here."""
    api_version = doc.get("apiVersion")
    kind = doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    group = api_version.rpartition("/")[0]
    return POD_TEMPLATES.get((group, kind))


def inject_workload(
    doc: dict[str, Any], image: str = DEFAULT_IMAGE, warn: Warn = _ignore
) -> dict[str, Any]:
    """A copy of ``doc`` with the sidecar added; other kinds come back as they are, except a
    bare Pod, which is refused: it cannot be changed once created, and the kustomize component
    does not touch one either."""
    path = pod_template_path(doc)
    if path is None:
        if doc.get("kind") == "Pod" and doc.get("apiVersion") == "v1":
            raise InjectError(
                f"{_describe(doc)}: a bare Pod is not injected; put it in a Deployment, Job or "
                "another workload with a pod template"
            )
        return doc
    result = copy.deepcopy(doc)
    where = _describe(doc)
    template: dict[str, Any] = result
    for field in path:
        if not isinstance(template.get(field), dict):
            raise InjectError(f"{where}: {'.'.join(path)} is missing")
        template = template[field]
    labels = _mapping(_mapping(template, "metadata", where), "labels", f"{where} template")
    labels[POD_LABEL[0]] = POD_LABEL[1]
    spec = template.get("spec")
    if not isinstance(spec, dict):
        raise InjectError(f"{where}: {'.'.join(path)}.spec is missing")
    inject_pod_spec(spec, image, where=f"{where}: {'.'.join(path)}.spec", warn=warn)
    return result


def _check_object(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise InjectError(f"{where} is not a Kubernetes object (no kind)")
    if not isinstance(doc.get("apiVersion"), str):
        raise InjectError(f"{where} ({doc['kind']}) has no apiVersion")
    return doc


def _namespace(doc: dict[str, Any]) -> str | None:
    metadata = doc.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return namespace if isinstance(namespace, str) else None


def _name(doc: dict[str, Any]) -> str | None:
    metadata = doc.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def _objects(docs: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """Every object, with the items of ``kind: List`` (kubectl get -o yaml) flattened."""
    for doc in docs:
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from (item for item in doc["items"] if isinstance(item, dict))
        else:
            yield doc


def inject_documents(
    docs: Sequence[Any], image: str = DEFAULT_IMAGE, warn: Warn = _ignore
) -> list[dict[str, Any]]:
    """Inject every workload in ``docs``; other objects pass through unchanged.

    The two ConfigMaps are added in front, once per namespace that holds an injected workload,
    unless the input already has a ConfigMap of that name there (then it is kept as it is, so
    a ConfigMap edited by hand survives a second injection).
    """
    checked = [
        _check_object(doc, f"document {n}")
        for n, doc in enumerate(docs, start=1)
        if doc is not None
    ]
    if not checked:
        raise InjectError("no Kubernetes objects in the input")
    result: list[dict[str, Any]] = []
    namespaces: list[str | None] = []
    for doc in checked:
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            items = [
                _check_object(item, f"item {n} of the List")
                for n, item in enumerate(doc["items"], start=1)
            ]
            injected = [inject_workload(item, image, warn) for item in items]
            result.append({**doc, "items": injected})
            touched = [i for i in items if pod_template_path(i) is not None]
        else:
            result.append(inject_workload(doc, image, warn))
            touched = [doc] if pod_template_path(doc) is not None else []
        for workload in touched:
            if _namespace(workload) not in namespaces:
                namespaces.append(_namespace(workload))
    if None in namespaces:
        warn(
            "a workload without metadata.namespace: its kubeconfig names no namespace, so "
            "clients in it use 'default' (set metadata.namespace to the one it runs in)"
        )
    present = {(_namespace(o), _name(o)) for o in _objects(checked) if o.get("kind") == "ConfigMap"}
    added = [
        config_map
        for namespace in namespaces
        for config_map in config_maps(namespace)
        if (namespace, _name(config_map)) not in present
    ]
    return added + result
