"""CBOR and ``drop=metadata.managedFields`` through watchproxy, against the real apiserver (issue
28, item 5): a representation the hub does not share is passed through untouched, and a client
never gets another representation's bodies.

kube-apiserver 1.37.2 serves CBOR only with the alpha gate ``CBORServingAndStorage`` (off by
default): with it, ``Accept: application/cbor`` gets an ``application/cbor`` LIST and an
``application/cbor-seq`` watch; without it, a 406 (and a 415 for a CBOR request body, the
answer client-go falls back to JSON on). ``drop=metadata.managedFields`` is a parameter 1.37.2
does not know: it ignores it and answers plain JSON. The hub shares neither (see
``watchproxy.kube.negotiation``); each test asks directly and through the proxy and compares,
with a plain JSON watch shared by the hub on the same collection all along. CBOR map keys come
in no fixed order, so CBOR bodies are compared decoded (``tests.realapi.cbor``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.harness import RunningProxy, wait_for
from tests.realapi.cbor import decode, decode_sequence, plain
from tests.realapi.fixture import APISERVER_ARGS, RealApiServer, start_or_skip
from tests.realapi.kubeapi import Api, WatchStream
from tests.realapi.test_real_apiserver import configmap, proxy

pytestmark = pytest.mark.timeout(120, func_only=True)

CBOR = "application/cbor"
CBOR_SEQ = "application/cbor-seq"
DROP = "application/json;drop=metadata.managedFields"
END = "k8s.io/initial-events-end"


@pytest.fixture(scope="module")
def cbor_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    """A second apiserver, with CBOR served (the session's has the gate at its default, off)."""
    server = start_or_skip(
        tmp_path_factory.mktemp("kubetestenv-cbor"),
        extra=("-apiserver-args", APISERVER_ARGS + " --feature-gates=CBORServingAndStorage=true"),
    )
    try:
        yield server
    finally:
        server.stop()


async def fetch(api: Api, path: str, accept: str) -> tuple[int, str, bytes]:
    """Status, Content-Type and body of one GET, bounded in time."""
    async with api.session.get(
        api.base + path,
        headers={**api.headers, "Accept": accept},
        ssl=api.ssl,
        timeout=aiohttp.ClientTimeout(total=30),
    ) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.read()


def cbor_events(body: bytes) -> list[dict[str, Any]]:
    """A CBOR watch's events, periodic bookmarks left out (their timing is each server's). The
    end bookmark's RV is the apiserver's current one, which its own writes move between two
    requests: it is checked against the initial objects', then left out of the comparison."""
    events = [plain(item) for item in decode_sequence(body)]
    kept: list[dict[str, Any]] = []
    for event in events:
        meta = event["object"]["metadata"]
        if event["type"] == "BOOKMARK":
            if END not in (meta.get("annotations") or {}):
                continue
            newest = max((int(e["object"]["metadata"]["resourceVersion"]) for e in kept), default=0)
            assert int(meta.pop("resourceVersion")) >= newest
        kept.append(event)
    return kept


def changes(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"]


def as_of_the_first(first: Any, second: Any) -> Any:
    """``second`` with its list revision set to ``first``'s when it is not older. A LIST of the
    current state carries the store's revision when it was read, which moves with every write
    to any resource (the apiserver's own lease renewals too): of two LISTs made one after the
    other, the second may carry a later revision and still hold the same items (CI, 2026-12-07:
    238 direct, 239 through watchproxy a moment later)."""
    if not (isinstance(first, dict) and isinstance(second, dict)):
        return second
    if not str(first.get("kind", "")).endswith("List"):
        return second
    ours, theirs = (
        first["metadata"].get("resourceVersion"),
        second["metadata"].get("resourceVersion"),
    )
    if ours and theirs and int(theirs) >= int(ours):
        return {**second, "metadata": {**second["metadata"], "resourceVersion": ours}}
    return second


def passed_through(running: RunningProxy) -> float:
    registry = running.proxy.metrics.registry
    value = registry.get_sample_value(
        "watchproxy_watch_passthrough_total", {"reason": "representation"}
    )
    return value or 0.0


async def shared_json_watch(running: RunningProxy) -> None:
    """Wait until the hub serves the plain JSON watch the caller opened, and only that."""
    hub = running.proxy.hub
    assert hub is not None
    await wait_for(lambda: hub.active_clients == 1, what="the hub to serve the JSON watch")
    assert [k.representation for k in hub.watches] == ["json"]


def assert_json_only(stream: WatchStream, names: set[str]) -> None:
    """Every event of the hub's JSON watch parsed as JSON (WatchStream parses each line)."""
    assert stream.status == 200
    seen = {e["object"]["metadata"]["name"] for e in stream.events if e["type"] != "BOOKMARK"}
    assert names <= seen, (names, seen)


async def test_cbor_lists_and_watches_through_the_proxy_are_the_apiservers(
    tmp_path: Path, cbor_apiserver: RealApiServer, session: aiohttp.ClientSession
) -> None:
    direct = Api(
        session,
        cbor_apiserver.url,
        token=cbor_apiserver.token,
        ssl_context=cbor_apiserver.ssl_context(),
    )
    await direct.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": "cbor"}})
    cms = "/api/v1/namespaces/cbor/configmaps"
    for name in ("b", "a", "c"):
        await direct.ok("POST", cms, body=configmap(name))
    async with (
        proxy(tmp_path, cbor_apiserver) as (running, via),
        via.watch(f"{cms}?watch=1&allowWatchBookmarks=true") as js,
    ):
        await shared_json_watch(running)
        before = passed_through(running)
        # LISTs: the current state (compared whole) and "any state" (its items).
        lists: dict[str, Any] = {}
        for query, accept in (("", CBOR), ("?resourceVersion=0", CBOR), ("", f"{CBOR}, {DROP}")):
            answers = [await fetch(api, cms + query, accept) for api in (direct, via)]
            assert [a[:2] for a in answers] == [(200, CBOR)] * 2, (query, accept, answers)
            mine, theirs = (plain(decode(a[2])) for a in answers)
            assert mine["kind"] == "ConfigMapList"
            if query:
                mine, theirs = mine["items"], theirs["items"]
            assert mine == as_of_the_first(mine, theirs), (query, accept)
            lists[query + accept] = mine
        rv = lists[CBOR]["metadata"]["resourceVersion"]
        await direct.ok("PUT", f"{cms}/a", body=configmap("a", "2"))
        await direct.ok("DELETE", f"{cms}/b")
        await direct.ok("POST", cms, body=configmap("d"))
        # Watches: resumed from the LIST's RV, and from "now" (a watch-list from 1.34 on).
        for query in (f"&resourceVersion={rv}", "&allowWatchBookmarks=true"):
            target = f"{cms}?watch=1&timeoutSeconds=2{query}"
            answers = [await fetch(api, target, CBOR) for api in (direct, via)]
            assert [a[:2] for a in answers] == [(200, CBOR_SEQ)] * 2, (query, answers)
            mine, theirs = (cbor_events(a[2]) for a in answers)
            assert mine == theirs, query
            if "resourceVersion" in query:
                assert changes(mine) == [("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "d")]
            else:
                assert changes(mine) == [("ADDED", "a"), ("ADDED", "c"), ("ADDED", "d")]
        # The stream media type is an answer, not an Accept the apiserver serves: 406 both ways.
        refused = [
            await fetch(api, f"{cms}?watch=1&timeoutSeconds=1", CBOR_SEQ) for api in (direct, via)
        ]
        assert [a[:2] for a in refused] == [(406, "application/json")] * 2
        assert json.loads(refused[0][2]) == json.loads(refused[1][2])
        await js.wait_for(lambda ev: any(e["type"] == "DELETED" for e in ev), what="b deleted")
        assert_json_only(js, {"a", "b", "c", "d"})
        assert passed_through(running) - before == 3  # the three CBOR watches
        assert [k.representation for k in running.proxy.hub.watches] == ["json"]  # type: ignore[union-attr]


async def test_cbor_refusals_reach_the_client_unchanged(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """Without the gate: 406 for a CBOR Accept, 415 for a CBOR body; a client that also accepts
    JSON gets JSON, as from the apiserver."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", cms, body=configmap("a"))
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch(f"{cms}?watch=1") as js,
    ):
        await shared_json_watch(running)
        for target in (cms, f"{cms}?resourceVersion=0", f"{cms}?watch=1&timeoutSeconds=1"):
            answers = [await fetch(api, target, CBOR) for api in (direct, via)]
            assert [a[:2] for a in answers] == [(406, "application/json")] * 2, (target, answers)
            assert json.loads(answers[0][2]) == json.loads(answers[1][2]), target
        posted = [
            await api.request("POST", cms, body=b"\xa0", content_type=CBOR) for api in (direct, via)
        ]
        assert [p.status for p in posted] == [415, 415]
        assert posted[0].json() == posted[1].json()
        both = [await fetch(api, cms, f"{CBOR}, application/json") for api in (direct, via)]
        assert [a[:2] for a in both] == [(200, "application/json")] * 2
        first, second = (json.loads(answer[2]) for answer in both)
        assert first == as_of_the_first(first, second)
        assert_json_only(js, {"a"})


async def test_a_managed_fields_drop_is_answered_as_the_apiserver_answers_it(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    listed = await direct.ok("POST", cms, body=configmap("a"))
    rv = listed["metadata"]["resourceVersion"]
    await direct.ok("PUT", f"{cms}/a", body=configmap("a", "2"))
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch(f"{cms}?watch=1") as js,
    ):
        await shared_json_watch(running)
        before = passed_through(running)
        for target in (cms, f"{cms}?watch=1&timeoutSeconds=1&resourceVersion={rv}"):
            answers = [await fetch(api, target, DROP) for api in (direct, via)]
            assert [a[:2] for a in answers] == [(200, "application/json")] * 2, (target, answers)
            mine, theirs = ([json.loads(line) for line in a[2].splitlines()] for a in answers)
            assert mine == [as_of_the_first(m, t) for m, t in zip(mine, theirs, strict=True)], (
                target
            )
            # 1.37.2 does not know the parameter: managedFields stay.
            assert "managedFields" in answers[0][2].decode()
        assert passed_through(running) - before == 1  # the watch; the LIST went upstream too
        assert_json_only(js, {"a"})
