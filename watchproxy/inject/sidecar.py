"""What the sidecar is: its container, volumes, ConfigMaps and the app containers' additions.

Names, ports and paths shared with ``deploy/components/sidecar`` are constants here, and
:data:`SIDECAR_CONFIG` is that component's ``config.yaml`` byte for byte. Pure values only.
"""

from __future__ import annotations

from typing import Any

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
  # /debug/watches answers loopback clients only (kubectl port-forward); the probes and
  # /metrics answer everyone who reaches the port.
  debug_view: loopback
upstream:
  mode: in-cluster
hub:
  # Sized to the container's 256Mi memory limit: 43 MiB of process, 1.2 bytes of RSS per byte
  # of cached JSON and 1.4 per byte of history leave 40 MiB spare (tests/deploy/test_deploy.py).
  cache_max_bytes: 100663296  # 96 MiB
  history_max_bytes: 33554432  # 32 MiB
security:
  identity: serviceaccount
logging:
  json: true
"""


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
            # The pod's own namespace as the context's, as in-cluster clients default to it;
            # without one, kubeconfig clients would use "default".
            "data": {KUBECONFIG_KEY: render_kubeconfig(namespace=namespace)},
        },
    ]
