"""Identical consistent LISTs through watchproxy against the real kube-apiserver: each sees every
write that finished before it was sent, and the apiserver's own request counter shows how many
LISTs it served (issue 16, part 2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_apiserver import configmap, proxy


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
    for i in range(20):
        await direct.ok("POST", cms, body=configmap(f"c{i:02}"))
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
        assert batches is not None and batches <= 10, batches  # not 60
