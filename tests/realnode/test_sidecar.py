"""watchproxy as a native sidecar for real: a Deployment passed through ``watchproxy inject``
(or built with the kustomize component deploy/components/sidecar) and applied unchanged, on a
kubelet 1.37, in a namespace where Pod Security ``restricted`` is enforced. The app is kubectl
watching configmaps through the sidecar.

The tests of this module share one Deployment per way of adding the sidecar (starting it is
most of their cost); the last one deletes its pod.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realnode.cluster import KUBECTL, Cluster, LineStream
from tests.realnode.conftest import MEASURED
from tests.realnode.images import VERSION
from tests.realnode.node import Node

REPO = Path(__file__).resolve().parents[2]
# The app traps SIGTERM: on deletion it makes one more request through the sidecar, which must
# still be serving (a native sidecar stops after the app containers), and exits 0.
APP_SCRIPT = """
on_term() {
    echo "app: SIGTERM"
    kubectl $NS get configmap kube-root-ca.crt -o name && echo "app: served after SIGTERM"
    exit 0
}
trap on_term TERM
NS=${POD_NAMESPACE:+--namespace=$POD_NAMESPACE}
echo "app: started"
kubectl $NS get configmaps --watch --no-headers \\
    -o custom-columns=NAME:.metadata.name,RV:.metadata.resourceVersion &
