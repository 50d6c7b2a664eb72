"""Watches from "now" (resourceVersion absent or "0", no sendInitialEvents) answered as the
apiserver behind the proxy answers them.

From 1.34 the apiserver (WatchList on) defaults such a watch to a watch-list when it allows
bookmarks: the initial ADDED events, then a bookmark annotated ``k8s.io/initial-events-end``;
without bookmarks, the initial events only. The hub used to send the initial events without
the end bookmark. Periodic bookmarks are left out of the comparison: when they come is each
server's choice.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.clientconnector import SerialConnector
from tests.harness import proxy_for_upstream, wait_for
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api

pytestmark = pytest.mark.timeout(60, func_only=True)

END = "k8s.io/initial-events-end"
QUERIES = (
    "",
    "&resourceVersion=",
    "&resourceVersion=0",
    "&allowWatchBookmarks=true",
    "&resourceVersion=&allowWatchBookmarks=true",
    "&resourceVersion=0&allowWatchBookmarks=true",
)


@pytest.fixture
async def plain() -> AsyncIterator[aiohttp.ClientSession]:
    """No Accept-Encoding: an identity body from either side."""
    connector = SerialConnector(is_down=lambda: False, on_failure=lambda _error: None)
    async with aiohttp.ClientSession(
        connector=connector, skip_auto_headers=("Accept-Encoding",)
    ) as client:
        yield client
    await connector.wait_closed(5.0)


async def stream(
    session: aiohttp.ClientSession, url: str, **kwargs: object
) -> list[tuple[str, str]]:
    """(type, name or "END") for each event up to the watch's timeout, periodic bookmarks out."""
    async with session.get(url, **kwargs) as response:  # type: ignore[arg-type]
        assert response.status == 200, await response.text()
        body = await response.read()
    out = []
    for line in body.splitlines():
        event = json.loads(line)
        meta = event["object"]["metadata"]
        if event["type"] == "BOOKMARK":
            if (meta.get("annotations") or {}).get(END) == "true":
                out.append(("BOOKMARK", "END"))
        else:
            out.append((event["type"], meta["name"]))
    return out


@pytest.mark.parametrize(
    "query",
    QUERIES,
    ids=["unset", "empty", "rv0", "unset-bookmarks", "empty-bookmarks", "rv0-bookmarks"],
)
async def test_a_watch_from_now_is_answered_as_the_apiserver_answers_it(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    plain: aiohttp.ClientSession,
    query: str,
) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for name in ("b", "a", "c"):
        await direct.ok("POST", path, body={"metadata": {"name": name}})
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    target = f"{path}?watch=1&timeoutSeconds=2{query}"
    async with proxy_for_upstream(tmp_path, upstream) as running:
        proxied = await stream(plain, running.url + target)
    expected = await stream(
        plain,
        real_apiserver.url + target,
        headers=real_apiserver.auth(),
        ssl=real_apiserver.ssl_context(),
    )
    assert proxied == expected
    assert ("BOOKMARK", "END") in expected if "allowWatchBookmarks" in query else True


@pytest.mark.parametrize("resource", ["configmaps", "secrets"], ids=["etcd", "watch-cache"])
async def test_a_watch_from_now_joining_a_shared_watch_holds_every_earlier_write(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    plain: aiohttp.ClientSession,
    resource: str,
) -> None:
    """The apiserver serves a watch from now at its current revision, so a write made just
    before is in its initial events; the hub serves such a watch from a running shared watch
    only once it has shown that state to be as new (hub/freshwatch.py), here without passing
    any through. configmaps are watched from etcd in this apiserver, secrets from its cache."""
    path = f"/api/v1/namespaces/{namespace}/{resource}"
    await direct.ok("POST", path, body={"metadata": {"name": "a"}})
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    target = f"{path}?watch=1&timeoutSeconds=2&allowWatchBookmarks=true"
    async with (
        proxy_for_upstream(tmp_path, upstream) as running,
        plain.get(running.url + path + "?watch=1") as holder,
    ):
        assert holder.status == 200
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: hub.active_clients == 1, what="the shared watch")
        for query in ("&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", ""):
            name = f"w{len(query)}"
            await direct.ok("POST", path, body={"metadata": {"name": name}})
            events = await stream(plain, running.url + target + query)
            initial = events[: events.index(("BOOKMARK", "END"))]
            assert ("ADDED", name) in initial, (query, events)
        registry = running.proxy.metrics.registry
        passed = {"reason": "not-current"}
        assert registry.get_sample_value("watchproxy_watch_passthrough_total", passed) is None
