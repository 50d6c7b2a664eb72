"""Consistent LISTs through watchproxy against the real kube-apiserver: each sees every write that
finished before it was sent, and the apiserver's own request counter shows how many LISTs it
served (issue 16, part 2); the hub's answers, whole or in pages, are the apiserver's own, body,
order and continue tokens included; kubectl prints the same through watchproxy."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.clients.build import build_watchclient
from tests.clients.build_rust_node import build_kubewatch
from tests.clients.process import ClientProcess
from tests.harness import kubectl, wait_for
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api, ticking
from tests.realapi.test_protobuf import protobuf_watch
from tests.realapi.test_real_apiserver import configmap, list_outcomes, pod, proxy
from tests.realapi.test_real_clients import built

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
# What kubectl get asks for, so that the watch's key is the LIST's.
KUBECTL_TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def comparable_list(body: dict[str, Any]) -> dict[str, Any]:
    """A LIST answer as two servers must agree on it: a Table's Age cells are left out (the
    apiserver computes "now" minus creationTimestamp per request)."""
    if body["kind"] != "Table":
        return body
    return {**body, "rows": [{**row, "cells": row["cells"][:-1]} for row in body["rows"]]}


def list_objects(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of a LIST answer: its items, or a Table's rows' objects."""
    found: list[dict[str, Any]] = body.get("items") or [row["object"] for row in body["rows"]]
    return found


def item_rvs(body: dict[str, Any]) -> list[int]:
    """The resourceVersion of each object of a LIST answer."""
    return [int(item["metadata"]["resourceVersion"]) for item in list_objects(body)]


PODS_AND_TICKER = [*(f"p{i}" for i in range(7)), "ticker"]


async def exact_items(direct: Api, path: str, rv: str) -> list[tuple[str, str]]:
    """(name, resourceVersion) of each item of the apiserver's list of ``path`` at ``rv``."""
    exact = await direct.ok("GET", f"{path}?resourceVersion={rv}&resourceVersionMatch=Exact")
    return [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in exact["items"]]


async def apiserver_lists(direct: Api, resource: str) -> float:
    """LISTs of ``resource`` the apiserver has served, by its own ``/metrics``."""
    text = (await direct.request("GET", "/metrics")).body.decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "apiserver_request"
        for sample in family.samples
        if sample.name == "apiserver_request_total"
        and sample.labels.get("verb") == "LIST"
        and sample.labels.get("resource") == resource
    )


