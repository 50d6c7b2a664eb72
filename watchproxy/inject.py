"""Add the watchproxy native sidecar to workload manifests (``watchproxy inject``).

Pure: manifests in as parsed YAML/JSON values, manifests out; nothing here reads a file, the
environment or a clock. The kustomize Component ``deploy/components/sidecar`` makes the same
change with kustomize's own tools, and ``tests/deploy/test_sidecar.py`` renders both on the same
workloads and compares the pod templates, so the two cannot drift apart.

What a workload gets (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob):

- watchproxy as the first init container with ``restartPolicy: Always`` (a native sidecar,
  Kubernetes 1.29+): it starts before every other container and stops after them;
- ``automountServiceAccountToken: false`` and a projected ServiceAccount token, CA and namespace
  mounted into watchproxy alone, at the path in-cluster clients look in;
- in every regular container, ``KUBECONFIG`` pointing at a kubeconfig whose server is
  ``http://127.0.0.1:8001`` (what ``watchproxy kubeconfig`` prints), mounted from a ConfigMap;
- the pod label ``watchproxy: sidecar`` (the PodMonitor in ``deploy/monitoring`` selects it).

Every change is an upsert keyed by name, so injecting twice gives what injecting once gives.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from watchproxy import __version__
from watchproxy.kube.kubeconfig import render_kubeconfig

SIDECAR = "watchproxy"
DEFAULT_IMAGE = f"watchproxy:{__version__}"

CONFIG_MAP = "watchproxy-config"
KUBECONFIG_MAP = "watchproxy-kubeconfig"
CONFIG_DIR = "/etc/watchproxy"
CONFIG_KEY = "config.yaml"
KUBECONFIG_DIR = "/var/run/watchproxy"
KUBECONFIG_KEY = "kubeconfig"
KUBECONFIG_PATH = f"{KUBECONFIG_DIR}/{KUBECONFIG_KEY}"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_LABEL = ("watchproxy", "sidecar")

# Volume names carry the prefix so that they do not collide with the app's own.
TOKEN_VOLUME = "watchproxy-serviceaccount"
CONFIG_VOLUME = "watchproxy-config"
KUBECONFIG_VOLUME = "watchproxy-kubeconfig"
TMP_VOLUME = "watchproxy-tmp"

# Port names are unique in the pod, whatever the app calls its own ports: "admin" is common,
# and a PodMonitor selecting it would scrape the app's port too.
API_PORT = ("wp-api", 8001)
ADMIN_PORT = ("wp-admin", 8081)

# The sidecar's configuration (deploy/components/sidecar/config.yaml is this text, byte for
# byte). Every key and its default: config.example.yaml.
SIDECAR_CONFIG = """\
# watchproxy as a sidecar. Every key and its default: config.example.yaml.
listen:
  # Loopback only: just the containers of this pod can reach the API port.
  host: 127.0.0.1
  port: 8001
admin:
  # The kubelet's probes and Prometheus arrive on the pod IP.
  host: 0.0.0.0
  port: 8081
upstream:
  mode: in-cluster
security:
  identity: serviceaccount
logging:
  json: true
"""

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


class InjectError(ValueError):
    """The input is not a set of Kubernetes manifests this module can patch. One line."""


def sidecar_container(image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """The watchproxy init container, as a native sidecar."""

    def probe(path: str, period: int, **more: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": ADMIN_PORT[0]}, "periodSeconds": period, **more}

    return {
        "name": SIDECAR,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": ["run", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}"],
        "ports": [
            # The API port is bound to 127.0.0.1: declared for documentation only.
            {"name": API_PORT[0], "containerPort": API_PORT[1], "protocol": "TCP"},
            {"name": ADMIN_PORT[0], "containerPort": ADMIN_PORT[1], "protocol": "TCP"},
        ],
        # The kubelet starts the app containers once this passes.
        "startupProbe": probe("/healthz", 1, failureThreshold=30),
        "livenessProbe": probe("/healthz", 10, timeoutSeconds=2, failureThreshold=3),
        # Part of the pod's readiness: the pod leaves its Services while the apiserver is
        # unreachable (docs/deploying.md says when to point it at /healthz instead).
        "readinessProbe": probe("/readyz", 5, timeoutSeconds=2, failureThreshold=3),
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
        ],
    }


def sidecar_volumes() -> list[dict[str, Any]]:
    """The pod volumes the sidecar and the app's kubeconfig mount."""
    return [
        # What the ServiceAccount admission plugin adds as kube-api-access-*: a bound, rotating
        # token, the cluster CA and the namespace. Only watchproxy mounts it.
        {
            "name": TOKEN_VOLUME,
            "projected": {
                "defaultMode": 0o444,
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ],
            },
        },
        {"name": CONFIG_VOLUME, "configMap": {"name": CONFIG_MAP}},
        {"name": KUBECONFIG_VOLUME, "configMap": {"name": KUBECONFIG_MAP}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}},
    ]


def app_env() -> dict[str, Any]:
    return {"name": "KUBECONFIG", "value": KUBECONFIG_PATH}


def app_mount() -> dict[str, Any]:
    # ConfigMap volumes are always mounted read-only by the kubelet; no readOnly needed.
    return {"name": KUBECONFIG_VOLUME, "mountPath": KUBECONFIG_DIR}


def config_maps(namespace: str | None) -> list[dict[str, Any]]:
    """The sidecar's configuration and the app's kubeconfig, in ``namespace`` (None: unset)."""
    metadata = {"namespace": namespace} if namespace is not None else {}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, **metadata},
            "data": {CONFIG_KEY: SIDECAR_CONFIG},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": KUBECONFIG_MAP, **metadata},
            "data": {KUBECONFIG_KEY: render_kubeconfig()},
        },
    ]


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


def inject_pod_spec(spec: dict[str, Any], image: str = DEFAULT_IMAGE, where: str = "spec") -> None:
    """Add the sidecar to a pod spec, in place."""
    containers = _list(spec, "containers", where)
    if not containers:
        raise InjectError(f"{where}.containers is missing or empty")
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
        container["env"] = _upsert(_list(container, "env", here), app_env())
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


def inject_workload(doc: dict[str, Any], image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """A copy of ``doc`` with the sidecar added; other kinds come back as they are."""
    path = pod_template_path(doc)
    if path is None:
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
    inject_pod_spec(spec, image, where=f"{where}: {'.'.join(path)}.spec")
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


def inject_documents(docs: Sequence[Any], image: str = DEFAULT_IMAGE) -> list[dict[str, Any]]:
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
            injected = [inject_workload(item, image) for item in items]
            result.append({**doc, "items": injected})
            touched = [i for i in items if pod_template_path(i) is not None]
        else:
            result.append(inject_workload(doc, image))
            touched = [doc] if pod_template_path(doc) is not None else []
        for workload in touched:
            if _namespace(workload) not in namespaces:
                namespaces.append(_namespace(workload))
    present = {(_namespace(o), _name(o)) for o in _objects(checked) if o.get("kind") == "ConfigMap"}
    added = [
        config_map
        for namespace in namespaces
        for config_map in config_maps(namespace)
        if (namespace, _name(config_map)) not in present
    ]
    return added + result


# --------------------------------------------------------------------------------------------
# Text in, text out (still pure: the caller reads and writes).


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
