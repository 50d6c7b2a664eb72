"""render_kubeconfig produces a kubeconfig that kubectl reads the way we mean it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from watchproxy.kube.kubeconfig import render_kubeconfig

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


def kubectl_view(tmp_path: Path, text: str) -> dict[str, Any]:
    assert KUBECTL is not None
    path = tmp_path / "kubeconfig"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run(
        [KUBECTL, "--kubeconfig", str(path), "config", "view", "--raw", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        # kubectl must not merge in a kubeconfig from the environment.
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def current(view: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The (context, cluster, user) that the current-context selects."""
    name = view["current-context"]
    (context,) = [c["context"] for c in view["contexts"] if c["name"] == name]
    (cluster,) = [c["cluster"] for c in view["clusters"] if c["name"] == context["cluster"]]
    (user,) = [u.get("user") or {} for u in view["users"] if u["name"] == context["user"]]
    return context, cluster, user


@needs_kubectl
def test_default_points_kubectl_at_the_local_proxy_without_credentials(tmp_path: Path) -> None:
    view = kubectl_view(tmp_path, render_kubeconfig())
    assert view["current-context"] == "watchproxy"
    context, cluster, user = current(view)
    assert cluster["server"] == "http://127.0.0.1:8001"
    assert "namespace" not in context
    assert user == {}


@needs_kubectl
def test_namespace_and_context_name_reach_kubectl(tmp_path: Path) -> None:
    text = render_kubeconfig("http://localhost:9001", namespace="team-a", context_name="sidecar")
    view = kubectl_view(tmp_path, text)
    assert view["current-context"] == "sidecar"
    context, cluster, _ = current(view)
    assert cluster["server"] == "http://localhost:9001"
    assert context["namespace"] == "team-a"


@needs_kubectl
def test_current_context_resolves_to_the_namespace(tmp_path: Path) -> None:
    assert KUBECTL is not None
    path = tmp_path / "kubeconfig"
    path.write_text(render_kubeconfig(namespace="team-b"), encoding="utf-8")
    result = subprocess.run(
        [
            KUBECTL,
            "--kubeconfig",
            str(path),
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.contexts[0].context.namespace}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "team-b"


@needs_kubectl
def test_token_file_is_for_forward_mode_only(tmp_path: Path) -> None:
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    view = kubectl_view(tmp_path, render_kubeconfig(token_file=token))
    _, _, user = current(view)
    assert user == {"tokenFile": token}


def test_output_is_deterministic_yaml_with_one_of_each() -> None:
    text = render_kubeconfig("https://proxy.example:8443", namespace="ns")
    assert text == render_kubeconfig("https://proxy.example:8443", namespace="ns")
    assert text.endswith("\n")
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "v1" and doc["kind"] == "Config"
    assert [len(doc[k]) for k in ("clusters", "users", "contexts")] == [1, 1, 1]


def test_server_that_looks_odd_is_quoted_not_mangled() -> None:
    doc = yaml.safe_load(render_kubeconfig("http://[::1]:8001"))
    assert doc["clusters"][0]["cluster"]["server"] == "http://[::1]:8001"


@pytest.mark.parametrize(
    "server",
    [
        "127.0.0.1:8001",
        "ftp://127.0.0.1",
        "http://",
        "http://127.0.0.1:8001/api",
        "http://127.0.0.1:99999",
        "http://user:pw@127.0.0.1:8001",
        "http://127.0.0.1:8001?x=1",
    ],
)
def test_server_must_be_a_bare_http_url(server: str) -> None:
    with pytest.raises(ValueError):
        render_kubeconfig(server)


@pytest.mark.parametrize("namespace", ["", "Team", "-a", "a_b", "a" * 64])
def test_namespace_must_be_a_dns_label(namespace: str) -> None:
    with pytest.raises(ValueError):
        render_kubeconfig(namespace=namespace)


@pytest.mark.parametrize("name", ["", " watchproxy"])
def test_context_name_must_be_plain(name: str) -> None:
    with pytest.raises(ValueError):
        render_kubeconfig(context_name=name)


def test_token_file_must_be_absolute() -> None:
    with pytest.raises(ValueError):
        render_kubeconfig(token_file="token")
