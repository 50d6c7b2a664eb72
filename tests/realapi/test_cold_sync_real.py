"""A cold key's first client against kube-apiserver 1.37 (issue 43, item 3; hub/firstsync.py):
relayed the initial events of the hub's first request for the key, a watch-list that then goes
on as the key's shared watch. The client's stream is the one the apiserver gives directly, and
the apiserver serves the key one WATCH and no LIST, by its own ``apiserver_request_total``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import proxy_for_upstream
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api

pytestmark = pytest.mark.timeout(90, func_only=True)


async def requests_served(direct: Api, resource: str, code: str = "") -> dict[str, float]:
    """LISTs and WATCHes of ``resource`` the apiserver has served (answered with ``code``, if
    given), by its own ``/metrics``."""
    text = (await direct.request("GET", "/metrics")).body.decode()
    counts = {"LIST": 0.0, "WATCH": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            verb = sample.labels.get("verb", "")
            if (
                sample.name == "apiserver_request_total"
                and verb in counts
                and sample.labels.get("resource") == resource
                and sample.labels.get("code", "") == (code or sample.labels.get("code", ""))
            ):
                counts[verb] += sample.value
    return counts


async def events(session: aiohttp.ClientSession, url: str, **kwargs: object) -> list[object]:
    """Every event of a watch that ends by its timeoutSeconds, parsed."""
    async with session.get(url, **kwargs) as response:  # type: ignore[arg-type]
        assert response.status == 200, await response.text()
        body = await response.read()
    return [json.loads(line) for line in body.splitlines() if line.strip()]


async def test_a_cold_keys_first_client_gets_the_apiservers_stream_for_one_watch_upstream(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(60):
        await direct.ok("POST", path, body={"metadata": {"name": f"c{i:02}"}, "data": {"v": "x"}})
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    # No bookmarks asked for: no question of whether the apiserver serves watch-lists first.
    target = f"{path}?watch=1&timeoutSeconds=2"
    before = await requests_served(direct, "configmaps")
    async with (
        aiohttp.ClientSession(skip_auto_headers=("Accept-Encoding",)) as plain,
        proxy_for_upstream(tmp_path, upstream) as running,
    ):
        proxied = await events(plain, running.url + target)
    # Counted once the handler returns (the proxy has closed its watch by now): a bounded
    # poll of the apiserver's counter, as no event tells when.
    served: dict[str, float] = {}
    for _ in range(50):
        after = await requests_served(direct, "configmaps")
        served = {verb: after[verb] - before[verb] for verb in after}
        if served["WATCH"] >= 1:
            break
        await asyncio.sleep(0.1)
    assert served == {"LIST": 0.0, "WATCH": 1.0}
    async with aiohttp.ClientSession(skip_auto_headers=("Accept-Encoding",)) as plain:
        expected = await events(
            plain,
            real_apiserver.url + target,
            headers=real_apiserver.auth(),
            ssl=real_apiserver.ssl_context(),
        )
    assert proxied == expected
    assert len(proxied) == 60


async def test_an_apiserver_that_refuses_watch_lists_is_listed_in_pages_and_asked_once(
    tmp_path: Path, watchlist_off: RealApiServer
) -> None:
    """The first cold key's watch-list gets the apiserver's 422: that key is listed in pages
    and its client served as before, and the next cold key of the group version is listed
    in pages at once: one refused watch-list in all."""
    server = watchlist_off
    auth = {"headers": server.auth(), "ssl": server.ssl_context()}
    upstream = server.write_kubeconfig(tmp_path / "up.kubeconfig", token=server.token)
    admin = Api(
        aiohttp.ClientSession(), server.url, token=server.token, ssl_context=server.ssl_context()
    )
    try:
        for resource in ("configmaps", "secrets"):
            await admin.request(
                "POST",
                f"/api/v1/namespaces/default/{resource}",
                body={"metadata": {"name": "cold"}},
            )
        async with aiohttp.ClientSession(skip_auto_headers=("Accept-Encoding",)) as plain:
            before = {r: await requests_served(admin, r, "422") for r in ("configmaps", "secrets")}
            async with proxy_for_upstream(tmp_path, upstream) as running:
                for resource in ("configmaps", "secrets"):
                    target = f"/api/v1/namespaces/default/{resource}?watch=1&timeoutSeconds=1"
                    proxied = await events(plain, running.url + target)
                    expected = await events(plain, server.url + target, **auth)
                    assert proxied == expected and len(expected) == 1
            refused: dict[str, float] = {}
            for _ in range(50):  # counted once each handler returned: a bounded poll
                after = {r: await requests_served(admin, r, "422") for r in before}
                refused = {r: after[r]["WATCH"] - before[r]["WATCH"] for r in before}
                if refused["configmaps"] >= 1:
                    break
                await asyncio.sleep(0.1)
            assert refused == {"configmaps": 1.0, "secrets": 0.0}
    finally:
        await admin.session.close()
