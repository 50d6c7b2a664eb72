"""Kubeconfig exec plugins, run as kubectl runs them, against a fake plugin and the fake
apiserver: the credential is cached until it expires, and a 401 re-runs the plugin once."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml
from aiohttp import web

from kubefake import FakeApiServer
from tests.harness import make_config, wait_for
from watchproxy.app import Proxy
from watchproxy.upstream.credentials import CredentialsError, from_kubeconfig
from watchproxy.upstream.execplugin import ExecCredentialSource, parse_exec_spec

PLUGIN = str(Path(__file__).resolve().parents[1] / "plugins" / "fake_exec_plugin.py")
PODS = "/api/v1/namespaces/default/pods"
V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"


class Plugin:
    """The fake plugin's state directory: what it will answer, and what it was given."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(exist_ok=True)
        self.answer()

    def answer(self, *answers: dict[str, Any]) -> None:
        (self.dir / "answers.json").write_text(json.dumps(list(answers) or [{"token": "x"}]))

    @property
    def records(self) -> list[dict[str, Any]]:
        try:
            text = (self.dir / "runs.jsonl").read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines()]

    @property
    def runs(self) -> int:
        return len(self.records)

    def exec_block(self, **extra: Any) -> dict[str, Any]:
        block: dict[str, Any] = {
            "apiVersion": V1,
            "command": sys.executable,
            "args": [PLUGIN, "--flag", "value"],
            "env": [
                {"name": "FAKE_PLUGIN_DIR", "value": str(self.dir)},
                {"name": "FAKE_PLUGIN_MARK", "value": "from-kubeconfig"},
            ],
            "interactiveMode": "Never",
        }
        block.update(extra)
        return block


def write_kubeconfig(
    path: Path, server: str, exec_block: dict[str, Any], cluster: dict[str, Any] | None = None
) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "k", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": {"exec": exec_block}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return str(path)


@contextlib.asynccontextmanager
async def proxy_for(kubeconfig: str) -> AsyncIterator[tuple[Proxy, str]]:
    proxy = Proxy(make_config(), from_kubeconfig(kubeconfig))
    await proxy.start()
    try:
        yield proxy, f"http://127.0.0.1:{proxy.api_port}"
    finally:
        await proxy.stop()


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


async def get_status(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as response:
        await response.read()
        return response.status


async def test_plugin_token_reaches_the_apiserver_and_is_cached(
    tmp_path: Path, fake_api: FakeApiServer
) -> None:
    plugin = Plugin(tmp_path / "plugin")
    plugin.answer({"token": fake_api.token, "expires_in": 3600})
    extension = {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "a"}}
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig",
        fake_api.url,
        plugin.exec_block(provideClusterInfo=True),
        {"certificate-authority": fake_api.ca_path, "extensions": [extension]},
    )
    async with proxy_for(kubeconfig) as (_, url), aiohttp.ClientSession() as session:
        for _ in range(3):
            assert await get_status(session, url + PODS) == 200
    assert plugin.runs == 1
    (record,) = plugin.records
    assert record["argv"] == ["--flag", "value"]
    assert record["mark"] == "from-kubeconfig"
    assert record["stdin_is_devnull"] is True  # interactiveMode Never: no standard input
    info = record["exec_info"]
    assert info["apiVersion"] == V1 and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    cluster = info["spec"]["cluster"]
    assert cluster["server"] == fake_api.url
    assert base64.b64decode(cluster["certificate-authority-data"]) == read_bytes(fake_api.ca_path)
    assert cluster["config"] == {"audience": "a"}


async def test_a_401_re_runs_the_plugin_exactly_once(
    tmp_path: Path, fake_api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    plugin = Plugin(tmp_path / "plugin")
    plugin.answer({"token": fake_api.token})  # no expiry: kept until a 401
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig",
        fake_api.url,
        plugin.exec_block(apiVersion=V1BETA1),
        {"certificate-authority": fake_api.ca_path},
    )
    async with proxy_for(kubeconfig) as (proxy, url), aiohttp.ClientSession() as session:
        await wait_for(lambda: proxy.connectivity.up, what="the proxy to reach the fake")
        assert await get_status(session, url + PODS) == 200
        assert plugin.runs == 1
        # The apiserver stops taking the token; the plugin's next answer is the new one.
        fake_api.token = "rotated-token"
        plugin.answer({"token": "stale-token"}, {"token": "rotated-token"})
        statuses = await asyncio.gather(*(get_status(session, url + PODS) for _ in range(10)))
        assert statuses == [200] * 10
        assert plugin.runs == 2, "ten requests refused at once: one re-run"
        # A plugin whose answers the apiserver refuses: one re-run per 401, then the 401.
        fake_api.token = "nobody-has-this"
        assert await get_status(session, url + PODS) == 401
        assert plugin.runs == 3
    assert plugin.records[1]["exec_info"]["apiVersion"] == V1BETA1
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "exec plugin" in logged
    for token in (fake_api.token, "rotated-token", "stale-token"):
        assert token not in logged


async def test_credential_is_cached_until_its_expiration_timestamp(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path / "plugin")
    plugin.answer({"token": "t1", "expires_in": 600}, {"token": "t2", "expires_in": 600})
    now = [time.time()]
    spec = parse_exec_spec(plugin.exec_block(), base_dir=str(tmp_path), cluster={}, ca_data=None)
    source = ExecCredentialSource(spec, clock=lambda: now[0])
    assert await source.refresh() is True
    assert source.token == "t1"
    now[0] += 599
    assert await source.refresh() is False
    assert source.token == "t1" and plugin.runs == 1
    now[0] += 2  # past expirationTimestamp
    assert await source.refresh() is True
    assert source.token == "t2" and plugin.runs == 2