async def test_concurrent_consistent_lists_share_upstream_lists_and_see_earlier_writes(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    # 200 KB each: a 4 MB LIST takes long enough upstream that the 30 requests of a round,
    # dispatched one by one by this (possibly loaded) process, mostly arrive while it is in
    # flight. How many batches that makes still depends on timing; the bound below is loose.
    for i in range(20):
        await direct.ok("POST", cms, body=configmap(f"c{i:02}", "x" * 200_000))
    async with proxy(tmp_path, real_apiserver) as (running, via):
        metrics = running.proxy.metrics.registry
        before = await apiserver_lists(direct, "configmaps")
        first = await asyncio.gather(*(via.ok("GET", cms) for _ in range(30)))
        await direct.ok("POST", cms, body=configmap("after"))
        # Sent after the write returned: every one of these must see it.
        second = await asyncio.gather(*(via.ok("GET", cms) for _ in range(30)))
        want = sorted(f"c{i:02}" for i in range(20))
        assert all(sorted(i["metadata"]["name"] for i in b["items"]) == want for b in first)
        assert all(
            sorted(i["metadata"]["name"] for i in b["items"]) == sorted([*want, "after"])
            for b in second
        )
        batches = metrics.get_sample_value("watchproxy_list_batches_total")
        assert metrics.get_sample_value("watchproxy_lists_batched_total") == 60
        # The apiserver counts a request after its handler returns, which can be a moment
        # after the client has the answer: a bounded poll of its counter (no event to await).
        served = 0.0
        for _ in range(50):
            served = await apiserver_lists(direct, "configmaps") - before
            if served >= (batches or 0):
                break
            await asyncio.sleep(0.1)
        assert served == batches  # the apiserver saw exactly the batches' LISTs
        print(f"60 LISTs through watchproxy: {batches:.0f} at the apiserver")
        # Not 60: 5 and 8 on a quiet machine, 13 once under a loaded CI run (small LISTs).
        assert batches is not None and batches <= 20, batches


async def test_consistent_lists_of_a_busy_collection_are_answered_by_the_hub(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """With a live shared watch of the collection, each LIST costs the apiserver only its share
    of a one-item probe, and still sees every write that finished before it was sent."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(20):
        await direct.ok("POST", cms, body=configmap(f"c{i:02}"))
    async with proxy(tmp_path, real_apiserver) as (running, via), via.watch(cms + "?watch=1"):
        metrics = running.proxy.metrics.registry
        # Keeps the collection moving, as a busy one does.
        async with ticking(direct, cms, configmap("ticker")):
            before = await apiserver_lists(direct, "configmaps")
            for round_ in range(3):
                await direct.ok("POST", cms, body=configmap(f"mark-{round_}"))
                answers = await asyncio.gather(*(via.ok("GET", cms) for _ in range(20)))
                for body in answers:
                    assert f"mark-{round_}" in {i["metadata"]["name"] for i in body["items"]}
        from_hub = metrics.get_sample_value("watchproxy_consistent_lists_total", {"outcome": "hub"})
        probes = metrics.get_sample_value("watchproxy_freshness_probes_total") or 0
        batches = metrics.get_sample_value("watchproxy_list_batches_total") or 0
        served = 0.0
        for _ in range(50):  # the apiserver counts a request a moment after answering it
            served = await apiserver_lists(direct, "configmaps") - before
            if served >= probes + batches:
                break
            await asyncio.sleep(0.1)
        print(f"60 LISTs: {from_hub:.0f} from the hub, {probes:.0f} probes, {batches:.0f} LISTs")
        assert served == probes + batches
        # 60 and 7-9 probes on a quiet machine; a loaded one may let the watch fall behind the
        # 0.5 s wait for a few (those go upstream, counted in served above).
        assert from_hub is not None and from_hub >= 30, from_hub
        assert probes < 60, probes


async def test_a_namespaced_list_is_answered_from_a_cluster_wide_watch(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """An informer watching every configmap answers a namespaced LIST, as the apiserver would."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(5):
        await direct.ok("POST", cms, body=configmap(f"c{i}"))
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch("/api/v1/configmaps?watch=1") as watch,
    ):
        metrics = running.proxy.metrics.registry
        # Synced once the initial ADDEDs are out (ours, and those of other namespaces).
        await watch.wait_for(lambda events: len(events) >= 5, what="the initial configmaps")
        # The first client of a cold key gets the apiserver's own initial events before the
        # hub has built its state from them: the LIST is the hub's once that state is in.
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: all(w.cache.synced for w in hub.watches.values()), what="synced")
        # The collection moves; then a write the LIST must see.
        async with ticking(direct, cms, configmap("ticker")):
            await direct.ok("POST", cms, body=configmap("mark"))
            via_body = await via.ok("GET", cms)
        served = metrics.get_sample_value("watchproxy_consistent_lists_total", {"outcome": "hub"})
    rv = via_body["metadata"]["resourceVersion"]
    oracle = await direct.ok("GET", f"{cms}?resourceVersion={rv}&resourceVersionMatch=Exact")
    assert "mark" in {i["metadata"]["name"] for i in via_body["items"]}
    as_seen = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in via_body["items"]}
    truth = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in oracle["items"]}
    assert as_seen == truth
    assert served == 1


