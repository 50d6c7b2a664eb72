"""Reaching the apiserver: in-cluster files, kubeconfig variants, and the token kept secret."""

from __future__ import annotations

import logging
import os
import random
import shutil
from typing import Any

import aiohttp
import pytest
import yaml

from kubefake import FakeApiServer
from tests.harness import make_config, wait_for
from watchproxy.app import Proxy
from watchproxy.upstream.credentials import (
    CredentialsError,
    TokenSource,
    from_kubeconfig,
    in_cluster,
    resolve_target,
)

PODS = "/api/v1/namespaces/default/pods"


async def _get_pods(target: Any) -> int:
    proxy = Proxy(make_config(), target, rng=random.Random(1))
    await proxy.start()
    try:
        await wait_for(lambda: proxy.connectivity.up, what="upstream reachable")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{proxy.api_port}{PODS}") as response,
        ):
            return response.status
    finally:
        await proxy.stop()


def _service_account_dir(tmp_path: Any, fake: FakeApiServer) -> str:
    sa = os.path.join(tmp_path, "serviceaccount")
    os.makedirs(sa)
    shutil.copy(fake.ca_path, os.path.join(sa, "ca.crt"))
    with open(os.path.join(sa, "token"), "w", encoding="utf-8") as handle:
        handle.write(fake.token + "\n")
    with open(os.path.join(sa, "namespace"), "w", encoding="utf-8") as handle:
        handle.write("team-a")
    return sa


async def test_in_cluster_uses_the_service_account_files(
    tmp_path: Any, fake_api: FakeApiServer
) -> None:
    sa = _service_account_dir(tmp_path, fake_api)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake_api.port)}
    target = in_cluster(env, sa_dir=sa)
    assert target.namespace == "team-a"
    assert target.server == f"https://127.0.0.1:{fake_api.port}"
    assert await _get_pods(target) == 200


def test_in_cluster_without_the_environment_is_a_clear_error() -> None:
    with pytest.raises(CredentialsError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster({})


async def test_kubeconfig_context_and_token_file(tmp_path: Any, fake_api: FakeApiServer) -> None:
    token_file = os.path.join(tmp_path, "token")
    with open(token_file, "w", encoding="utf-8") as handle:
        handle.write(fake_api.token)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "wrong",
        "clusters": [
            {
                "name": "fake",
                "cluster": {"server": fake_api.url, "certificate-authority": fake_api.ca_path},
            },
            {"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}},
        ],
        "users": [{"name": "sa", "user": {"tokenFile": token_file}}],
        "contexts": [
            {"name": "wrong", "context": {"cluster": "nowhere", "user": "sa"}},
            {"name": "right", "context": {"cluster": "fake", "user": "sa", "namespace": "ns1"}},
        ],
    }
    path = os.path.join(tmp_path, "kubeconfig")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    target = from_kubeconfig(path, context="right")
    assert target.namespace == "ns1"
    assert await _get_pods(target) == 200
    with pytest.raises(CredentialsError, match="no context named 'missing'"):
        from_kubeconfig(path, context="missing")


async def test_insecure_skip_tls_verify(tmp_path: Any, fake_api: FakeApiServer) -> None:
    config = {
        "current-context": "c",
        "clusters": [
            {"name": "k", "cluster": {"server": fake_api.url, "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "u", "user": {"token": fake_api.token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = os.path.join(tmp_path, "kubeconfig")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    assert await _get_pods(from_kubeconfig(path)) == 200


def test_auth_provider_plugins_are_refused_with_a_clear_message(tmp_path: Any) -> None:
    config = {
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"auth-provider": {"name": "gcp"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = os.path.join(tmp_path, "kubeconfig")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    with pytest.raises(CredentialsError, match="uses an auth-provider plugin"):
        from_kubeconfig(path)


def test_auto_mode_prefers_in_cluster_unless_a_kubeconfig_is_named(tmp_path: Any) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    with pytest.raises(CredentialsError, match="ServiceAccount CA"):
        resolve_target("auto", kubeconfig=None, context=None, env=env)
    with pytest.raises(CredentialsError, match="cannot read kubeconfig"):
        resolve_target("auto", kubeconfig=f"{tmp_path}/none", context=None, env=env)


def test_token_file_rotation_keeps_the_last_good_token(tmp_path: Any) -> None:
    now = [0.0]
    path = os.path.join(tmp_path, "token")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("one")
    source = TokenSource(path=path, reload_seconds=60, clock=lambda: now[0])
    assert source.token() == "one"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("two")
    assert source.token() == "one"  # not yet due
    now[0] = 61
    assert source.token() == "two"
    os.remove(path)
    now[0] = 200
    assert source.token() == "two"  # vanished: keep the last good one
    assert source.read_failures == 1


async def test_the_token_never_appears_in_logs_metrics_or_debug(
    tmp_path: Any, fake_api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = fake_api.write_kubeconfig(os.path.join(tmp_path, "kubeconfig"))
    proxy = Proxy(make_config({"logging.level": "debug"}), from_kubeconfig(path))
    await proxy.start()
    try:
        await wait_for(lambda: proxy.connectivity.up)
        base = f"http://127.0.0.1:{proxy.api_port}"
        admin = f"http://127.0.0.1:{proxy.admin_port}"
        async with aiohttp.ClientSession() as session:
            for url in (f"{base}{PODS}", f"{base}{PODS}?watch=1&timeoutSeconds=1", f"{base}/nope"):
                async with session.get(url) as response:
                    await response.read()
            await fake_api.faults.outage("refuse")
            async with session.get(f"{base}{PODS}") as response:
                failure = await response.text()
            await fake_api.faults.recover()
            async with session.get(f"{admin}/metrics") as response:
                metrics = await response.text()
            async with session.get(f"{admin}/debug/watches") as response:
                debug = await response.text()
    finally:
        await proxy.stop()
    for text in (caplog.text, failure, metrics, debug):
        assert fake_api.token not in text