wait
"""


def app_deployment(namespace: str, *, namespace_from_pod: bool = False) -> dict[str, Any]:
    """What a user writes: an app with its ServiceAccount, compliant with ``restricted``.

    ``namespace_from_pod``: the app names its namespace itself (POD_NAMESPACE from the downward
    API), as it must under the kustomize component, whose kubeconfig cannot know the namespace
    (``watchproxy inject`` writes it into the kubeconfig; docs/deploying.md, "Namespace")."""
    env = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "app", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "app"}},
            "template": {
                "metadata": {"labels": {"app": "app"}},
                "spec": {
                    "serviceAccountName": "app",
                    "terminationGracePeriodSeconds": 20,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "app",
                            "image": "wprn-app:1",
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", APP_SCRIPT],
                            "env": env if namespace_from_pod else [],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


def inject(manifest: dict[str, Any], tmp_path: Path) -> str:
    source = tmp_path / "app.yaml"
    source.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "watchproxy"), "inject", "-f", str(source)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


@dataclass
class App:
    namespace: str
    pod: dict[str, Any]
    injected: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


def kustomize(manifest: dict[str, Any], tmp_path: Path) -> str:
    """The app's kustomization with the sidecar component, as deploy/components/sidecar says."""
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")
    component = os.path.relpath(REPO / "deploy" / "components" / "sidecar", tmp_path)
    kustomization = {
        "namespace": manifest["metadata"]["namespace"],
        "resources": ["deployment.yaml"],
        "components": [component],
        "images": [{"name": "watchproxy", "newTag": VERSION}],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    done = subprocess.run(
        [KUBECTL, "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


@pytest.fixture(scope="module", params=["inject", "kustomize"])
def app(
    node: Node, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[App]:
    """The app with the sidecar added by ``watchproxy inject`` or by the kustomize component,
    applied as that tool writes it."""
    cluster = Cluster(node)
    namespace = f"sc-{secrets.token_hex(3)}"
    cluster.create_namespace(namespace)
    render = inject if request.param == "inject" else kustomize
    manifest = app_deployment(namespace, namespace_from_pod=request.param == "kustomize")
    injected = render(manifest, tmp_path_factory.mktemp(request.param))
    started = time.monotonic()
    # Unchanged: the output of `watchproxy inject`, as a user pipes it to kubectl apply.
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=injected)
    pod = cluster.wait_pod_ready(namespace, "app=app", timeout=90)
    MEASURED[f"{request.param}: pod apply to Ready (s)"] = round(time.monotonic() - started, 1)
    yield App(namespace, pod, list(yaml.safe_load_all(injected)))
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    status = pod["status"]
    return {
        s["name"]: s
        for s in status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
    }


def test_injected_pod_runs_watchproxy_as_a_native_sidecar_started_before_the_app(
    app: App, cluster: Cluster
) -> None:
    spec = app.pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["watchproxy"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert spec["initContainers"][0]["image"] == f"watchproxy:{VERSION}"
    found = statuses(app.pod)
    sidecar, main = found["watchproxy"], found["app"]
    assert sidecar["started"] and sidecar["ready"] and main["ready"]
    assert sidecar["restartCount"] == 0 and main["restartCount"] == 0
    # The kubelet starts the app only once the sidecar's startupProbe passed: the app's first
    # request through it succeeded (a refused connection would have failed and restarted it).
    assert sidecar["state"]["running"]["startedAt"] <= main["state"]["running"]["startedAt"]
    logs = cluster.kubectl("logs", "-n", app.namespace, app.name, "-c", "app").stdout.decode()
    assert logs.startswith("app: started\n")
    assert "refused" not in logs and "error" not in logs.lower()
    # The probes the kubelet runs answer on the pod IP (the admin port). The startup probe
    # may fail while the process starts (that is what holds the app back); liveness and
    # readiness never do.
    events = cluster.get(
        "events", "-n", app.namespace, "--field-selector", f"involvedObject.name={app.name}"
    )
    failed = [
        e["message"]
        for e in events["items"]
        if e["reason"] == "Unhealthy" and not e["message"].startswith("Startup probe failed")
    ]
    assert failed == []


def test_app_watch_through_the_sidecar_matches_the_apiservers_record(
    app: App, cluster: Cluster
) -> None:
    for i in range(5):
        cluster.kubectl(
            "create", "configmap", f"cm-{i}", "-n", app.namespace, f"--from-literal=i={i}"
        )
    cluster.kubectl("patch", "configmap", "cm-0", "-n", app.namespace, "-p", '{"data":{"i":"x"}}')
    record = cluster.get("configmaps", "-n", app.namespace)["items"]
    expected = {(c["metadata"]["name"], c["metadata"]["resourceVersion"]) for c in record}
    with LineStream(
        [
            KUBECTL,
            "--kubeconfig",
            cluster.kubeconfig,
            "logs",
            "-f",
            "-n",
            app.namespace,
            app.name,
            "-c",
            "app",
        ]
    ) as logs:
        seen = logs.wait_for(
            lambda lines: expected <= {tuple(line.split()) for line in lines},
            timeout=30,
            what="every configmap's state in the app's watch",
        )
    watched = [tuple(line.split()) for line in seen if not line.startswith("app:")]
    # Every state the apiserver recorded, once each, in resourceVersion order per object.
    assert set(watched) >= expected
    assert len(watched) == len(set(watched)), watched
    cm0 = [int(rv) for name, rv in watched if name == "cm-0"]
    assert cm0 == sorted(cm0) and len(cm0) == 2
    # The watch went through the sidecar: its hub serves one configmaps watch.
    metrics = cluster.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{app.namespace}/pods/{app.name}:8081/proxy/metrics"
    ).stdout.decode()
    assert re.search(
        r'^watchproxy_watch_subscribers\{resource="v1/configmaps"\} 1\.0$', metrics, re.M
    ), [
        line
        for line in metrics.splitlines()
        if re.match(r"watchproxy_(watch_sub|watch_pass|shared|requests_in)", line)
    ]


def test_sidecar_runs_as_65532_on_a_read_only_root_under_restricted_pod_security(
    app: App, cluster: Cluster
) -> None:
    ns = cluster.get("namespace", app.namespace)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    exec_ = ["exec", "-n", app.namespace, app.name, "-c", "watchproxy", "--"]
    assert cluster.kubectl(*exec_, "id", "-u").stdout == b"65532\n"
    refused = cluster.kubectl(*exec_, "touch", "/opt/venv/x", check=False)
    assert refused.returncode != 0 and b"Read-only file system" in refused.stderr
    # /tmp is the emptyDir the injection adds: writable.
    assert cluster.kubectl(*exec_, "touch", "/tmp/x", check=False).returncode == 0
    # The memory limit reached the container's cgroup (v1 here).
    limit = cluster.kubectl(*exec_, "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes").stdout
    assert int(limit) == 256 * 1024 * 1024
    status = cluster.kubectl(*exec_, "cat", "/proc/1/status").stdout.decode()
    rss_kb = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))  # type: ignore[union-attr]
    MEASURED["sidecar RSS serving the app's watch (MiB)"] = round(rss_kb / 1024, 1)
    MEASURED["sidecar memory.usage_in_bytes of its cgroup (MiB)"] = round(
        int(cluster.kubectl(*exec_, "cat", "/sys/fs/cgroup/memory/memory.usage_in_bytes").stdout)
        / 2**20,
        1,
    )
    # A pod that drops the injected securityContext is refused by the same namespace: the
    # sidecar was admitted by an enforcing policy, not by a permissive one.
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged-sidecar", "namespace": app.namespace},
        "spec": {"containers": [{"name": "c", "image": f"watchproxy:{VERSION}"}]},
    }
    done = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert done.returncode != 0 and b"violates PodSecurity" in done.stderr


