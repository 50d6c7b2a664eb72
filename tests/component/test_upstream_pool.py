"""One-shot requests ride pooled keep-alive connections (watchproxy/upstream/pool.py).

Pinned here: a busy client's requests reuse one upstream connection instead of dialing each
time; an idle pooled connection the network killed costs the next request nothing; a request
that was sent on a reused connection the apiserver closed at that moment is sent once more when
it is idempotent, and never when it is not.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.faultproxy import faulty_upstream

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def dials(proxy: Any) -> float:
    return float(proxy.metrics.upstream_connection_attempts._value.get())


async def test_sequential_requests_share_one_upstream_connection(tmp_path: Any) -> None:
    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        proxy = f.running.proxy
        before_dials, before_links = dials(proxy), f.faults.counts.by_mode["pass"]
        for i in range(50):
            body = json.dumps({"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}})
            async with session.post(
                f.running.url + CONFIGMAPS,
                data=body,
                headers={"Content-Type": "application/json"},
            ) as created:
                assert created.status == 201, await created.text()
            async with session.get(f"{f.running.url}{CONFIGMAPS}/cm-{i}") as got:
                assert (await got.json())["data"] == {"i": str(i)}
        # The probe's connection may be the one reused; at most one more is dialed.
        assert dials(proxy) - before_dials <= 1
        assert f.faults.counts.by_mode["pass"] - before_links <= 1


async def test_a_pooled_connection_reset_while_idle_costs_the_next_request_nothing(
    tmp_path: Any,
) -> None:
    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        for _ in range(5):
            async with session.get(f.running.url + CONFIGMAPS) as listed:
                assert listed.status == 200
            assert f.faults.reset_all() >= 1  # every idle upstream connection gets an RST
            async with session.get(f.running.url + CONFIGMAPS) as again:
                assert again.status == 200, await again.text()
        assert f.running.proxy.connectivity.up
