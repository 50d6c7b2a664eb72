"""The Helm chart (deploy/helm/watchproxy): node-local mode, as the kustomize overlay has it.

Rendered with `helm template` for Kubernetes 1.29 and 1.33 and validated against those schemas;
then held to the node-local overlay (same container, probes, security, RBAC, Service and
NetworkPolicy), to the project version, and to watchproxy's own config checks.
"""

from __future__ import annotations

import functools
import subprocess
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.test_deploy import (
    CRD_KINDS,
    DEPLOY,
    needs_kubectl,
    overlay,
    pod_spec,
    project_version,
    watchproxy_container,
)
from tests.deploy.tools import require_tool
from watchproxy.config import build_config

CHART = DEPLOY / "helm" / "watchproxy"
K8S_VERSIONS = ("1.29", "1.33")
RELEASE, NAMESPACE = "watchproxy", "watchproxy-system"

Objects = tuple[dict[str, Any], ...]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("helm"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@functools.cache
def render(
    *sets: str, version: str = "1.33", release: str = RELEASE, namespace: str = NAMESPACE
) -> Objects:
    args = ["template", release, str(CHART), "-n", namespace, "--kube-version", f"{version}.0"]
    for value in sets:
        args += ["--set", value]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def find(objects: Objects, kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def chart_config(objects: Objects) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(find(objects, "ConfigMap")["data"]["config.yaml"])
    return config


def test_chart_lints_clean() -> None:
    result = helm("lint", "--strict", str(CHART), "--kube-version", "1.33.0")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "sets",
    [(), ("podMonitor.enabled=true", "networkPolicy.adminFrom[0].podSelector.matchLabels.a=b")],
    ids=["defaults", "podmonitor"],
)
def test_chart_renders_valid_kubernetes(version: str, sets: tuple[str, ...]) -> None:
    objects = render(*sets, version=version)
    kinds = {o["kind"] for o in objects}
    assert kinds >= {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Service",
        "NetworkPolicy",
    }
    for doc in objects:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)


def test_chart_and_app_versions_are_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["version"] == chart["appVersion"] == project_version()


def test_image_is_set_in_one_place() -> None:
    default = watchproxy_container(find(render(), "DaemonSet")["spec"]["template"]["spec"])
    assert default["image"] == f"watchproxy:{project_version()}"
    chosen = render("image.repository=registry.example.com/watchproxy")
    container = watchproxy_container(find(chosen, "DaemonSet")["spec"]["template"]["spec"])
    assert container["image"] == f"registry.example.com/watchproxy:{project_version()}"


def test_values_schema_refuses_typos_and_bad_ports() -> None:
    bad = "imagee.repository=x,config.listen.port=99999,service.port=http"
    result = helm("template", RELEASE, str(CHART), "--kube-version", "1.33.0", "--set", bad)
    assert result.returncode != 0
    for where in ("'imagee' not allowed", "/config/listen/port", "/service/port"):
        assert where in result.stderr, result.stderr


def test_config_is_valid_and_lets_tenants_in_by_the_service_name() -> None:
    objects = render(release="edge", namespace="infra")
    config = chart_config(objects)
    build_config(config, file_name="chart config")
    service = find(objects, "Service")
    assert service["metadata"]["name"] == "edge-watchproxy"
    hosts = config["listen"]["allowed_hosts"]
    assert hosts[:2] == ["edge-watchproxy.infra.svc", "edge-watchproxy.infra.svc.cluster.local"]
    assert config["listen"]["allow_non_loopback"] is True


def test_the_debug_view_answers_loopback_clients_only() -> None:
    config = build_config(chart_config(render()), file_name="chart config")
    assert config.admin.host == "0.0.0.0"  # the probes and Prometheus reach the pod IP
    assert config.admin.debug_view == "loopback"


def test_config_change_rolls_the_pods() -> None:
    def checksum(objects: Objects) -> str:
        annotations = find(objects, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/config"])

    assert checksum(render()) != checksum(render("config.security.read_only=false"))


def test_selectors_match_the_pods() -> None:
    objects = render("podMonitor.enabled=true")
    daemonset = find(objects, "DaemonSet")
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    for selector in (
        daemonset["spec"]["selector"]["matchLabels"],
        find(objects, "Service")["spec"]["selector"],
        find(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        find(objects, "PodMonitor")["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    binding = find(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": daemonset["spec"]["template"]["spec"]["serviceAccountName"],
            "namespace": NAMESPACE,
        }
    ]
    assert binding["roleRef"]["name"] == find(objects, "ClusterRole")["metadata"]["name"]


# --------------------------------------------------------------------------------------------
# The chart is the node-local overlay, packaged


def without_names(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec with what differs by construction (image, ConfigMap names) blanked."""
    spec = yaml.safe_load(yaml.safe_dump(spec))
    for container in spec["containers"]:
        container["image"] = "-"
    for volume in spec["volumes"]:
        if "configMap" in volume:
            volume["configMap"]["name"] = "-"
    return spec


@needs_kubectl
def test_chart_renders_what_the_node_local_overlay_has() -> None:
    chart, kustomized = render(), overlay("node-local")
    assert without_names(find(chart, "DaemonSet")["spec"]["template"]["spec"]) == without_names(
        pod_spec(kustomized)
    )
    assert (
        find(chart, "DaemonSet")["spec"]["updateStrategy"]
        == find(kustomized, "DaemonSet")["spec"]["updateStrategy"]
    )
    for field in ("type", "internalTrafficPolicy", "ports"):
        assert find(chart, "Service")["spec"][field] == find(kustomized, "Service")["spec"][field]
    assert (
        find(chart, "NetworkPolicy")["spec"]["ingress"]
        == find(kustomized, "NetworkPolicy")["spec"]["ingress"]
    )
    assert find(chart, "ClusterRole")["rules"] == find(kustomized, "ClusterRole")["rules"]
    ours, theirs = chart_config(chart), chart_config(kustomized)
    ours_hosts = set(ours["listen"].pop("allowed_hosts"))
    assert ours_hosts == set(theirs["listen"].pop("allowed_hosts"))
    assert ours == theirs
