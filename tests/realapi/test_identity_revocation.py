"""Forward identity mode against the real apiserver: a revocation reaches shared state.

Two ServiceAccounts may list and watch configmaps; each is served resourceVersion=0 LISTs and
watches from its own shared watch. Then one RoleBinding is deleted. Within the configured
``security.authorization_cache_seconds`` of the apiserver refusing that account directly, its
new rv=0 LISTs and watches through watchproxy get the apiserver's own 403 (the direct answer is
the oracle), while the other account goes on being served from its shared watch with no new
upstream watch. Running watches are left running, as the apiserver leaves its own (a direct
watch opened before the revocation is the oracle for that too).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api, names
from tests.realapi.test_real_apiserver import (
    _service_account,
    _until_status,
    configmap,
    count,
    proxy,
)

TTL = 1.0


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    return float(value or 0.0)


async def _until_proxy_status(api: Api, path: str, status: int, timeout: float) -> float:
    """Poll ``path`` through the proxy until it answers ``status``; how long that took."""
    started = time.monotonic()
    while (answer := await api.request("GET", path)).status != status:
        if time.monotonic() - started > timeout:
            raise AssertionError(f"GET {path}: {answer.status}, wanted {status} in {timeout}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_revoked_account_gets_the_apiservers_403_from_shared_state_within_the_ttl(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", cms, body=configmap("before"))
    gone_token = await _service_account(
        direct, namespace, "gone", may_read=[namespace], verbs=("list", "watch")
    )
    kept_token = await _service_account(
        direct, namespace, "kept", may_read=[namespace], verbs=("list", "watch")
    )
    gone_direct, kept_direct = direct.with_token(gone_token), direct.with_token(kept_token)
    await _until_status(gone_direct, cms, 200)  # RBAC takes a moment to reach the authorizer
    await _until_status(kept_direct, cms, 200)
    overrides = {
        "security.identity": "forward",
        "security.authorization_cache_seconds": TTL,
        "logging.level": "debug",
    }
    async with proxy(tmp_path, real_apiserver, overrides) as (running, via):
        registry = running.proxy.metrics.registry
        gone, kept = via.with_token(gone_token), via.with_token(kept_token)
        cached = cms + "?resourceVersion=0"
        watch0 = cms + "?watch=1&resourceVersion=0"
        async with (
            gone.watch(cms + "?watch=1") as gone_running,
            kept.watch(cms + "?watch=1") as kept_running,
            gone_direct.watch(cms + "?watch=1") as oracle_running,
        ):
            for stream in (gone_running, kept_running, oracle_running):
                await stream.wait_for(count(1), what="ADDED before")
            assert sample(registry, "watchproxy_shared_watches") == 2  # one per identity
            opens = sample(registry, "watchproxy_watch_upstream_opens_total")
            for api in (gone, kept):
                listed = await api.request("GET", cached)
                assert listed.status == 200
                assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["before"]
            assert sample(registry, "watchproxy_lists_from_cache_total") == 2

            await direct.ok(
                "DELETE",
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/read-gone",
            )
            await _until_status(gone_direct, cached, 403)  # the apiserver now refuses it
            took = await _until_proxy_status(gone, cached, 403, timeout=TTL + 5.0)
            assert took <= TTL + 1.0, f"the revocation took {took:.2f}s to reach the proxy"
            for path in (cached, watch0, watch0 + "&allowWatchBookmarks=true"):
                via_answer = await gone.request("GET", path)
                oracle = await gone_direct.request("GET", path)
                assert via_answer.status == oracle.status == 403, path
                assert via_answer.json() == oracle.json(), path
                assert via_answer.headers["Content-Type"] == "application/json"
            assert (
                sample(registry, "watchproxy_authorization_verdicts_total", {"verdict": "denied"})
                >= 3
            )

            # A change after the revocation: the other account is still served it from its
            # shared watch, and no upstream watch was opened for that.
            await direct.ok("POST", cms, body=configmap("after"))
            await kept_running.wait_for(count(2), what="ADDED after")
            served = sample(registry, "watchproxy_lists_from_cache_total")
            listed = await kept.request("GET", cached)
            assert listed.status == 200
            assert sorted(i["metadata"]["name"] for i in listed.json()["items"]) == [
                "after",
                "before",
            ]
            async with kept.watch(watch0) as kept_again:
                await kept_again.wait_for(count(2), what="both from the shared state")
                assert names(kept_again.events) == {"before", "after"}
            # The revoked account's watches that were running go on, the apiserver's as well.
            await oracle_running.wait_for(count(2), what="ADDED after, direct")
            await gone_running.wait_for(count(2), what="ADDED after, through the proxy")
            assert sample(registry, "watchproxy_watch_upstream_opens_total") == opens
            assert sample(registry, "watchproxy_lists_from_cache_total") == served + 1
        async with aiohttp.ClientSession() as admin:
            async with admin.get(running.admin_url + "/metrics") as response:
                metrics = await response.text()
            async with admin.get(running.admin_url + "/debug/watches") as response:
                debug = await response.text()
    for text in (caplog.text, metrics, debug):
        for token in (gone_token, kept_token):
            assert token not in text
            assert token[-24:] not in text  # nor any sizeable piece of it
