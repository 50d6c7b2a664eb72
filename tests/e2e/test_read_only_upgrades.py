"""``security.read_only`` against exec, attach and port-forward, with real kubectl binaries.

kubectl 1.30+ opens exec as a WebSocket GET: a read-only proxy that refused only writing
methods let ``kubectl exec`` through (issue 40). The apiserver authorizes exec as ``create`` on
``pods/exec``; read-only watchproxy refuses it with a 403 Status before anything goes upstream,
unless an allow rule names its verb. The fake apiserver's pods have exec servers, so a request
that got through would run.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from tests.component.test_bad_input import send_raw
from tests.e2e.test_upgrades import make_pod, upgrades_seen
from tests.harness import (
    SPDY_EXEC_ENV,
    Running,
    kubectl,
    running_proxy,
    versioned_kubectl_or_skip,
)

READ_ONLY = {"security.read_only": True}
EXEC_ALLOWED = {
    "security.read_only": True,
    "security.rules": [{"action": "allow", "verbs": ["create"], "resources": ["pods/exec"]}],
}
# kubectl 1.33 from the Google Cloud CLI, and the newest one tests/realapi/build.sh builds.
KUBECTLS = [
    pytest.param(33, {}, id="1.33-websocket"),
    pytest.param(33, SPDY_EXEC_ENV, id="1.33-spdy"),
    pytest.param(37, {}, id="1.37-websocket"),
]


def websocket_upgrade(target: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {target} HTTP/1.1",
        "Host: 127.0.0.1",
        "Connection: Upgrade",
        "Upgrade: websocket",
        "Sec-WebSocket-Version: 13",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Protocol: v5.channel.k8s.io",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def upstream_upgrades(running: Running) -> list[str]:
    return [
        r.path
        for r in running.fake.stats.requests
        if r.path.endswith(("/exec", "/attach", "/portforward"))
    ]


@pytest.mark.parametrize(("minor", "env"), KUBECTLS)
async def test_read_only_refuses_kubectl_exec_before_it_goes_upstream(
    tmp_path: Any, minor: int, env: dict[str, str]
) -> None:
    kubectl_bin = versioned_kubectl_or_skip(minor)
    async with running_proxy(tmp_path, READ_ONLY) as running:
        make_pod(running)
        code, out, err = await kubectl(
            running.kubeconfig, "exec", "shell", "--", "echo", "ran", binary=kubectl_bin, env=env
        )
        assert code != 0 and "ran" not in out
        assert "watchproxy is read-only" in err, err
        assert upstream_upgrades(running) == []
        # Reads still work through the same proxy.
        code, out, err = await kubectl(
            running.kubeconfig, "get", "pod", "shell", binary=kubectl_bin
        )
        assert code == 0, err


@pytest.mark.parametrize(
    "target",
    [
        "/api/v1/namespaces/default/pods/shell/exec?command=id&stdout=1",
        "/api/v1/namespaces/default/pods/shell/%65xec?command=id&stdout=1",
        "/api/v1/namespaces/default/pods/shell/attach?stdout=1",
        "/api/v1/namespaces/default/pods/shell/portforward?ports=8080",
    ],
)
async def test_read_only_answers_a_websocket_upgrade_with_a_403_status(
    tmp_path: Any, target: str
) -> None:
    async with running_proxy(tmp_path, READ_ONLY) as running:
        make_pod(running)
        running.fake.stats.reset()
        answer = await send_raw(running.proxy.api_port, websocket_upgrade(target))
        assert answer.status == 403
        status = answer.status_object
        assert status is not None and status["kind"] == "Status" and status["code"] == 403
        assert status["reason"] == "Forbidden"
        assert "read-only" in status["message"]
        assert running.fake.stats.requests == []  # nothing went upstream


async def test_an_allow_rule_naming_create_on_pods_exec_lets_exec_through_read_only(
    tmp_path: Any,
) -> None:
    kubectl_bin = versioned_kubectl_or_skip(33)
    async with running_proxy(tmp_path, EXEC_ALLOWED) as running:
        make_pod(running)
        # `cat` answers only what kubectl sends, so its output comes after kubectl has made its
        # streams: kubectl 1.33's client-go starts reading the WebSocket before it has made
        # them and drops a message that arrives first ("Unknown stream id 1", fixed in
        # client-go 0.34), which kubefake's instant `echo` met on a loaded machine.
        code, out, err = await kubectl(
            running.kubeconfig,
            "exec",
            "-i",
            "shell",
            "--",
            "cat",
            binary=kubectl_bin,
            stdin=b"ran\n",
        )
        assert (code, out) == (0, "ran\n"), err
        seen = upgrades_seen(running, "/exec")
        assert seen and all(r.headers.get("Upgrade", "").lower() == "websocket" for r in seen)
        # The rule names exec only: attach stays refused, and so does a write.
        answer = await send_raw(
            running.proxy.api_port,
            websocket_upgrade("/api/v1/namespaces/default/pods/shell/attach?stdout=1"),
        )
        assert answer.status == 403
        code, _, err = await kubectl(
            running.kubeconfig, "create", "configmap", "x", binary=kubectl_bin
        )
        assert code != 0 and "read-only" in err


async def test_encoded_spellings_of_a_denied_write_are_refused_and_never_reach_upstream(
    tmp_path: Any,
) -> None:
    rules = [{"action": "deny", "verbs": ["create", "update", "patch"], "resources": ["secrets"]}]
    async with running_proxy(tmp_path, {"security.rules": rules}) as running:
        body = json.dumps({"metadata": {"name": "s"}, "data": {}}).encode()
        for method, target in [
            ("POST", "/api/v1/namespaces/default/%73ecrets"),
            ("POST", "/api/v1/namespaces/default/secret%73"),
            ("POST", "/%61pi/v1/namespaces/default/secrets"),
            ("POST", "/api/v1/namespaces/default/secrets/"),
        ]:
            raw = (
                f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode() + body
            answer = await send_raw(running.proxy.api_port, raw)
            assert answer.status == 403, (target, answer.body[:200])
        assert [r for r in running.fake.stats.requests if "secret" in r.path] == []
        # An allowed read spelled with escapes reaches the fake as its plain path.
        raw = b"GET /api/v1/namespaces/default/config%6Daps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        answer = await send_raw(running.proxy.api_port, raw + b"Connection: close\r\n\r\n")
        assert answer.status == 200 and answer.status_object is not None
        assert answer.status_object["kind"] == "ConfigMapList"
