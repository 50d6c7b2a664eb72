"""The sidecar component and `watchproxy inject`, applied to one workload of every kind.

Both outputs are checked against the Kubernetes schemas for 1.29 (the first release with native
sidecars on by default) and 1.33, then for what the schema cannot see: the sidecar is the first
init container and restarts always, every app container has KUBECONFIG and its mount, the
kubeconfig is what `watchproxy kubeconfig` prints, only watchproxy holds the token, every
ConfigMap a pod names exists beside it. Finally the two tools agree with each other.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.test_deploy import DEPLOY, REPO, build, needs_kubectl, project_version
from watchproxy import cli, inject
from watchproxy.config import build_config
from watchproxy.kube.kubeconfig import render_kubeconfig

K8S_VERSIONS = ("1.29", "1.33")
SAMPLES = Path(__file__).parent / "samples"
WORKLOADS = SAMPLES / "workloads.yaml"
COMPONENT = DEPLOY / "components" / "sidecar"
KINDS = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"]
PASS_THROUGH = [("Service", "web"), ("ConfigMap", "web-settings")]
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

Objects = tuple[dict[str, Any], ...]


def sample_documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(WORKLOADS.read_text(encoding="utf-8")) if d]


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_inject(*args: str, stdin: str | None = None, cwd: Path = REPO) -> Ran:
    """`watchproxy inject ARGS` in this process (a subprocess per case would cost seconds)."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr, os.getcwd()
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin or ""), out, err
    try:
        os.chdir(cwd)
        code = cli.main(["inject", *args])
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved[:3]
        os.chdir(saved[3])
    return Ran(code, out.getvalue(), err.getvalue())


def component_output() -> Objects:
    return build(SAMPLES)


@functools.cache
def inject_output() -> Objects:
    result = run_inject("-f", str(WORKLOADS))
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


OUTPUTS = {"component": component_output, "inject": inject_output}


def find(objects: Objects, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"].get("name"))]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def template_of(workload: dict[str, Any]) -> dict[str, Any]:
    path = inject.pod_template_path(workload)
    assert path is not None, workload["kind"]
    template: dict[str, Any] = workload
    for field in path:
        template = template[field]
    return template


def generated_name(objects: Objects, namespace: str | None, name: str) -> str:
    """The ConfigMap `name` in `namespace`, with kustomize's hash suffix if it has one."""
    found = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "ConfigMap"
        and o["metadata"].get("namespace") == namespace
        and re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", o["metadata"]["name"])
    ]
    assert len(found) == 1, f"ConfigMap {name} in {namespace}: {found}"
    return found[0]


