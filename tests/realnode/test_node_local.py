"""Node-local mode for real: the Helm chart's DaemonSet rolled out by the controller manager,
and two tenant pods on the node that reach it as docs/deploying.md ("Node-local mode") says,
sharing one upstream watch.

One difference from a cluster: the tier runs no kube-proxy and no cluster DNS, so the tenants'
documented server name, ``watchproxy.watchproxy-system.svc``, resolves through the tenant
pods' ``hostAliases`` to the proxy pod's IP, which is where the Service (``internalTrafficPolicy:
Local``) would send them on a one-node cluster. Everything else is as documented: the chart
as ``helm template`` renders it, the namespace label, the tenant kubeconfig from ``watchproxy
kubeconfig --server http://watchproxy.watchproxy-system.svc:8001``, ``KUBECONFIG``. The bridge
CNI plugin enforces no NetworkPolicy: the chart's policy is applied, not tested.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.tools import find_tool
from tests.realapi.fixture import ci_requires_tier
from tests.realnode.cluster import KUBECTL, Cluster, LineStream
from tests.realnode.conftest import MEASURED
from tests.realnode.node import Node

REPO = Path(__file__).resolve().parents[2]
SERVER_NAME = "watchproxy.watchproxy-system.svc"


def tenant(name: str, proxy_ip: str) -> dict[str, Any]:
    script = (
        'echo "tenant: started"; '
        'exec kubectl --namespace "$POD_NAMESPACE" get configmaps --watch --no-headers '
        "-o custom-columns=NAME:.metadata.name,RV:.metadata.resourceVersion"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"tenant": name}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "hostAliases": [{"ip": proxy_ip, "hostnames": [SERVER_NAME]}],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "tenant",
                    "image": "wprn-app:1",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "env": [
                        {"name": "KUBECONFIG", "value": "/etc/watchproxy/config"},
                        {
                            "name": "POD_NAMESPACE",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        },
                    ],
                    "volumeMounts": [{"name": "kubeconfig", "mountPath": "/etc/watchproxy"}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "volumes": [{"name": "kubeconfig", "configMap": {"name": "watchproxy-kubeconfig"}}],
        },
    }


def test_chart_daemonset_serves_two_tenant_pods_from_one_shared_watch(
    node: Node, tmp_path: Path
) -> None:
    helm = find_tool("helm")
    if helm is None:
        if ci_requires_tier():
            pytest.fail("CI=true and helm is missing (scripts/tools.sh builds it)")
        pytest.skip("helm not found (scripts/tools.sh builds it into ~/.cache/watchproxy-tools)")
    cluster = Cluster(node)
    rendered = subprocess.run(
        [helm, "template", "watchproxy", str(REPO / "deploy" / "helm" / "watchproxy"),
         "--namespace", "watchproxy-system", "--kube-version", "1.37.2"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    # (helm install reads the version from the cluster; helm template is told it.)
    cluster.kubectl("create", "namespace", "watchproxy-system")
    try:
        cluster.kubectl("apply", "-n", "watchproxy-system", "-f", "-", stdin=rendered)
        # The controller manager creates the pod, the scheduler places it, the kubelet runs it
        # until its readiness probe passes (kubectl's rollout status watches the DaemonSet).
        rollout = cluster.kubectl(
            "rollout", "status", "-n", "watchproxy-system", "daemonset/watchproxy",
            "--timeout=90s", timeout=95, check=False,
        )  # fmt: skip
        if rollout.returncode != 0:
            events = cluster.kubectl("get", "events", "-n", "watchproxy-system", check=False)
            logs = cluster.kubectl(
                "logs", "-n", "watchproxy-system", "daemonset/watchproxy", "--previous", check=False
            )
            raise AssertionError(
                f"{rollout.stderr.decode()}\n{events.stdout.decode()[-3000:]}\n"
                f"{logs.stdout.decode()[-3000:]}{logs.stderr.decode()[-3000:]}"
            )
        proxy = cluster.get("pods", "-n", "watchproxy-system")["items"]
        assert len(proxy) == 1
        proxy_pod = proxy[0]["metadata"]["name"]
        proxy_ip = proxy[0]["status"]["podIP"]

        namespace = f"nl-{secrets.token_hex(3)}"
        cluster.create_namespace(namespace)
        cluster.kubectl("label", "namespace", namespace, "watchproxy-client=true")
        kubeconfig = subprocess.run(
            [str(REPO / ".venv" / "bin" / "watchproxy"), "kubeconfig", "--server",
             f"http://{SERVER_NAME}:8001"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        (tmp_path / "config").write_text(kubeconfig, encoding="utf-8")
        cluster.kubectl(
            "create", "configmap", "watchproxy-kubeconfig", "-n", namespace,
            f"--from-file=config={tmp_path / 'config'}",
        )  # fmt: skip
        cluster.apply([tenant("tenant-a", proxy_ip), tenant("tenant-b", proxy_ip)], namespace)
        cluster.kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", "pod/tenant-a", "pod/tenant-b",
            "--timeout=60s", timeout=65,
        )  # fmt: skip
        cluster.kubectl("create", "configmap", "shared", "-n", namespace)
        rv = cluster.get("configmap", "-n", namespace, "shared")["metadata"]["resourceVersion"]
        for name in ("tenant-a", "tenant-b"):
            command = [KUBECTL, "--kubeconfig", cluster.kubeconfig, "logs", "-f", "-n", namespace]
            with LineStream([*command, name]) as stream:
                stream.wait_for(
                    lambda ls: ["shared", rv] in [line.split() for line in ls],
                    30,
                    f"the event in {name}",
                )
        # One upstream watch for both tenants' identical watches.
        metrics = cluster.kubectl(
            "exec", "-n", "watchproxy-system", proxy_pod, "--", "python3", "-c",
            "import urllib.request; print(urllib.request.urlopen("
            "'http://127.0.0.1:8081/metrics', timeout=10).read().decode())",
        ).stdout.decode()  # fmt: skip
        subscribers = re.search(
            r'^watchproxy_watch_subscribers\{resource="v1/configmaps"\} (\S+)$', metrics, re.M
        )
        shared = re.search(r"^watchproxy_shared_watches (\S+)$", metrics, re.M)
        assert subscribers and float(subscribers.group(1)) == 2.0, subscribers
        assert shared and float(shared.group(1)) == 1.0, shared
        status = cluster.kubectl(
            "exec", "-n", "watchproxy-system", proxy_pod, "--", "cat", "/proc/1/status"
        ).stdout.decode()
        rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        assert rss
        MEASURED["node-local proxy RSS, two tenants' shared watch (MiB)"] = round(
            int(rss.group(1)) / 1024, 1
        )
    finally:
        cluster.kubectl(
            "delete", "-n", "watchproxy-system", "-f", "-", "--wait=false",
            stdin=rendered, check=False,
        )  # fmt: skip
        cluster.kubectl("delete", "namespace", "watchproxy-system", "--wait=false", check=False)
