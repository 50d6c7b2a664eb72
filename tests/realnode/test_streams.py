"""exec, attach, port-forward and ``logs -f`` through watchproxy to a real kubelet, with kubectl
1.37 (WebSocket) and kubectl 1.27 (SPDY, the oldest the suite has).

watchproxy runs in this process, in front of the node's apiserver (through the relay), with
the admin's credential as a sidecar would with its pod's; kubectl talks to it on loopback. The
apiserver relays each stream to the kubelet inside the node's namespace, which runs it in a
container of containerd.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import secrets
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    RunningProxy,
    kubectl,
    proxy_for_upstream,
    versioned_kubectl_or_skip,
)
from tests.realnode.cluster import KUBECTL, Cluster
from tests.realnode.node import Node

CLIENTS = [
    pytest.param(KUBECTL, {}, id="1.37-websocket"),
    pytest.param(27, {}, id="1.27-spdy"),
]
BLOB_BYTES = 4 * 1024 * 1024
# Open (docs/development.md, "The real-node tier"): through watchproxy, an exec session
# sometimes ends before the client has the tail of its output.
EXEC_TAIL_OPEN = pytest.mark.xfail(
    strict=False,
    reason="open: through watchproxy, an exec session sometimes ends before the tail of its "
    "output reaches kubectl (1.37: WebSocket close 1006; 1.27: exit 0 with the output cut); "
    "about 1 session in 20 for a 2.9 MB output, none of 60 direct",
)
EXEC_CLIENTS = [
    CLIENTS[0],
    pytest.param(*CLIENTS[1].values, id=CLIENTS[1].id, marks=EXEC_TAIL_OPEN),
]
LARGE_OUTPUT_CLIENTS = [pytest.param(*c.values, id=c.id, marks=EXEC_TAIL_OPEN) for c in CLIENTS]


def restricted(name: str, command: list[str], **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": container.pop("restartPolicy", "Always"),
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": name,
                    "image": "wprn-app:1",
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    **container,
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def pods(node: Node) -> Iterator[str]:
    """A namespace with the pods the streams reach; its name."""
    cluster = Cluster(node)
    namespace = f"st-{secrets.token_hex(3)}"
    cluster.create_namespace(namespace)
    web = (
        f"head -c {BLOB_BYTES} /dev/urandom > /tmp/blob && cd /tmp && "
        "exec python3 -m http.server 8080 --bind 127.0.0.1"
    )
    ticker = 'i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 0.2; done'
    cluster.apply(
        [
            restricted("shell", ["sleep", "infinity"]),
            restricted("web", ["sh", "-c", web], ports=[{"containerPort": 8080}]),
            restricted("ticker", ["sh", "-c", ticker]),
        ],
        namespace=namespace,
    )
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "pod/shell", "pod/web", "pod/ticker",
        "--timeout=90s", timeout=95,
    )  # fmt: skip
    yield namespace
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@contextlib.asynccontextmanager
async def watchproxy(
    tmp_path: Path, node: Node, overrides: dict[str, Any] | None = None
) -> AsyncIterator[RunningProxy]:
    async with proxy_for_upstream(tmp_path, node.admin_kubeconfig, overrides) as running:
        yield running


def binary_of(client: str | int) -> str:
    return client if isinstance(client, str) else versioned_kubectl_or_skip(client)


@pytest.mark.parametrize(("client", "env"), EXEC_CLIENTS)
async def test_exec_carries_stdin_the_exit_code_and_the_kubelets_refusal(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    async with watchproxy(tmp_path, node) as proxy:
        run = ("exec", "-n", pods, "shell")
        data = b"".join(b"line %d of the client's stdin\n" % i for i in range(20000))
        code, out, err = await kubectl(
            proxy.kubeconfig, *run, "-i", "--", "sh", "-c", "cat; exit 3",
            stdin=data, binary=binary, env=env, timeout=60,
        )  # fmt: skip
        assert (code, out.encode()) == (3, data), err[-500:]
        assert "command terminated with exit code 3" in err
        # The kubelet's refusal (no such container) reaches kubectl through the proxy.
        code, _, err = await kubectl(
            proxy.kubeconfig, *run, "-c", "nope", "--", "true", binary=binary, env=env
        )
        assert code != 0 and "container nope is not valid for pod shell" in err, err


@pytest.mark.parametrize(("client", "env"), LARGE_OUTPUT_CLIENTS)
async def test_exec_carries_a_large_output_whole(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    """400,000 lines (2.9 MB), three sessions: the bytes kubectl prints are the command's."""
    binary = binary_of(client)
    expected = "".join(f"{i}\n" for i in range(1, 400001))
    async with watchproxy(tmp_path, node) as proxy:
        for _ in range(3):
            code, out, err = await kubectl(
                proxy.kubeconfig, "exec", "-n", pods, "shell", "--", "seq", "1", "400000",
                binary=binary, env=env, timeout=60,
            )  # fmt: skip
            assert code == 0, err[-500:]
            assert len(out) == len(expected) and out == expected, (len(out), err[-300:])


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_attach_sends_stdin_to_the_running_process(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    cluster = Cluster(node)
    name = f"talker-{secrets.token_hex(2)}"
    # stdinOnce: the container's stdin closes when the attach session's does, so the process
    # ends and so does kubectl attach.
    script = 'while read -r line; do echo "got:$line"; done; echo "stdin closed"'
    cluster.apply(
        [restricted(name, ["sh", "-c", script], stdin=True, stdinOnce=True, restartPolicy="Never")],
        namespace=pods,
    )
    cluster.kubectl("wait", "-n", pods, "--for=condition=Ready", f"pod/{name}", "--timeout=60s")
    async with watchproxy(tmp_path, node) as proxy:
        code, out, err = await kubectl(
            proxy.kubeconfig, "attach", "-n", pods, name, "-i", "-c", name,
            stdin=b"alpha\nbeta\n", binary=binary, env=env, timeout=60,
        )  # fmt: skip
    assert code == 0, err[-500:]
    assert out.splitlines()[-3:] == ["got:alpha", "got:beta", "stdin closed"], (out, err)


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_port_forward_carries_a_large_download(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    cluster = Cluster(node)
    digest = cluster.kubectl("exec", "-n", pods, "web", "--", "sha256sum", "/tmp/blob").stdout
    async with watchproxy(tmp_path, node) as proxy:
        process = await asyncio.create_subprocess_exec(
            binary, "--kubeconfig", proxy.kubeconfig,
            "port-forward", "-n", pods, "pod/web", ":8080",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **env},
        )  # fmt: skip
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 20)
            found = re.search(rb"127\.0\.0\.1:(\d+)", line)
            assert found, line
            url = f"http://127.0.0.1:{int(found.group(1))}/blob"
            for _ in range(2):  # two connections over the same forwarding session
                body = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url, timeout=30).read()
                )
                assert len(body) == BLOB_BYTES
                assert hashlib.sha256(body).hexdigest() == digest.split()[0].decode()
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 10)


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_logs_follow_streams_new_lines_as_the_container_writes_them(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    async with watchproxy(tmp_path, node) as proxy:
        process = await asyncio.create_subprocess_exec(
            binary, "--kubeconfig", proxy.kubeconfig,
            "logs", "-f", "--tail=1", "-n", pods, "ticker",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            ticks = []
            async with asyncio.timeout(20):
                while len(ticks) < 6:
                    line = await process.stdout.readline()
                    assert line, "logs -f ended"
                    ticks.append(int(line.split()[1]))
            # Consecutive lines, each delivered as the container wrote it (0.2 s apart).
            assert ticks == list(range(ticks[0], ticks[0] + 6))
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 10)


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_read_only_mode_refuses_exec_and_port_forward_before_the_kubelet(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    async with watchproxy(tmp_path, node, {"security.read_only": True}) as proxy:
        code, out, err = await kubectl(
            proxy.kubeconfig, "exec", "-n", pods, "shell", "--", "echo", "ran",
            binary=binary, env=env,
        )  # fmt: skip
        assert code != 0 and "ran" not in out
        assert "forbidden" in err.lower() or "read-only" in err.lower(), err
        # Reading stays open: the logs still come through.
        code, out, err = await kubectl(
            proxy.kubeconfig, "logs", "--tail=1", "-n", pods, "ticker", binary=binary
        )
        assert code == 0 and out.startswith("tick "), err