def configmap_data(objects: Objects, namespace: str | None, name: str) -> dict[str, str]:
    found = [
        o
        for o in objects
        if o["kind"] == "ConfigMap"
        and o["metadata"]["name"] == name
        and o["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"no ConfigMap {name} in namespace {namespace}"
    data: dict[str, str] = found[0]["data"]
    return data


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [i for i in items if i["name"] == name]
    assert len(found) == 1, f"expected one {name!r} in {[i['name'] for i in items]}"
    return found[0]


def file_in_pod(
    objects: Objects,
    namespace: str | None,
    spec: dict[str, Any],
    container: dict[str, Any],
    path: str,
) -> str:
    """What `container` reads at `path`: the ConfigMap key behind the mount above it."""
    mounts = [
        m
        for m in container.get("volumeMounts", [])
        if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"{container['name']}: nothing mounted above {path}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    assert "subPath" not in mount, "subPath mounts never see ConfigMap updates"
    source = by_name(spec["volumes"], mount["name"])
    assert "configMap" in source, f"{path} is not mounted from a ConfigMap"
    key = PurePosixPath(path).relative_to(mount["mountPath"]).as_posix()
    return configmap_data(objects, namespace, source["configMap"]["name"])[key]


# --------------------------------------------------------------------------------------------
# Schemas


@needs_kubectl
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("tool", OUTPUTS)
def test_output_is_valid_kubernetes(tool: str, version: str) -> None:
    objects = OUTPUTS[tool]()
    assert {o["kind"] for o in objects} >= set(KINDS)
    for doc in objects:
        kubernetes_validate.validate(doc, version, strict=True)


# --------------------------------------------------------------------------------------------
# What every injected pod has


@needs_kubectl
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tool", OUTPUTS)
def test_sidecar_is_the_first_init_container_and_restarts_always(tool: str, kind: str) -> None:
    original = template_of(find(tuple(sample_documents()), kind))["spec"]
    spec = template_of(find(OUTPUTS[tool](), kind))["spec"]
    names = [c["name"] for c in spec["initContainers"]]
    own = [c["name"] for c in original.get("initContainers", [])]
    assert names == ["watchproxy", *own], "the app's init containers run after the proxy is up"
    sidecar = spec["initContainers"][0]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"].rpartition(":")[2] == project_version()
    assert sidecar["args"][:3] == ["run", "--config", "/etc/watchproxy/config.yaml"]
    assert "watchproxy" not in [c["name"] for c in spec["containers"]]


@needs_kubectl
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tool", OUTPUTS)
def test_every_app_container_reads_the_proxy_kubeconfig(tool: str, kind: str) -> None:
    objects = OUTPUTS[tool]()
    workload = find(objects, kind)
    namespace = workload["metadata"].get("namespace")
    spec = template_of(workload)["spec"]
    config = yaml.safe_load(
        file_in_pod(
            objects, namespace, spec, spec["initContainers"][0], inject.CONFIG_DIR + "/config.yaml"
        )
    )
    server = f"http://{config['listen']['host']}:{config['listen']['port']}"
    original = template_of(find(tuple(sample_documents()), kind))["spec"]
    assert [c["name"] for c in spec["containers"]] == [c["name"] for c in original["containers"]]
    for container in spec["containers"]:
        env = {e["name"]: e for e in container["env"]}
        assert env["KUBECONFIG"] == {"name": "KUBECONFIG", "value": inject.KUBECONFIG_PATH}
        path = env["KUBECONFIG"]["value"]
        # inject knows the namespace and names it; kustomize cannot write inside the file.
        expected = render_kubeconfig(server, namespace=namespace if tool == "inject" else None)
        assert file_in_pod(objects, namespace, spec, container, path) == expected
        # What the app had stays (only its KUBECONFIG is replaced).
        before = by_name(original["containers"], container["name"])
        for item in before.get("env", []):
            if item["name"] != "KUBECONFIG":
                assert item in container["env"]
        for mount in before.get("volumeMounts", []):
            assert mount in container["volumeMounts"]
    for volume in original.get("volumes", []):
        assert volume in spec["volumes"]


@needs_kubectl
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tool", OUTPUTS)
def test_only_watchproxy_mounts_the_serviceaccount_token(tool: str, kind: str) -> None:
    template = template_of(find(OUTPUTS[tool](), kind))
    spec = template["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert template["metadata"]["labels"]["watchproxy"] == "sidecar"
    token_volumes = {
        v["name"]
        for v in spec["volumes"]
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    }
    assert token_volumes == {inject.TOKEN_VOLUME}
    sidecar, *others = spec["initContainers"] + spec["containers"]
    mount = by_name(sidecar["volumeMounts"], inject.TOKEN_VOLUME)
    assert mount == {"name": inject.TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}
    for container in others:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] not in token_volumes, container["name"]
            assert not TOKEN_DIR.startswith(mount["mountPath"].rstrip("/"))


@needs_kubectl
@pytest.mark.parametrize("tool", OUTPUTS)
def test_every_configmap_a_pod_names_is_beside_it(tool: str) -> None:
    """A pod that names a missing ConfigMap never starts (kustomize links within a namespace)."""
    objects = OUTPUTS[tool]()
    for kind in KINDS:
        workload = find(objects, kind)
        namespace = workload["metadata"].get("namespace")
        for volume in template_of(workload)["spec"]["volumes"]:
            sources = [volume, *volume.get("projected", {}).get("sources", [])]
            for source in sources:
                name = source.get("configMap", {}).get("name")
                if name and name != "kube-root-ca.crt":  # the one every namespace has
                    configmap_data(objects, namespace, name)


@needs_kubectl
@pytest.mark.parametrize("tool", OUTPUTS)
def test_other_objects_pass_through_unchanged(tool: str) -> None:
    objects = OUTPUTS[tool]()
    originals = tuple(sample_documents())
    for kind, name in PASS_THROUGH:
        assert find(objects, kind, name) == find(originals, kind, name)


# --------------------------------------------------------------------------------------------
# The component and inject agree


def normalized_template(objects: Objects, kind: str) -> dict[str, Any]:
    """The pod template with ConfigMap hash suffixes removed and name-keyed lists sorted."""
    template = copy.deepcopy(template_of(find(objects, kind)))
    spec = template["spec"]
    for volume in spec["volumes"]:
        if "configMap" in volume:
            name = volume["configMap"]["name"]
            for base in (inject.CONFIG_MAP, inject.KUBECONFIG_MAP):
                if name.startswith(base + "-") or name == base:
                    volume["configMap"]["name"] = base
    spec["volumes"].sort(key=lambda v: v["name"])
    for container in spec["containers"] + spec["initContainers"]:
        for field in ("env", "volumeMounts"):
            container.get(field, []).sort(key=lambda item: item["name"])
    return template


@needs_kubectl
@pytest.mark.parametrize("kind", KINDS)
def test_component_and_inject_give_the_same_pod_template(kind: str) -> None:
    component = normalized_template(component_output(), kind)
    injected = normalized_template(inject_output(), kind)
    # The sample kustomization sets the registry; inject keeps its default name.
    injected["spec"]["initContainers"][0]["image"] = component["spec"]["initContainers"][0]["image"]
    assert component == injected


@needs_kubectl
def test_component_and_inject_give_the_same_configmaps() -> None:
    component, injected = component_output(), inject_output()
    for name in (inject.CONFIG_MAP, inject.KUBECONFIG_MAP):
        actual = generated_name(component, "shop", name)
        data = configmap_data(injected, "shop", name)
        if name == inject.KUBECONFIG_MAP:  # the one difference: inject names the namespace
            assert data == {inject.KUBECONFIG_KEY: render_kubeconfig(namespace="shop")}
            data = {inject.KUBECONFIG_KEY: render_kubeconfig()}
        assert configmap_data(component, "shop", actual) == data


def test_cronjob_patch_carries_the_same_pod_template() -> None:
    (deployment,) = yaml.safe_load_all((COMPONENT / "pod-template.yaml").read_text())
    (cronjob,) = yaml.safe_load_all((COMPONENT / "cronjob.yaml").read_text())
    assert cronjob["spec"]["jobTemplate"]["spec"]["template"] == deployment["spec"]["template"]


def test_component_config_is_what_inject_writes_and_is_valid() -> None:
    assert (COMPONENT / "config.yaml").read_text(encoding="utf-8") == inject.SIDECAR_CONFIG
    assert (COMPONENT / "kubeconfig").read_text(encoding="utf-8") == render_kubeconfig()
    build_config(yaml.safe_load(inject.SIDECAR_CONFIG), file_name="sidecar config")


@needs_kubectl
def test_component_image_is_set_by_the_users_images_entry() -> None:
    spec = template_of(find(component_output(), "Deployment"))["spec"]
    image = spec["initContainers"][0]["image"]
    assert image == f"registry.example.com/watchproxy:{project_version()}"
    without = build(COMPONENT)  # the component alone: only its ConfigMaps, no settings object
    assert sorted(o["kind"] for o in without) == ["ConfigMap", "ConfigMap"]


# --------------------------------------------------------------------------------------------
# The inject command


def test_inject_reads_stdin_and_is_idempotent() -> None:
    text = WORKLOADS.read_text(encoding="utf-8")
    once = run_inject("-f", "-", stdin=text)
    assert once.returncode == 0, once.stderr
    twice = run_inject("-f", "-", stdin=once.stdout)
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout == once.stdout
    # The sample's app has a KUBECONFIG of its own: replaced once, with a warning, then kept.
    (warning,) = once.stderr.splitlines()
    assert warning.startswith("watchproxy inject: warning: Deployment "), warning
    assert "its KUBECONFIG (/home/web/.kube/config) is replaced by watchproxy's" in warning
    assert twice.stderr == ""


def test_inject_reads_json_and_honours_image(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": sample_documents()}))
    result = run_inject("-f", str(path), "--image", "registry.example.com/watchproxy:1.2.3")
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert [o["kind"] for o in objects] == ["ConfigMap", "ConfigMap", "List"]
    for item in objects[2]["items"]:
        if item["kind"] in KINDS:
            sidecar = template_of(item)["spec"]["initContainers"][0]
            assert sidecar["image"] == "registry.example.com/watchproxy:1.2.3"
    assert objects[2]["items"][-2:] == sample_documents()[-2:]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: [\n", "not valid YAML at line 2"),
        ('{"kind": "Deployment",', "not valid JSON"),
        ("- just\n- a list\n", "document 1 is not a Kubernetes object"),
        ("apiVersion: v1\nkind: Pod\n---\nhello\n", "document 2 is not a Kubernetes object"),
        ("kind: Deployment\n", "has no apiVersion"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
            "spec.template is missing",
        ),
        ("", "no Kubernetes objects"),
        ("\xff\xfe", "is not UTF-8 text"),
        (None, "cannot read missing.yaml: No such file or directory"),
    ],
)
def test_inject_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / ("input.yaml" if content is not None else "missing.yaml")
    if content is not None:
        path.write_bytes(content.encode("latin-1"))
    result = run_inject("-f", path.name, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("watchproxy inject: ")
    assert message in result.stderr


def test_inject_runs_as_a_command() -> None:
    """The real entry point, once: `python -m watchproxy inject -f -`."""
    result = subprocess.run(
        [sys.executable, "-m", "watchproxy", "inject", "-f", "-"],
        input=WORKLOADS.read_text(encoding="utf-8"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("WATCHPROXY_")},
    )
    assert result.returncode == 0, result.stderr
    assert tuple(d for d in yaml.safe_load_all(result.stdout) if d) == inject_output()