async def test_a_failing_plugin_keeps_the_last_credential(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = Plugin(tmp_path / "plugin")
    plugin.answer({"token": "good-token"}, {"exit": 3})
    spec = parse_exec_spec(plugin.exec_block(), base_dir=str(tmp_path), cluster={}, ca_data=None)
    source = ExecCredentialSource(spec)
    await source.refresh()
    source.invalidate("good-token")
    assert await source.refresh() is False
    assert source.token == "good-token" and plugin.runs == 2
    assert "exited with code 3" in caplog.text
    assert await source.refresh() is False
    assert plugin.runs == 2, "no new run right after a failure"


# -- client certificates -----------------------------------------------------------------------


def issue(ca: trustme.CA, directory: Path, name: str) -> dict[str, str]:
    cert = ca.issue_cert(f"{name}.clients.example", common_name=name)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key_path.write_bytes(cert.private_key_pem.bytes())
    return {"cert": str(cert_path), "key": str(key_path)}


@contextlib.asynccontextmanager
async def mtls_server(ca: trustme.CA) -> AsyncIterator[str]:
    """An HTTPS server that requires a client certificate and names it in its answer."""

    async def pods(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(item for rdn in (peer or {}).get("subject", ()) for item in rdn)
        return web.json_response({"kind": "PodList", "client": subject.get("commonName")})

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    app = web.Application()
    app.router.add_get(PODS, pods)

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_client_certificate_from_the_plugin_and_its_rotation(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    plugin = Plugin(tmp_path / "plugin")
    first, second = issue(ca, tmp_path, "first"), issue(ca, tmp_path, "second")
    plugin.answer({**first, "expires_in": 600}, {**second, "expires_in": 600})
    async with mtls_server(ca) as server:
        kubeconfig = write_kubeconfig(
            tmp_path / "kubeconfig",
            server,
            plugin.exec_block(),
            {"certificate-authority": str(ca_path)},
        )
        async with proxy_for(kubeconfig) as (proxy, url), aiohttp.ClientSession() as session:
            async with session.get(url + PODS) as response:
                assert response.status == 200
                assert (await response.json())["client"] == "first"
            # The first certificate expires (as if its expirationTimestamp had passed): the
            # next request brings the plugin's new one, on a new connection.
            target = proxy.upstream.target
            assert target.exec_source is not None and target.exec_source.credential is not None
            target.exec_source.credential = dataclasses.replace(
                target.exec_source.credential, expires_at=time.time() - 1
            )
            async with session.get(url + PODS) as response:
                assert response.status == 200
                assert (await response.json())["client"] == "second"
            assert target._tempdir is not None
            left = os.listdir(target._tempdir.name)
            assert not [n for n in left if n.startswith("exec-client")], "no key left on disk"
    assert plugin.runs == 2


# -- start-up errors: one line, exit 2 ---------------------------------------------------------


def run_watchproxy(kubeconfig: str) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    return subprocess.run(
        [str(bin_dir / "watchproxy"), "run", "--kubeconfig", kubeconfig, "--listen-port", "0",
         "--admin-port", "0", "--admin-host", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/nonexistent"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("exec_extra", "answers", "expected"),
    [
        (
            {"command": "no-such-auth-plugin", "args": [], "installHint": "Install it from X."},
            [{"token": "t"}],
            "exec plugin no-such-auth-plugin: cannot run it: No such file or directory "
            "(Install it from X.)",
        ),
        ({}, [{"exit": 1}], "exited with code 1"),
        ({}, [{"raw": "secret-token-123 is not JSON"}], "its output is not a JSON ExecCredential"),
        ({}, [{"token": "t", "apiVersion": V1BETA1}], "it answered apiVersion"),
        ({"interactiveMode": None}, [{"token": "t"}], "interactiveMode is required"),
        ({"interactiveMode": "Always"}, [{"token": "t"}], "standard input is not a terminal"),
        ({"apiVersion": "client.authentication.k8s.io/v1alpha1"}, [], "is not supported"),
    ],
)
def test_plugin_problems_stop_start_up_in_one_line(
    tmp_path: Path, exec_extra: dict[str, Any], answers: list[dict[str, Any]], expected: str
) -> None:
    plugin = Plugin(tmp_path / "plugin")
    plugin.answer(*answers)
    block = {k: v for k, v in plugin.exec_block(**exec_extra).items() if v is not None}
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:1", block)
    result = run_watchproxy(kubeconfig)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("fake plugin:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("watchproxy: kubeconfig " + kubeconfig), lines[0]
    assert expected in lines[0], lines[0]
    assert "secret-token-123" not in result.stderr


def test_relative_command_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    block = {"apiVersion": V1, "command": "./bin/plugin", "interactiveMode": "Never"}
    spec = parse_exec_spec(block, base_dir=str(tmp_path), cluster={}, ca_data=None)
    assert spec.command == os.path.join(str(tmp_path), "./bin/plugin")
    bare = parse_exec_spec({**block, "command": "aws"}, base_dir="/x", cluster={}, ca_data=None)
    assert bare.command == "aws"  # looked up on PATH


def test_credentials_error_type_is_what_the_cli_catches(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", "https://127.0.0.1:1", {"apiVersion": V1, "command": "x"}
    )
    with pytest.raises(CredentialsError, match="interactiveMode is required"):
        from_kubeconfig(kubeconfig)
