"""exec through watchproxy against the real kube-apiserver, with real kubectl 1.27, 1.33, 1.37.

There is no kubelet in this tier, so no exec can run: what is pinned is that every refusal the
apiserver gives reaches kubectl through watchproxy exactly as it does directly, over SPDY and
over WebSocket: a pod with no node (400), and RBAC without ``create pods/exec`` (403). The
session itself is exercised end to end against the fake apiserver (tests/e2e/test_upgrades.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import SPDY_EXEC_ENV, kubectl, versioned_kubectl_or_skip
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_apiserver import _token, _until_status, proxy

PATHS = [
    pytest.param(27, {}, id="1.27-spdy"),
    pytest.param(33, SPDY_EXEC_ENV, id="1.33-spdy"),
    pytest.param(33, {}, id="1.33-websocket"),
    pytest.param(37, {}, id="1.37-websocket"),  # the newest, built by tests/realapi/build.sh
]


async def nodeless_pod(direct: Api, namespace: str) -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "shell"},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }
    await direct.ok("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)


async def pod_reader(direct: Api, namespace: str) -> str:
    """A service account that may get pods but not create pods/exec; its token."""
    base = f"/api/v1/namespaces/{namespace}"
    await direct.ok("POST", f"{base}/serviceaccounts", body={"metadata": {"name": "reader"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role = {
        "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    }
    binding = {
        "metadata": {"name": "pod-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    await direct.ok("POST", f"{rbac}/roles", body=role)
    await direct.ok("POST", f"{rbac}/rolebindings", body=binding)
    token = await _token(direct, namespace, "reader")
    await _until_status(direct.with_token(token), f"{base}/pods/shell", 200)
    return token


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1] if stderr.strip() else ""


@pytest.mark.parametrize(("minor", "env"), PATHS)
async def test_exec_refusals_reach_kubectl_as_direct(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    minor: int,
    env: dict[str, str],
) -> None:
    kubectl_bin = versioned_kubectl_or_skip(minor)
    await nodeless_pod(direct, namespace)
    token = await pod_reader(direct, namespace)
    args = ("exec", "-n", namespace, "shell", "--", "echo", "hi")
    for user, who in ((real_apiserver.token, "admin"), (token, "reader")):
        # The proxy uses ``user``'s credential as a sidecar uses its pod's (kubectl sends no
        # token to a plain-http server, so forward-identity mode cannot carry kubectl's).
        async with proxy(tmp_path, real_apiserver, token=user) as (running, _):
            direct_config = real_apiserver.write_kubeconfig(tmp_path / f"{who}.direct", token=user)
            oracle = await kubectl(direct_config, *args, binary=kubectl_bin, env=env)
            via = await kubectl(running.kubeconfig, *args, binary=kubectl_bin, env=env)
        assert oracle[0] != 0 and via[0] == oracle[0], (who, via, oracle)
        assert last_line(via[2]) == last_line(oracle[2]), who
        if who == "reader":
            assert 'cannot create resource "pods/exec"' in via[2]
        else:
            assert "does not have a host assigned" in via[2]