@pytest.mark.parametrize("accept", ["application/json", TABLE])
async def test_lists_from_the_hub_equal_the_apiservers_in_body_and_order(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, accept: str
) -> None:
    """A consistent and a resourceVersion=0 LIST answered by the hub are the apiserver's own
    answers, byte for byte once parsed (a Table's Age cells aside: the apiserver computes them
    per request), with the objects created after the watch synced in key order: ``kubectl get``
    prints what the LIST returns."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    headers = {"Accept": accept}
    await direct.ok("POST", cms, body=configmap("m-first"))
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch(f"{cms}?watch=1", headers=headers) as watch,
    ):
        metrics = running.proxy.metrics.registry
        await watch.wait_for(lambda events: len(events) >= 1, what="the initial configmap")
        for name in ("zeta", "alpha", "m-mid", "beta"):  # not in key order
            await direct.ok("POST", cms, body=configmap(name))
        await direct.ok(
            "PATCH",
            f"{cms}/zeta",
            body={"data": {"n": "1"}},
            content_type="application/merge-patch+json",
        )
        await watch.wait_for(lambda events: len(events) >= 6, what="the new configmaps")
        from_cache = await via.ok("GET", f"{cms}?resourceVersion=0", headers=headers)
        oracle_cache = await direct.ok("GET", f"{cms}?resourceVersion=0", headers=headers)
        async with ticking(direct, cms, configmap("ticker")):
            consistent = await via.ok("GET", cms + "?limit=500", headers=headers)  # as kubectl
        rv = consistent["metadata"]["resourceVersion"]
        oracle = await direct.ok(
            "GET",
            f"{cms}?limit=500&resourceVersion={rv}&resourceVersionMatch=Exact",
            headers=headers,
        )
        served = metrics.get_sample_value("watchproxy_consistent_lists_total", {"outcome": "hub"})
        cached = metrics.get_sample_value("watchproxy_lists_from_cache_total")

    assert (served, cached) == (1, 1)
    assert comparable_list(consistent) == comparable_list(oracle)
    # A resourceVersion=0 LIST is answered at whatever revision the answering cache has
    # reached, and the apiserver's watch cache moves on etcd progress notifications that other
    # writes cause (its identity lease, every 10 s) with no configmap event: two such LISTs one
    # after the other may differ in their list resourceVersion, direct or not (a stressed CI run
    # saw 2321 from the hub, then 2322 from the apiserver). The hub's, read first, must be one
    # the apiserver could have given: no older than any item, no newer than the later answer.
    cache_rv = int(from_cache["metadata"]["resourceVersion"])
    assert max(item_rvs(from_cache)) <= cache_rv <= int(oracle_cache["metadata"]["resourceVersion"])
    metadata = {
        **from_cache["metadata"],
        "resourceVersion": oracle_cache["metadata"]["resourceVersion"],
    }
    assert comparable_list({**from_cache, "metadata": metadata}) == comparable_list(oracle_cache)

    def names(body: dict[str, Any]) -> list[str]:
        return [item["metadata"]["name"] for item in list_objects(body)]

    assert names(oracle_cache) == ["alpha", "beta", "m-first", "m-mid", "zeta"]
    assert names(oracle) == ["alpha", "beta", "m-first", "m-mid", "ticker", "zeta"]


@pytest.mark.parametrize("accept", ["application/json", TABLE])
async def test_a_list_in_pages_from_the_hub_is_the_apiservers_list_at_one_revision(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, accept: str
) -> None:
    """kubectl's chunked LIST (limit, then continue) answered by the hub: page 1 once current,
    then pages from its snapshot. Together they are kube-apiserver's own list at page 1's
    revision, while the collection keeps changing. The tokens are the apiserver's: it continues
    one of ours itself, and one of its own sent through watchproxy goes to it."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    headers = {"Accept": accept}
    for i in range(8):
        await direct.ok("POST", cms, body=configmap(f"c{i}"))

    def as_seen(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in objects]

    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch(f"{cms}?watch=1", headers=headers) as watch,
    ):
        await watch.wait_for(lambda events: len(events) >= 8, what="the configmaps")
        async with ticking(direct, cms, configmap("ticker")):
            first = await via.ok("GET", f"{cms}?limit=3", headers=headers)
        rv = first["metadata"]["resourceVersion"]
        await direct.ok("POST", cms, body=configmap("c9"))  # after page 1: not in its list
        seen, body = list(list_objects(first)), first
        while body["metadata"].get("continue"):
            assert body["metadata"]["remainingItemCount"] > 0
            token = body["metadata"]["continue"]
            body = await via.ok("GET", f"{cms}?limit=3&continue={token}", headers=headers)
            assert body["metadata"]["resourceVersion"] == rv
            seen += list_objects(body)
        ours = first["metadata"]["continue"]
        by_apiserver = await direct.ok("GET", f"{cms}?continue={ours}", headers=headers)
        theirs = await direct.ok("GET", f"{cms}?limit=4", headers=headers)
        rest = await via.ok(
            "GET", f"{cms}?continue={theirs['metadata']['continue']}", headers=headers
        )
        outcomes = list_outcomes(running, "hub", "page", "page-gone")
    at_rv = f"{cms}?resourceVersion={rv}&resourceVersionMatch=Exact"
    exact = await direct.ok("GET", at_rv, headers=headers)
    exact_first = await direct.ok("GET", at_rv + "&limit=3", headers=headers)
    # Page 1 is the apiserver's page 1 at that revision, continue token and count included.
    assert comparable_list(first) == comparable_list(exact_first)
    assert as_seen(seen) == as_seen(list_objects(exact))
    assert [name for name, _ in as_seen(seen)] == [*(f"c{i}" for i in range(8)), "ticker"]
    assert as_seen(list_objects(by_apiserver)) == as_seen(seen[3:])
    assert [name for name, _ in as_seen(list_objects(rest))] == [
        *(f"c{i}" for i in range(4, 8)),
        "c9",
        "ticker",
    ]
    assert outcomes == {"hub": 1, "page": 2, "page-gone": 1}


