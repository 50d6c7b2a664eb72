"""Access rules and read-only mode against the real kube-apiserver's own reading of a path.

The attacks of issue 40, each as a raw request (an HTTP client library would normalise the
escapes away): the apiserver decodes ``%73ecrets`` to ``secrets`` and serves the legacy
``/api/v1/watch/...`` paths (each oracle below shows it, directly), so a rule judged on the
path's bytes let them through with watchproxy's credential, the cluster admin's here. Now each
is refused with a 403 ``Status`` and the apiserver shows that nothing was written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.component.test_bad_input import Answer, send_raw
from tests.harness import RunningProxy, kubectl, versioned_kubectl_or_skip
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_apiserver import configmap, proxy
from tests.realapi.test_upgrades import nodeless_pod

SECRET_WRITES_BY_VERB = [
    {
        "action": "deny",
        "verbs": ["create", "update", "patch", "delete", "deletecollection"],
        "resources": ["secrets"],
    }
]
SECRET_WRITES_BY_PATH = [
    {
        "action": "deny",
        "methods": ["POST", "PUT", "PATCH", "DELETE"],
        "path": "/api/v1/namespaces/*/secrets*",
    }
]
SECRET_READS_BY_PATH = [
    {"action": "deny", "methods": ["GET"], "path": "/api/v1/namespaces/*/secrets*"}
]


def raw(
    method: str,
    target: str,
    body: Any = None,
    *,
    token: str | None = None,
    content_type: str = "application/json",
) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if data:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {len(data)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


async def direct_raw(real: RealApiServer, request: bytes) -> Answer:
    return await send_raw(real.port, request, ssl_context=real.ssl_context())


def secret(name: str, value: str = "MQ==") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"v": value}}


def refused(answer: Answer) -> bool:
    status = answer.status_object
    return (
        answer.status == 403
        and status is not None
        and status["kind"] == "Status"
        and status["reason"] == "Forbidden"
        and status["message"].startswith("watchproxy")
    )


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(SECRET_WRITES_BY_VERB, id="by-verb"),
        pytest.param(SECRET_WRITES_BY_PATH, id="by-path"),
    ],
)
async def test_encoded_writes_to_secrets_are_refused_and_nothing_is_written(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, rules: Any
) -> None:
    base = f"/api/v1/namespaces/{namespace}"
    await direct.ok("POST", f"{base}/secrets", body=secret("keep"))
    # The oracle: the apiserver itself reads %73ecrets as secrets.
    oracle = await direct_raw(
        real_apiserver,
        raw("POST", f"{base}/%73ecrets", secret("oracle"), token=real_apiserver.token),
    )
    assert oracle.status == 201, oracle.body[:300]
    async with proxy(tmp_path, real_apiserver, {"security.rules": rules}) as (running, _via):
        port = running.proxy.api_port
        made = await send_raw(port, raw("POST", f"{base}/%73ecrets", secret("made")))
        assert refused(made), made.body[:300]
        patch = {"data": {"v": "Mg=="}}
        patched = await send_raw(
            port,
            raw(
                "PATCH",
                f"{base}/secret%73/keep",
                patch,
                content_type="application/merge-patch+json",
            ),
        )
        assert refused(patched), patched.body[:300]
        deleted = await send_raw(port, raw("DELETE", f"{base}/%73ecrets/keep"))
        assert refused(deleted), deleted.body[:300]
        collection = await send_raw(
            port, raw("DELETE", f"/%61pi/v1/namespaces/{namespace}/secrets")
        )
        assert refused(collection), collection.body[:300]
    # The apiserver's word: nothing was created, changed or deleted.
    gone = await direct.request("GET", f"{base}/secrets/made")
    assert gone.status == 404
    kept = await direct.ok("GET", f"{base}/secrets/keep")
    assert kept["data"] == {"v": "MQ=="}
    names = {s["metadata"]["name"] for s in (await direct.ok("GET", f"{base}/secrets"))["items"]}
    assert {"keep", "oracle"} <= names and "made" not in names


async def test_reads_of_secrets_under_a_get_deny_are_refused_in_every_spelling(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    await direct.ok("POST", f"/api/v1/namespaces/{namespace}/secrets", body=secret("s"))
    spellings = [
        f"/%61pi/v1/namespaces/{namespace}/secrets",
        f"/api/v1/namespaces/{namespace}/%73ecrets/s",
        f"/api/v1/watch/namespaces/{namespace}/secrets?timeoutSeconds=1",
        f"/api/v1/watch/namespaces/{namespace}/secrets/s?timeoutSeconds=1",
        f"/api/v1/namespaces/{namespace}/secrets?watch=1&timeoutSeconds=1",
    ]
    for target in spellings:
        # The oracle: each spelling reads the secrets at the apiserver.
        oracle = await direct_raw(real_apiserver, raw("GET", target, token=real_apiserver.token))
        assert oracle.status == 200 and b'"s"' in oracle.body, (target, oracle.body[:300])
    async with proxy(tmp_path, real_apiserver, {"security.rules": SECRET_READS_BY_PATH}) as (
        running,
        _via,
    ):
        for target in spellings:
            answer = await send_raw(running.proxy.api_port, raw("GET", target))
            assert refused(answer), (target, answer.body[:300])
            assert b"MQ==" not in answer.body


async def test_an_allowed_request_spelled_with_escapes_reaches_the_apiserver_as_judged(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    await direct.ok("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("c1"))
    async with proxy(tmp_path, real_apiserver, {"security.rules": SECRET_READS_BY_PATH}) as (
        running,
        _via,
    ):
        target = f"/api/v1/namespaces/{namespace}/config%6Daps/c%31"
        answer = await send_raw(running.proxy.api_port, raw("GET", target))
        assert answer.status == 200, answer.body[:300]
        assert answer.status_object is not None
        assert answer.status_object["metadata"]["name"] == "c1"


def connect_codes(running: RunningProxy) -> set[str]:
    """The status codes of the exec, attach and port-forward requests watchproxy answered."""
    return {
        sample.labels["code"]
        for metric in running.proxy.metrics.registry.collect()
        if metric.name == "watchproxy_requests"
        for sample in metric.samples
        if sample.name == "watchproxy_requests_total" and sample.labels.get("verb") == "connect"
    }


def websocket_exec(target: str) -> bytes:
    lines = [
        f"GET {target} HTTP/1.1",
        "Host: 127.0.0.1",
        "Connection: Upgrade",
        "Upgrade: websocket",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Protocol: v5.channel.k8s.io",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_read_only_refuses_exec_as_a_websocket_get(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    await nodeless_pod(direct, namespace)
    base = f"/api/v1/namespaces/{namespace}/pods/shell"
    async with proxy(tmp_path, real_apiserver, {"security.read_only": True}) as (running, _via):
        for target in (
            f"{base}/exec?command=id&stdout=1",
            f"{base}/%65xec?command=id&stdout=1",
            f"{base}/attach?stdout=1",
            f"{base}/portforward?ports=80",
        ):
            answer = await send_raw(running.proxy.api_port, websocket_exec(target))
            assert refused(answer), (target, answer.body[:300])
            assert answer.status_object is not None
            assert "read-only" in answer.status_object["message"]


@pytest.mark.parametrize(
    "minor",
    [pytest.param(33, id="1.33-websocket"), pytest.param(37, id="1.37-websocket")],
)
async def test_read_only_refuses_kubectl_exec(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, minor: int
) -> None:
    kubectl_bin = versioned_kubectl_or_skip(minor)
    await nodeless_pod(direct, namespace)
    async with proxy(tmp_path, real_apiserver, {"security.read_only": True}) as (running, _via):
        code, out, err = await kubectl(
            running.kubeconfig, "exec", "-n", namespace, "shell", "--", "id", binary=kubectl_bin
        )
        assert code != 0 and out == ""
        assert "watchproxy is read-only" in err, err
        # kubectl falls back from WebSocket to SPDY when an upgrade fails: every exec attempt it
        # made, the WebSocket GET included, was answered 403 by watchproxy (none reached the
        # apiserver, whose answer here is a 400: the pod has no node).
        assert connect_codes(running) == {"403"}
        # Reads still pass.
        code, out, err = await kubectl(
            running.kubeconfig, "get", "-n", namespace, "pod", "shell", binary=kubectl_bin
        )
        assert code == 0 and "shell" in out, err