class HeldWatch(threading.Thread):
    """A plain HTTP watch through a port-forward, read until the stream ends."""

    def __init__(self, port: int, path: str) -> None:
        super().__init__(daemon=True)
        self.port, self.path = port, path
        self.lines: list[bytes] = []
        self.ending: str | None = None
        self.opened = threading.Event()

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request("GET", self.path)
            response = connection.getresponse()
            self.opened.set()
            while line := response.readline():
                self.lines.append(line)
            self.ending = "clean end of stream"
        except (http.client.IncompleteRead, OSError) as error:
            self.ending = f"{type(error).__name__}: {error}"
        finally:
            self.opened.set()
            connection.close()


def test_deleting_the_pod_stops_the_app_first_and_the_sidecar_ends_its_open_watches(
    app: App, cluster: Cluster
) -> None:
    kc = ["--kubeconfig", cluster.kubeconfig, "-n", app.namespace]
    # A watch held open through the sidecar itself (port-forward to its loopback API port).
    with LineStream([KUBECTL, *kc, "port-forward", f"pod/{app.name}", ":8001"]) as forward:
        lines = forward.wait_for(
            lambda ls: any("Forwarding from 127.0.0.1:" in line for line in ls),
            timeout=20,
            what="port-forward",
        )
        port = int(re.search(r"127\.0\.0\.1:(\d+)", "\n".join(lines)).group(1))  # type: ignore[union-attr]
        held = HeldWatch(port, f"/api/v1/namespaces/{app.namespace}/configmaps?watch=1")
        held.start()
        assert held.opened.wait(15)
        pod_watch = LineStream(
            [KUBECTL, *kc, "get", "--raw",
             f"/api/v1/namespaces/{app.namespace}/pods?watch=1&fieldSelector=metadata.name={app.name}"]
        )  # fmt: skip
        app_logs = LineStream([KUBECTL, *kc, "logs", "-f", app.name, "-c", "app"])
        with pod_watch, app_logs:
            pod_watch.wait_for(bool, timeout=15, what="the pod watch's first event")
            cluster.kubectl(*kc[2:], "delete", "pod", app.name, "--wait=false")
            app_logs.wait_for(
                lambda ls: "app: served after SIGTERM" in ls, timeout=30, what="the app's SIGTERM"
            )
            events = pod_watch.wait_for(
                lambda ls: any('"type":"DELETED"' in line for line in ls),
                timeout=60,
                what="the pod's deletion",
            )
        held.join(30)
    last = json.loads([line for line in events if line.strip()][-1])["object"]
    found = statuses(last)
    sidecar = found["watchproxy"]["state"]["terminated"]
    main = found["app"]["state"]["terminated"]
    assert main["exitCode"] == 0 and sidecar["exitCode"] == 0, (main, sidecar)
    assert main["finishedAt"] <= sidecar["finishedAt"]
    # The sidecar ended the watch it held at SIGTERM with a clean end of the stream.
    assert held.ending == "clean end of stream", held.ending
    assert any(b"kube-root-ca.crt" in line for line in held.lines)
