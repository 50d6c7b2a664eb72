"""Start a real watchproxy in front of a real fake apiserver, on loopback, for one test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from kubefake import FakeApiServer
from watchproxy.app import Proxy
from watchproxy.config import Config, build_config
from watchproxy.kube.kubeconfig import render_kubeconfig
from watchproxy.upstream.credentials import from_kubeconfig

KUBECTL = "kubectl"
# The newest kubectl, built from Go modules by tests/realapi/build.sh (no package ships it).
BUILT_KUBECTL_DIR = os.path.join(os.path.dirname(__file__), "realapi", "bin")


@dataclass
class Running:
    fake: FakeApiServer
    proxy: Proxy
    kubeconfig: str
    upstream_kubeconfig: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.api_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.admin_port}"


def make_config(overrides: dict[str, Any] | None = None) -> Config:
    data: dict[str, dict[str, Any]] = {
        "listen": {"port": 0},
        "admin": {"host": "127.0.0.1", "port": 0},
        "hub": {"linger_seconds": 0.5},
        "logging": {"level": "warning"},
    }
    for dotted, value in (overrides or {}).items():
        section, key = dotted.split(".", 1)
        data.setdefault(section, {})[key] = value
    return build_config(data, file_name="test")


@dataclass
class RunningProxy:
    """A started watchproxy in front of any upstream (a fake, or a real kube-apiserver)."""

    proxy: Proxy
    kubeconfig: str
    upstream_kubeconfig: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.api_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.admin_port}"


@contextlib.asynccontextmanager
async def proxy_for_upstream(
    tmp_path: Any,
    upstream_kubeconfig: str,
    overrides: dict[str, Any] | None = None,
    *,
    seed: int = 1,
) -> AsyncIterator[RunningProxy]:
    """A watchproxy whose upstream is the cluster in ``upstream_kubeconfig``, stopped after."""
    proxy = Proxy(
        make_config(overrides), from_kubeconfig(upstream_kubeconfig), rng=random.Random(seed)
    )
    await proxy.start()
    try:
        kubeconfig = os.path.join(tmp_path, "proxy.kubeconfig")
        with open(kubeconfig, "w", encoding="utf-8") as handle:
            handle.write(
                render_kubeconfig(f"http://127.0.0.1:{proxy.api_port}", namespace="default")
            )
        await wait_for(lambda: proxy.connectivity.up, what="proxy to reach the upstream")
        yield RunningProxy(proxy, kubeconfig, upstream_kubeconfig)
    finally:
        await proxy.stop()


@contextlib.asynccontextmanager
async def running_proxy(
    tmp_path: Any,
    overrides: dict[str, Any] | None = None,
    *,
    fake: FakeApiServer | None = None,
    seed: int = 1,
) -> AsyncIterator[Running]:
    own_fake = fake is None
    if fake is None:
        fake = FakeApiServer(bookmark_interval=0.5)
        await fake.start()
    try:
        upstream_kubeconfig = fake.write_kubeconfig(os.path.join(tmp_path, "upstream.kubeconfig"))
        async with proxy_for_upstream(
            tmp_path, upstream_kubeconfig, overrides, seed=seed
        ) as running:
            yield Running(fake, running.proxy, running.kubeconfig, upstream_kubeconfig)
    finally:
        if own_fake:
            await fake.stop()


async def wait_for(
    predicate: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll a cheap in-process predicate; the loop keeps serving in between. Bounded in time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def versioned_kubectl(minor: int) -> str | None:
    """``kubectl.1.NN`` on PATH, built by tests/realapi/build.sh, or beside the kubectl that the
    Google Cloud CLI installs."""
    name = f"kubectl.1.{minor}"
    found = shutil.which(name)
    if found is not None:
        return found
    built = os.path.join(BUILT_KUBECTL_DIR, name)
    if os.access(built, os.X_OK):
        return built
    default = shutil.which(KUBECTL)
    if default is None:
        return None
    beside = os.path.join(os.path.dirname(os.path.realpath(default)), name)
    return beside if os.access(beside, os.X_OK) else None


def versioned_kubectl_or_skip(minor: int) -> str:
    """:func:`versioned_kubectl`, or skip the test that needs it."""
    found = versioned_kubectl(minor)
    if found is None:
        pytest.skip(
            f"kubectl.1.{minor} is not installed (the Google Cloud CLI ships 1.27-1.33;"
            " tests/realapi/build.sh builds the newest)"
        )
    return found


# kubectl >= 1.30 execs over WebSocket unless this variable (a kubectl feature gate) says not to.
SPDY_EXEC_ENV = {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}


async def kubectl(
    kubeconfig: str,
    *args: str,
    timeout: float = 30.0,
    stdin: bytes | None = None,
    binary: str = KUBECTL,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """Run the real kubectl (client-go) without blocking the loop that serves it.
    ``env`` is added to this process's environment (kubectl's feature gates are variables)."""
    process = await asyncio.create_subprocess_exec(
        binary,
        "--kubeconfig",
        kubeconfig,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env} if env else None,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def read_watch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    until: Callable[[list[dict[str, Any]]], bool],
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Read watch events from ``url`` until ``until(events)`` holds (or the stream ends)."""
    events: list[dict[str, Any]] = []

    async def consume() -> None:
        async with session.get(url, headers=headers) as response:
            assert response.status == 200, await response.text()
            async for raw in response.content:
                if raw.strip():
                    events.append(json.loads(raw))
                    if until(events):
                        return

    await asyncio.wait_for(consume(), timeout)
    return events


def rv_of(event: dict[str, Any]) -> int:
    return int(event["object"]["metadata"]["resourceVersion"])


async def gather_bounded(*aws: Awaitable[Any], timeout: float) -> list[Any]:
    return list(await asyncio.wait_for(asyncio.gather(*aws), timeout))
