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

The sidecar's parts: :mod:`.sidecar`; patching workloads: :mod:`.workloads`; text in and out:
:mod:`.manifests`. Everything a caller needs is importable from here.
"""

from __future__ import annotations

from watchproxy.inject.manifests import InjectError, dump_manifests, parse_manifests
from watchproxy.inject.sidecar import (
    ADMIN_PORT,
    API_PORT,
    CONFIG_DIR,
    CONFIG_KEY,
    CONFIG_MAP,
    CONFIG_VOLUME,
    DEFAULT_IMAGE,
    KUBECONFIG_DIR,
    KUBECONFIG_KEY,
    KUBECONFIG_MAP,
    KUBECONFIG_PATH,
    KUBECONFIG_VOLUME,
    POD_LABEL,
    SIDECAR,
    SIDECAR_CONFIG,
    TMP_VOLUME,
    TOKEN_DIR,
    TOKEN_VOLUME,
    app_env,
    app_mount,
    config_maps,
    sidecar_container,
    sidecar_volumes,
)
from watchproxy.inject.workloads import (
    POD_TEMPLATES,
    inject_documents,
    inject_pod_spec,
    inject_workload,
    pod_template_path,
)

__all__ = [
    "ADMIN_PORT",
    "API_PORT",
    "CONFIG_DIR",
    "CONFIG_KEY",
    "CONFIG_MAP",
    "CONFIG_VOLUME",
    "DEFAULT_IMAGE",
    "KUBECONFIG_DIR",
    "KUBECONFIG_KEY",
    "KUBECONFIG_MAP",
    "KUBECONFIG_PATH",
    "KUBECONFIG_VOLUME",
    "POD_LABEL",
    "POD_TEMPLATES",
    "SIDECAR",
    "SIDECAR_CONFIG",
    "TMP_VOLUME",
    "TOKEN_DIR",
    "TOKEN_VOLUME",
    "InjectError",
    "app_env",
    "app_mount",
    "config_maps",
    "dump_manifests",
    "inject_documents",
    "inject_pod_spec",
    "inject_workload",
    "parse_manifests",
    "pod_template_path",
    "sidecar_container",
    "sidecar_volumes",
]
