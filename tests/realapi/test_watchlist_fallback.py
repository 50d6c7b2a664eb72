"""client-go v0.37 informers fall back from a watch-list to LIST + WATCH through watchproxy
exactly when, and as, they do against the apiserver directly (issue 28, item 2).

A reflector with WatchList on (the v0.37 default) opens a watch with ``sendInitialEvents=true``;
an apiserver that refuses it (the ``WatchList`` gate off: a 422, as 1.33 answered by default)
makes the reflector LIST and then WATCH from the list's resourceVersion. The program taps every
answer it gets (``REQUEST`` lines: verb, query, status); each informer's requests up to its
first LIST + WATCH must be the same direct and through the proxy, and its store the same state.
"""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest

from tests.clients.build import build_informer137
from tests.clients.process import ClientProcess, Line
from tests.clients.streams import client_state
from tests.harness import proxy_for_upstream
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_clients import built, pod

pytestmark = pytest.mark.timeout(120, func_only=True)


def requests(lines: list[Line]) -> list[tuple[str, bool, int]]:
    """(verb, a watch-list?, status) of each answer, up to the first WATCH after a LIST: what
    the reflector did to get its initial state (later watches depend on timing)."""
    out: list[tuple[str, bool, int]] = []
    listed = False
    for line in lines:
        if line["type"] != "REQUEST":
            continue
        out.append((line["event"], "sendInitialEvents=true" in line["query"], line["code"]))
        listed = listed or line["event"] == "list"
        if listed and line["event"] == "watch":
            break
    return out


def state(lines: list[Line]) -> dict[str, int]:
    return client_state([line for line in lines if line["type"] in ("ADDED", "DELETED")])


async def informer(binary: Path, kubeconfig: str, namespace: str, log: Path) -> list[Line]:
    """One informer's lines once it is ready and has opened its watch."""
    client = ClientProcess(
        log.stem,
        [str(binary), f"--namespace={namespace}"],
        env={**os.environ, "KUBECONFIG": kubeconfig},
        log_path=log,
    )
    await client.start()
    try:
        await client.wait_until(
            lambda lines: (
                any(ln["type"] == "READY" for ln in lines)
                and any(ln["type"] == "WATCH" for ln in lines)
            ),
            what="its initial state and its watch",
            timeout=30,
        )
        return list(client.lines)
    finally:
        await client.stop()


async def test_an_informer_falls_back_to_list_and_watch_through_the_proxy_as_direct(
    tmp_path: Path, watchlist_off: RealApiServer, session: aiohttp.ClientSession
) -> None:
    binary = built(build_informer137)
    direct = Api(
        session,
        watchlist_off.url,
        token=watchlist_off.token,
        ssl_context=watchlist_off.ssl_context(),
    )
    namespace = "fallback"
    await direct.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    for name in ("a", "b", "c"):
        await direct.ok("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod(name, "web"))
    upstream = watchlist_off.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=watchlist_off.token
    )
    mine = await informer(binary, upstream, namespace, tmp_path / "direct.stderr")
    async with proxy_for_upstream(tmp_path, upstream) as running:
        # One informer first, so that the second joins a shared watch the hub already has.
        first = await informer(binary, running.kubeconfig, namespace, tmp_path / "proxy-1.stderr")
        second = await informer(binary, running.kubeconfig, namespace, tmp_path / "proxy-2.stderr")
    expected = [("watch", True, 422), ("list", False, 200), ("watch", False, 200)]
    assert requests(mine) == expected, mine
    for theirs in (first, second):
        assert requests(theirs) == expected, theirs
        assert state(theirs) == state(mine)
