"""Protobuf watches shared by the hub, against the real kube-apiserver (issue 16, part 1).

The rule (README, "Protobuf"): one shared upstream watch per encoding. A protobuf client of a
built-in kind is served from a protobuf shared watch, frame for frame what the apiserver sends;
a kind the apiserver cannot encode in protobuf (a custom resource) is passed through, so the
client gets whatever its own ``Accept`` allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.component.test_http_protocol import request
from tests.component.test_hub_list_stream import slow_connection
from tests.harness import wait_for
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api, ticking
from tests.realapi.test_real_apiserver import configmap, list_outcomes, proxy
from watchproxy.kube.protobuf import PROTOBUF, ProtobufRepresentation

ACCEPT = {"Accept": PROTOBUF + ", application/json"}


class Frames:
    """The decoded frames of one protobuf watch, as (type, name, resourceVersion), and raw."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.events: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()
        self.content_type = ""

    async def read(self, response: aiohttp.ClientResponse) -> None:
        self.content_type = response.headers.get("Content-Type", "")
        rep = ProtobufRepresentation()
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
                size = 4 + int.from_bytes(buffer[:4], "big")
                record, buffer = buffer[:size], buffer[size:]
                kind, obj = rep.decode_event(record)
                meta = obj.get("metadata", {})
                self.raw.append(record)
                self.events.append((kind, meta.get("name", ""), meta.get("resourceVersion", "")))
                self.changed.set()

    async def wait(self, done: Any, what: str, timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while not done(self.events):
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def protobuf_watch(api: Api, path: str) -> AsyncIterator[Frames]:
    frames = Frames()
    headers = {**api.headers, **ACCEPT}
    async with api.session.get(api.base + path, headers=headers, ssl=api.ssl) as response:
        assert response.status == 200, await response.text()
        reader = asyncio.ensure_future(frames.read(response))
        try:
            yield frames
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


def changes(events: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [e for e in events if e[0] != "BOOKMARK"]


async def test_a_protobuf_watch_is_served_frame_for_frame_as_the_apiserver_sends_it(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", cms, body=configmap("before"))
    start = (await direct.ok("GET", cms))["metadata"]["resourceVersion"]
    async with proxy(tmp_path, real_apiserver) as (running, via):
        watch = f"{cms}?watch=1&resourceVersion={start}"
        async with protobuf_watch(via, watch) as proxied, protobuf_watch(direct, watch) as oracle:
            hub = running.proxy.hub
            assert hub is not None
            await wait_for(lambda: any(k.representation == "protobuf" for k in hub.watches))
            await direct.ok("POST", cms, body=configmap("a"))
            await direct.ok("PUT", f"{cms}/a", body=configmap("a", "2"))
            await direct.ok("DELETE", f"{cms}/before")
            for frames in (oracle, proxied):
                await frames.wait(lambda ev: len(changes(ev)) == 3, "three changes")
            assert changes(proxied.events) == changes(oracle.events)
            assert [e[0] for e in changes(proxied.events)] == ["ADDED", "MODIFIED", "DELETED"]
            assert proxied.raw == oracle.raw  # byte for byte, envelope and all
            assert proxied.content_type == oracle.content_type

            # A second protobuf client resumes from the first change: the shared history.
            first_rv = proxied.events[0][2]
            async with protobuf_watch(via, f"{cms}?watch=1&resourceVersion={first_rv}") as late:
                await late.wait(lambda ev: len(changes(ev)) == 2, "the two later changes")
                assert late.raw == proxied.raw[1:]
            # resourceVersion=0 lists are answered from the protobuf shared watch's state.
            cached = await via.request("GET", cms + "?resourceVersion=0", headers=ACCEPT)
            assert cached.status == 200
            items, _, _ = ProtobufRepresentation().decode_list_page(cached.body)
            assert [o["metadata"]["name"] for o in items] == ["a"]
        lists = running.proxy.metrics.registry.get_sample_value("watchproxy_lists_from_cache_total")
        assert lists == 1


async def test_a_json_and_a_protobuf_watch_of_one_resource_use_one_upstream_watch_each(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        protobuf_watch(via, f"{cms}?watch=1") as pb1,
        protobuf_watch(via, f"{cms}?watch=1") as pb2,
        via.watch(f"{cms}?watch=1") as js,
    ):
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: hub.active_clients == 3, what="three hub-served watches")
        assert sorted(k.representation for k in hub.watches) == ["json", "protobuf"]
        await direct.ok("POST", cms, body=configmap("x"))
        for frames in (pb1, pb2):
            await frames.wait(lambda ev: ("ADDED", "x") in {e[:2] for e in ev}, "x")
        await js.wait_for(
            lambda events: any(e["object"]["metadata"]["name"] == "x" for e in events),
            what="x as JSON",
        )
        assert pb1.raw == pb2.raw


def established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


async def test_a_custom_resource_asked_for_in_protobuf_is_passed_through(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    group = f"g{namespace.replace('-', '')}.example.com"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    name = crd["metadata"]["name"]
    async with direct.watch(f"{crds}?watch=1&fieldSelector=metadata.name={name}") as stream:
        await direct.ok("POST", crds, body=crd)
        await stream.wait_for(
            lambda events: any(established(e["object"]) for e in events),
            what="the CRD established",
            timeout=30,
        )
    widgets = f"/apis/{group}/v1/namespaces/{namespace}/widgets"
    # Established is not served yet: the custom resource's watch cache starts after it, and
    # until then the apiserver answers 429 "storage is (re)initializing" with a Retry-After.
    # A bounded poll that honours it (the apiserver offers nothing to await).
    for _ in range(60):
        answer = await direct.request("GET", widgets)
        if answer.status != 429:
            break
        await asyncio.sleep(float(answer.headers.get("Retry-After", "1")) / 4)
    assert answer.status == 200, answer.body
    async with proxy(tmp_path, real_apiserver) as (running, via):
        for _ in range(2):
            answer = await via.request("GET", widgets + "?watch=1&timeoutSeconds=1", headers=ACCEPT)
            assert answer.status == 200
            assert answer.headers.get("Content-Type", "").startswith("application/json")
        passed = running.proxy.metrics.registry.get_sample_value(
            "watchproxy_watch_passthrough_total", {"reason": "representation"}
        )
        assert passed == 2
        # One LIST told the hub; the second watch went straight through.
        hub = running.proxy.hub
        assert hub is not None and not hub.watches


async def test_a_protobuf_list_in_pages_from_the_hub_is_the_apiservers_byte_for_byte(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """client-go's pager (a typed client's relist: protobuf, limit=500) answered by the hub:
    page 1 is kube-apiserver's page 1 at the same revision byte for byte (ListMeta's continue
    token and remainingItemCount included), and the pages together are its list there."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(7):
        await direct.ok("POST", cms, body=configmap(f"c{i}"))
    decode = ProtobufRepresentation().decode_list_page
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        protobuf_watch(via, f"{cms}?watch=1") as proxied,
    ):
        await proxied.wait(lambda events: len(events) >= 7, "the configmaps")
        # The collection moves, as a busy one does.
        async with ticking(direct, cms, configmap("ticker")):
            first = await via.request("GET", cms + "?limit=3", headers=ACCEPT)
        assert first.status == 200
        names, rv, token = [], "", ""
        page = first.body
        while True:
            items, rv_of_page, token = decode(page)
            rv = rv or rv_of_page
            assert rv_of_page == rv
            names += [item["metadata"]["name"] for item in items]
            if not token:
                break
            answer = await via.request("GET", f"{cms}?limit=3&continue={token}", headers=ACCEPT)
            assert answer.status == 200
            page = answer.body
        outcomes = list_outcomes(running, "hub", "page")
    at_rv = f"{cms}?resourceVersion={rv}&resourceVersionMatch=Exact"
    oracle_first = await direct.request("GET", at_rv + "&limit=3", headers=ACCEPT)
    oracle = await direct.request("GET", at_rv, headers=ACCEPT)
    assert first.body == oracle_first.body  # envelope, ListMeta and items
    assert names == [item["metadata"]["name"] for item in decode(oracle.body)[0]]
    assert names == [*(f"c{i}" for i in range(7)), "ticker"]
    assert outcomes == {"hub": 1, "page": 2}


async def test_slow_readers_of_a_cached_protobuf_list_hold_a_piece_each_not_a_copy(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """Six protobuf clients that ask for a 12 MB LIST from the hub and read nothing: what the
    proxy allocates meanwhile (tracemalloc) stays under one answer's size (before, each
    answer was one bytes object: six answers' worth); then each reads the apiserver's list."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(120):
        await direct.ok("POST", cms, body=configmap(f"big-{i:03}", "x" * 100_000))
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        protobuf_watch(via, f"{cms}?watch=1"),
    ):
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(
            lambda: any(k.representation == "protobuf" and w.cache.synced
                        for k, w in hub.watches.items()),
            what="a synced protobuf watch",
        )  # fmt: skip
        (shared,) = [w for k, w in hub.watches.items() if k.representation == "protobuf"]
        whole = shared.cache.list_response()
        ask = request("GET", cms + "?resourceVersion=0", Accept=PROTOBUF)
        served = running.proxy.metrics.registry
        slow = [await slow_connection(running.proxy.api_port) for _ in range(6)]
        try:
            tracemalloc.start()
            try:
                for conn in slow:
                    conn.send(ask)
                await wait_for(
                    lambda: served.get_sample_value("watchproxy_lists_from_cache_total") == 6,
                    what="six LISTs answered from the cache",
                )
                await asyncio.sleep(0.5)  # each answer as far as its client's socket takes it
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            print(
                f"answer {len(whole) / 2**20:.1f} MiB; 6 slow readers: peak {peak / 2**20:.1f} MiB"
            )
            assert peak < len(whole), (len(whole), peak)
            for conn in slow:
                status, _, body = await conn.answer()
                assert (status, body) == (200, whole)
        finally:
            for conn in slow:  # closed even when an assertion failed (megabytes unread)
                conn.close()
        direct_list = await direct.request("GET", cms + "?resourceVersion=0", headers=ACCEPT)
        items, _, _ = ProtobufRepresentation().decode_list_page(direct_list.body)
        assert len(items) == 120
