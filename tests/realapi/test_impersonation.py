"""Impersonation through watchproxy against the real apiserver's RBAC (issue 12).

Policy (``security.impersonation``): ``refuse`` (the default) answers a request with
``Impersonate-*`` headers 403 itself; ``forward`` sends them upstream with the credential in
use, so the apiserver decides whether that identity may impersonate — each client gets exactly
the apiserver's answer, and nothing is served from the hub's shared state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_apiserver import _service_account, configmap, proxy

ALICE = {"Impersonate-User": "alice"}


async def _rbac(direct: Api, namespace: str) -> tuple[str, str]:
    """Tokens of two accounts: one may impersonate alice, one may not; alice may list
    configmaps in ``namespace``."""
    impersonator = await _service_account(direct, namespace, "impersonator", may_read=[])
    plain = await _service_account(direct, namespace, "plain", may_read=[namespace])
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role: dict[str, Any] = {
        "metadata": {"name": f"{namespace}-impersonate-alice"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["users"],
                "verbs": ["impersonate"],
                "resourceNames": ["alice"],
            }
        ],
    }
    await direct.ok("POST", f"{rbac}/clusterroles", body=role)
    binding = {
        "metadata": {"name": f"{namespace}-impersonate-alice"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{namespace}-impersonate-alice",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "impersonator", "namespace": namespace}],
    }
    await direct.ok("POST", f"{rbac}/clusterrolebindings", body=binding)
    alice_role = {
        "metadata": {"name": "alice-reads"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}],
    }
    await direct.ok("POST", f"{rbac}/namespaces/{namespace}/roles", body=alice_role)
    alice_binding = {
        "metadata": {"name": "alice-reads"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "alice-reads"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    await direct.ok("POST", f"{rbac}/namespaces/{namespace}/rolebindings", body=alice_binding)
    return impersonator, plain


async def test_forwarded_impersonation_gets_the_apiservers_own_answer(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    impersonator, plain = await _rbac(direct, namespace)
    await direct.ok("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("c"))
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    overrides = {"security.identity": "forward", "security.impersonation": "forward"}
    async with proxy(tmp_path, real_apiserver, overrides) as (_running, via):
        for token, expected in ((impersonator, 200), (plain, 403)):
            for path in (cms, cms + "?resourceVersion=0"):
                through = await via.with_token(token).request("GET", path, headers=ALICE)
                oracle = await direct.with_token(token).request("GET", path, headers=ALICE)
                assert through.status == oracle.status == expected, (path, through.body[:300])
                if expected == 200:
                    assert [i["metadata"]["name"] for i in through.json()["items"]] == ["c"]
                else:  # "cannot impersonate resource users": the apiserver's own words
                    assert through.json()["message"] == oracle.json()["message"]
        # Without the header, the plain account reads as itself; the impersonator may not.
        assert (await via.with_token(plain).request("GET", cms)).status == 200
        assert (await via.with_token(impersonator).request("GET", cms)).status == 403


async def test_impersonation_is_refused_by_default(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """The proxy's own credential (the admin here) may impersonate anyone: by default the
    proxy refuses rather than lend it, and rather than drop the header and act as the admin."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    async with proxy(tmp_path, real_apiserver) as (running, via):
        answer = await via.request("GET", cms, headers=ALICE)
        assert answer.status == 403
        assert "security.impersonation" in answer.json()["message"]
        rejected = running.proxy.metrics.rejected.labels("impersonation")
        assert rejected._value.get() == 1  # type: ignore[attr-defined]
