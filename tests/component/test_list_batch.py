"""Identical consistent LISTs share one upstream LIST, and each still sees its own writes.

The fake apiserver holds LISTs at a gate the test opens (``faults.hold_lists``), so which
requests are in flight upstream is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.component.test_pitfalls import pod
from tests.harness import running_proxy, wait_for

PODS = "/api/v1/namespaces/default/pods"


def names(body: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


async def test_lists_arriving_during_one_share_the_next_and_see_every_earlier_write(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        fake, metrics = running.fake, running.proxy.metrics.registry
        fake.store.create("pods", "default", pod("before"))

        async def list_pods() -> dict[str, Any]:
            async with session.get(running.url + PODS) as response:
                assert response.status == 200, await response.text()
                body: dict[str, Any] = await response.json()
                return body

        fake.faults.hold_lists(True)
        first = asyncio.ensure_future(list_pods())
        await wait_for(lambda: fake.faults.lists_held == 1, what="the first LIST upstream")
        # Written after the first LIST was sent: the requests below arrive after the write,
        # so their answer must include it although the first one's may not.
        fake.store.create("pods", "default", pod("after"))
        later = [asyncio.ensure_future(list_pods()) for _ in range(20)]
        await wait_for(
            lambda: (
                metrics.get_sample_value("watchproxy_requests_in_flight", {"kind": "request"}) == 21
            ),
            what="all 21 LISTs in watchproxy",
        )
        fake.faults.hold_lists(False)
        answers = await asyncio.gather(first, *later)
        assert all(names(body) == ["after", "before"] for body in answers[1:])
        assert "before" in names(answers[0])
        upstream = [r for r in fake.stats.requests if r.path == PODS and not r.watch]
        assert len(upstream) == 2  # the first, then one for the 20 that waited
        assert metrics.get_sample_value("watchproxy_list_batches_total") == 2
        assert metrics.get_sample_value("watchproxy_lists_batched_total") == 21


async def test_lists_that_differ_in_what_they_ask_are_not_batched(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        fake = running.fake
        fake.store.create("pods", "default", pod("a", app="web"))
        fake.store.create("pods", "default", pod("b", app="db"))
        fake.faults.hold_lists(True)
        urls = [PODS, PODS + "?labelSelector=app%3Dweb", PODS + "?limit=1"]
        calls = [asyncio.ensure_future(session.get(running.url + url)) for url in urls]
        await wait_for(lambda: fake.faults.lists_held == 3, what="three distinct LISTs upstream")
        fake.faults.hold_lists(False)
        bodies = []
        for call in calls:
            async with await call as response:
                bodies.append(await response.json())
        assert [names(b) for b in bodies] == [["a", "b"], ["a"], ["a"]]
        assert bodies[2]["metadata"]["continue"]
