"""exec and port-forward through watchproxy with real kubectl binaries, over SPDY and WebSocket.

The fake apiserver speaks SPDY/3.1 exec and port-forward (kubefake/spdyserver.py) as kubelet
does, WebSocket exec (kubefake/remote.py) and the WebSocket-tunnelled port-forward of
kubectl >= 1.31. watchproxy relays the bytes without knowing the protocol.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.harness import (
    SPDY_EXEC_ENV,
    Running,
    kubectl,
    running_proxy,
    versioned_kubectl_or_skip,
)

# kubectl >= 1.31 tunnels port-forward in WebSocket unless this variable says not to.
SPDY_PORT_FORWARD = {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"}
FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")


def make_pod(running: Running, name: str = "shell") -> None:
    running.fake.store.create(
        "pods",
        "default",
        {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        },
    )


def upgrades_seen(running: Running, suffix: str) -> list[Any]:
    return [r for r in running.fake.stats.requests if r.path.endswith(suffix)]


EXEC_PATHS = [
    pytest.param(27, {}, "SPDY/3.1", id="1.27-spdy"),
    pytest.param(33, SPDY_EXEC_ENV, "SPDY/3.1", id="1.33-spdy"),
    pytest.param(33, {}, "websocket", id="1.33-websocket"),
]


@pytest.mark.parametrize(("minor", "env", "protocol"), EXEC_PATHS)
async def test_kubectl_exec_is_relayed(
    tmp_path: Any, minor: int, env: dict[str, str], protocol: str
) -> None:
    kubectl_bin = versioned_kubectl_or_skip(minor)
    async with running_proxy(tmp_path) as running:
        make_pod(running)

        async def run(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
            return await kubectl(
                running.kubeconfig, "exec", *args, binary=kubectl_bin, env=env, stdin=stdin
            )

        code, out, err = await run("shell", "--", "echo", "hello", "there")
        assert (code, out) == (0, "hello there\n"), err
        lines = b"".join(b"line %d\n" % i for i in range(2000))
        code, out, err = await run("-i", "shell", "--", "cat", stdin=lines)
        assert code == 0, err
        assert out.encode() == lines
        code, out, err = await run("shell", "--", "nonesuch")
        assert code == 127 and "nonesuch: not found" in err
        code, _, err = await run("missing", "--", "echo")
        assert code != 0 and 'pods "missing" not found' in err
        seen = upgrades_seen(running, "/exec")
        assert seen and all(r.headers.get("Upgrade", "").lower() == protocol.lower() for r in seen)
        assert all(r.headers.get("Authorization") == f"Bearer {running.fake.token}" for r in seen)


@pytest.mark.parametrize(
    ("minor", "env"),
    [pytest.param(27, {}, id="1.27-spdy"), pytest.param(33, {}, id="1.33-websocket")],
)
async def test_a_forbidden_exec_reaches_kubectl_as_the_apiservers_403(
    tmp_path: Any, minor: int, env: dict[str, str]
) -> None:
    kubectl_bin = versioned_kubectl_or_skip(minor)
    async with running_proxy(tmp_path) as running:
        make_pod(running)
        running.fake.faults.forbid("pods/exec")
        code, _, err = await kubectl(
            running.kubeconfig, "exec", "shell", "--", "echo", "hi", binary=kubectl_bin, env=env
        )
        assert code != 0
        assert 'cannot create resource "pods/exec"' in err, err


@asynccontextmanager
async def port_forward(
    running: Running, kubectl_bin: str, env: dict[str, str]
) -> AsyncIterator[int]:
    """``kubectl port-forward pod/shell :8080`` running; yields the local port it listens on."""
    process = await asyncio.create_subprocess_exec(
        kubectl_bin, "--kubeconfig", running.kubeconfig, "port-forward", "pod/shell", ":8080",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    try:
        match = None
        async with asyncio.timeout(30):
            while match is None:
                line = await process.stdout.readline()
                if not line:
                    break
                match = FORWARDING.search(line.decode())
        if match is None:
            raise AssertionError((await process.stderr.read()).decode())
        yield int(match.group(1))
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def echo_round_trip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        async with asyncio.timeout(30):
            return await reader.read(-1)
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize(
    ("minor", "env", "protocol"),
    [
        pytest.param(27, {}, "SPDY/3.1", id="1.27-spdy"),
        pytest.param(33, SPDY_PORT_FORWARD, "SPDY/3.1", id="1.33-spdy"),
        pytest.param(33, {}, "websocket", id="1.33-websocket-tunnel"),
    ],
)
async def test_kubectl_port_forward_carries_tcp_streams(
    tmp_path: Any, minor: int, env: dict[str, str], protocol: str
) -> None:
    kubectl_bin = versioned_kubectl_or_skip(minor)
    async with running_proxy(tmp_path) as running:
        make_pod(running)
        async with port_forward(running, kubectl_bin, env) as port:
            payloads = [os.urandom(256 * 1024), os.urandom(4096), os.urandom(100_000)]
            echoed = await asyncio.gather(*(echo_round_trip(port, p) for p in payloads))
            assert echoed == payloads
            # A later connection rides the same upgraded session.
            assert await echo_round_trip(port, b"once more") == b"once more"
        seen = upgrades_seen(running, "/portforward")
        assert len(seen) == 1, [r.headers.get("Upgrade") for r in seen]
        assert seen[0].headers.get("Upgrade", "").lower() == protocol.lower()
        assert seen[0].headers.get("Authorization") == f"Bearer {running.fake.token}"