@pytest.mark.parametrize(
    ("accept", "output"), [("application/json", ("-o", "name")), (KUBECTL_TABLE, ())]
)
async def test_kubectl_get_in_chunks_is_paged_by_the_hub_as_by_the_apiserver(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    accept: str,
    output: tuple[str, ...],
) -> None:
    """``kubectl get --chunk-size=3`` (its default is 500) through watchproxy prints what it
    prints directly, every page answered by the hub, while a watch of the same representation
    (an informer, ``kubectl get -w``) keeps the shared watch open."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(8):
        await direct.ok("POST", cms, body=configmap(f"c{i}"))
    command = ("get", "configmaps", "-n", namespace, "--chunk-size=3", *output)
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch(f"{cms}?watch=1", headers={"Accept": accept}) as watch,
    ):
        await watch.wait_for(lambda events: len(events) >= 8, what="the configmaps")
        direct_config = real_apiserver.write_kubeconfig(
            tmp_path / "direct", token=real_apiserver.token
        )
        async with ticking(direct, cms, configmap("ticker")):
            through = await kubectl(running.kubeconfig, *command)
            oracle = await kubectl(direct_config, *command)
        outcomes = list_outcomes(running, "hub", "page")
    assert through[0] == oracle[0] == 0, (through, oracle)

    def printed(stdout: str) -> list[list[str]]:
        rows = [line.split() for line in stdout.splitlines()]
        if rows and rows[0][-1] == "AGE":  # it can turn a second between the two runs
            rows = [row[:-1] for row in rows]
        return rows

    assert printed(through[1]) == printed(oracle[1]) and len(oracle[1].splitlines()) >= 9
    assert outcomes == {"hub": 1, "page": 2}  # 9 configmaps (the ticker too) in pages of 3


async def test_client_go_pager_lists_in_pages_from_the_hub(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """client-go's ListPager (a reflector's relist; protobuf, as typed clients ask) through
    watchproxy: every page from the hub, and the list is the apiserver's at its revision."""
    go = built(build_watchclient)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(7):
        await direct.ok("POST", pods, body=pod(f"p{i}"))
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        protobuf_watch(via, f"{pods}?watch=1") as held,  # the shared watch a relist finds
    ):
        await held.wait(lambda events: len(events) >= 7, "the pods")
        async with ticking(direct, pods, pod("ticker")):
            lister = await asyncio.create_subprocess_exec(
                str(go),
                "--mode=list",
                "--protobuf",
                "--page-size=3",
                f"--namespace={namespace}",
                env={**os.environ, "KUBECONFIG": running.kubeconfig},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            stdout, stderr = await asyncio.wait_for(lister.communicate(), 30)
        outcomes = list_outcomes(running, "hub", "page")
    assert lister.returncode == 0, stderr.decode()[-2000:]
    lines = [json.loads(text) for text in stdout.splitlines()]
    items = [(line["name"], line["resourceVersion"]) for line in lines if line["type"] == "ITEM"]
    [rv] = [line["resourceVersion"] for line in lines if line["type"] == "LISTED"]
    assert items == await exact_items(direct, pods, rv)
    assert [name for name, _ in items] == PODS_AND_TICKER
    assert outcomes == {"hub": 1, "page": 2}  # 8 pods in pages of 3


async def test_kube_rs_watcher_lists_in_pages_from_the_hub(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """kube-rs's ``watcher`` listing consistently (``ListSemantic::MostRecent``, pages of 3)
    through watchproxy: every page from the hub, and what it applies is the apiserver's list."""
    kubewatch = built(build_kubewatch)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(7):
        await direct.ok("POST", pods, body=pod(f"p{i}"))
    argv = [str(kubewatch), "--backoff", "default", "--namespace", namespace]
    argv += ["--page-size", "3", "--list-semantic", "most-recent"]
    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch(f"{pods}?watch=1") as held,  # the shared watch kube-rs's LIST finds
    ):
        await held.wait_for(lambda events: len(events) >= 7, what="the pods")
        env = {**os.environ, "KUBECONFIG": running.kubeconfig}
        client = ClientProcess("kube-rs", argv, env=env, log_path=tmp_path / "kubers.stderr")
        async with ticking(direct, pods, pod("ticker")):
            await client.start()
            try:
                await client.wait_until(
                    lambda ls: any(line["type"] == "InitDone" for line in ls), what="the list"
                )
            finally:
                await client.stop()
        outcomes = list_outcomes(running, "hub", "page")
    applied = [
        (line["name"], line["resourceVersion"])
        for line in client.lines
        if line["type"] == "InitApply"
    ]
    assert [line["type"] for line in client.lines[:1]] == ["Init"], client.report()
    # Nothing else changes in the namespace, so its list at the ticker's revision is the list at
    # the page's revision, whichever it was.
    [ticker_rv] = [rv for name, rv in applied if name == "ticker"]
    assert applied == await exact_items(direct, pods, ticker_rv)
    assert [name for name, _ in applied] == PODS_AND_TICKER
    assert outcomes == {"hub": 1, "page": 2}  # 8 pods in pages of 3


async def test_python_clients_list_in_pages_from_the_hub(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """The official Python client and kubernetes_asyncio paging with ``limit`` and
    ``_continue``, as their users write it, through watchproxy: every page from the hub, and
    the pages together are the apiserver's list at the first page's revision."""
    from kubernetes import client as sync_client
    from kubernetes_asyncio import client as async_client

    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(7):
        await direct.ok("POST", pods, body=pod(f"p{i}"))

    def official(url: str) -> tuple[str, list[tuple[str, str]]]:
        configuration = sync_client.Configuration()
        configuration.host = url
        with sync_client.ApiClient(configuration) as api_client:
            api = sync_client.CoreV1Api(api_client)
            page = api.list_namespaced_pod(namespace, limit=3)
            rv, items = page.metadata.resource_version, list(page.items)
            while page.metadata._continue:
                page = api.list_namespaced_pod(
                    namespace, limit=3, _continue=page.metadata._continue
                )
                items += page.items
        return rv, [(i.metadata.name, i.metadata.resource_version) for i in items]

    async def asyncio_client(url: str) -> tuple[str, list[tuple[str, str]]]:
        configuration = async_client.Configuration()
        configuration.host = url
        async with async_client.ApiClient(configuration) as api_client:
            api = async_client.CoreV1Api(api_client)
            page = await api.list_namespaced_pod(namespace, limit=3)
            rv, items = page.metadata.resource_version, list(page.items)
            while page.metadata._continue:
                token = page.metadata._continue
                page = await api.list_namespaced_pod(namespace, limit=3, _continue=token)
                items += page.items
        return rv, [(i.metadata.name, i.metadata.resource_version) for i in items]

    async with (
        proxy(tmp_path, real_apiserver) as (running, via),
        via.watch(f"{pods}?watch=1") as held,  # the shared watch the LISTs find
    ):
        await held.wait_for(lambda events: len(events) >= 7, what="the pods")
        async with ticking(direct, pods, pod("ticker")):
            listed = [
                await asyncio.to_thread(official, running.url),
                await asyncio_client(running.url),
            ]
        outcomes = list_outcomes(running, "hub", "page")
    for rv, items in listed:
        assert items == await exact_items(direct, pods, rv)
        assert [name for name, _ in items] == PODS_AND_TICKER
    assert outcomes == {"hub": 2, "page": 4}  # 8 pods in pages of 3, twice


@pytest.mark.parametrize("period", [0.05, 1.0], ids=["written-every-50ms", "every-1s"])
async def test_consistent_lists_cost_one_upstream_request_each_but_for_a_watchs_misses(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, period: float
) -> None:
    """60 LISTs, one every 100 ms, of a collection written every ``period`` while another
    resource is written every 50 ms (moving the revision, as leases and events do in a
    cluster). A LIST costs the apiserver one request (its share of a probe, or its own LIST),
    except those that found the watch behind (the probe, then the LIST); after a miss the
    watch is paused, so misses stay few however many LISTs follow. Counted by the apiserver's
    own ``apiserver_request_total`` (issue 43: at most one upstream request per client
    request)."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    for i in range(20):
        await direct.ok("POST", cms, body=configmap(f"c{i:02}"))
    await direct.ok("POST", cms, body=configmap("ticker"))
    stop = asyncio.Event()

    async def write(path: str, every: float) -> None:
        for n in range(100_000):
            if stop.is_set():
                return
            body = {"metadata": {"annotations": {"tick": str(n)}}}
            await direct.ok("PATCH", path, body=body, content_type="application/merge-patch+json")
            await asyncio.sleep(every)

    await direct.ok("POST", secrets, body={"metadata": {"name": "other"}, "type": "Opaque"})
    async with proxy(tmp_path, real_apiserver) as (running, via), via.watch(cms + "?watch=1"):
        metrics = running.proxy.metrics.registry
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: all(w.cache.synced for w in hub.watches.values()), what="synced")
        writers = [
            asyncio.create_task(write(f"{cms}/ticker", period)),
            asyncio.create_task(write(f"{secrets}/other", 0.05)),
        ]
        try:
            await asyncio.sleep(1.0)  # the collection moving (its watch looks busy)
            before = await apiserver_lists(direct, "configmaps")
            for _ in range(60):
                await via.ok("GET", cms)
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.gather(*writers)
        outcomes = {
            name: metrics.get_sample_value("watchproxy_consistent_lists_total", {"outcome": name})
            or 0
            for name in ("hub", "quiet", "behind", "lagging", "probe-failed", "not-watching")
        }
        probes = metrics.get_sample_value("watchproxy_freshness_probes_total") or 0
        served = 0.0
        for _ in range(50):  # the apiserver counts a request a moment after answering it
            served = await apiserver_lists(direct, "configmaps") - before
            if served >= 60:
                break
            await asyncio.sleep(0.1)
        print(f"written every {period}s: 60 LISTs cost the apiserver {served:.0f} requests "
              f"({probes:.0f} probes); {outcomes}")  # fmt: skip
        assert sum(outcomes.values()) == 60, outcomes
        # One request per LIST, and one more per miss.
        assert served == 60 + outcomes["behind"], (served, outcomes)
        # A miss pauses the watch (1 s, doubled while misses follow, until it answers one):
        # a few misses in 6 s whatever the rate. Before: every 1 s, 30 of the 60 LISTs missed
        # (60 probes + 30 LISTs = 90 requests); now about 6 (11 probes + 55 LISTs = 66).
        assert outcomes["behind"] <= 12, outcomes
