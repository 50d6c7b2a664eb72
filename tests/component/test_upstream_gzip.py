"""The shared watch reads gzip bodies completely, whatever aiohttp version is installed.

kube-apiserver 1.37 compresses a watch-list for a client that sends ``Accept-Encoding: gzip``,
one gzip member per flush; aiohttp before 3.14 decoded only the first member and from 3.14.4
refuses more than 1,024 in one decompress call. watchproxy asks for gzip on its shared LIST and
WATCH and decodes the body itself (``upstream/bodies.py``). Here a scripted apiserver on a real
socket answers the hub's WATCH with 2,500 members in one write (one socket read for the
proxy, up to its 256 KiB read buffer), then a member cut in half and a clean end of the body:
the proxy must take every complete member, report the truncation as an upstream error, and
resume from the last event it read, so the client behind it gets every event once, in order.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.harness import proxy_for_upstream
from tests.scriptedapi import ScriptedApiServer

pytestmark = pytest.mark.timeout(60, func_only=True)

CMS = "/api/v1/namespaces/default/configmaps"
LIST_RV = 100
FIRST = 2500  # events in the first watch body, in one write
SECOND = 100  # events after the resume
OVERRIDES: dict[str, Any] = {
    "backoff.initial_seconds": 0.05,
    "backoff.max_seconds": 0.2,
    "backoff.jitter": "none",
}


def event(i: int) -> bytes:
    obj = {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": f"cm-{i}", "namespace": "default", "resourceVersion": str(i)},
        "data": {"i": str(i)},
    }
    return json.dumps({"type": "ADDED", "object": obj}, separators=(",", ":")).encode() + b"\n"


class GzipApiServer(ScriptedApiServer):
    """Answers the hub's LIST with an empty list at ``LIST_RV`` and its WATCHes from a script:
    the first gets events LIST_RV+1 .. LIST_RV+FIRST as gzip members in one write and then
    half of the next member; a resume gets the rest, one member per event, and stays open."""

    def __init__(self) -> None:
        super().__init__()
        self.watches: list[tuple[str | None, str]] = []  # (resourceVersion, Accept-Encoding)
        self.lists_accept_encoding: list[str] = []
        self.first_body = b""  # the first watch's body, as it was written

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get(CMS, self._configmaps)

    async def _configmaps(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") not in ("1", "true"):
            self.lists_accept_encoding.append(request.headers.get("Accept-Encoding", ""))
            body = {
                "kind": "ConfigMapList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(LIST_RV)},
                "items": [],
            }
            return web.json_response(body)
        rv = request.query.get("resourceVersion")
        self.watches.append((rv, request.headers.get("Accept-Encoding", "")))
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
                "Vary": "Accept-Encoding",
            }
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        if len(self.watches) == 1:
            first = range(LIST_RV + 1, LIST_RV + FIRST + 1)
            members = b"".join(gzip.compress(event(i)) for i in first)
            await response.write(members)
            cut = gzip.compress(event(LIST_RV + FIRST + 1))
            await response.write(cut[: len(cut) // 2])
            self.first_body = members + cut[: len(cut) // 2]
            await response.write_eof()  # a clean end of the chunked body inside a member
            return response
        start = int(rv or 0) + 1
        for i in range(start, LIST_RV + FIRST + SECOND + 1):
            await response.write(gzip.compress(event(i)))
        await self.done.wait()
        return response


async def watch_events(url: str, count: int) -> AsyncIterator[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}{CMS}?watch=1&resourceVersion={LIST_RV}") as response,
    ):
        assert response.status == 200, await response.text()
        assert "Content-Encoding" not in response.headers  # the client did not ask for gzip
        seen = 0
        async for line in response.content:
            if line.strip():
                yield json.loads(line)
                seen += 1
                if seen == count:
                    return


async def test_thousands_of_gzip_members_in_one_read_and_a_truncated_one_lose_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    total = FIRST + SECOND
    async with GzipApiServer() as api:
        kubeconfig = api.kubeconfig(tmp_path)
        with caplog.at_level(logging.WARNING, logger="watchproxy"):
            async with proxy_for_upstream(tmp_path, kubeconfig, OVERRIDES) as running:
                base = f"http://127.0.0.1:{running.proxy.api_port}"
                got: list[dict[str, Any]] = []
                try:
                    async with asyncio.timeout(20):
                        async for one in watch_events(base, total):
                            got.append(one)
                except TimeoutError:
                    pytest.fail(f"the client got {len(got)} of {total} events in 20 s")
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
    assert rvs == list(range(LIST_RV + 1, LIST_RV + total + 1)), (rvs[:3], rvs[-3:], len(rvs))
    assert {e["type"] for e in got} == {"ADDED"}
    # The hub asked for gzip, took all 2,500 members of the first body, and resumed from the
    # last event it had read: nothing lost, nothing repeated.
    assert api.lists_accept_encoding and all("gzip" in a for a in api.lists_accept_encoding)
    assert [ae for _, ae in api.watches] == ["gzip", "gzip"]
    assert [rv for rv, _ in api.watches] == [str(LIST_RV), str(LIST_RV + FIRST)]
    broke = [r.getMessage() for r in caplog.records if "stream broke" in r.getMessage()]
    assert broke, "the truncated member was not reported"
    assert "gzip body truncated inside member 2501" in broke[0], broke


async def test_passthrough_keeps_a_gzip_watch_byte_for_byte(tmp_path: Path) -> None:
    """With the hub off, a gzip watch body reaches the client as the apiserver wrote it:
    its Content-Encoding and Vary, every member, even the one cut in half (not decoded)."""
    async with GzipApiServer() as api:
        kubeconfig = api.kubeconfig(tmp_path)
        overrides = {**OVERRIDES, "hub.enabled": False}
        async with (
            proxy_for_upstream(tmp_path, kubeconfig, overrides) as running,
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.get(
                f"{running.url}{CMS}?watch=1&resourceVersion={LIST_RV}",
                headers={"Accept-Encoding": "gzip"},
            ) as response,
        ):
            assert response.status == 200
            body = await asyncio.wait_for(response.read(), 20)
    assert response.headers.get("Content-Encoding") == "gzip"
    assert response.headers.get("Vary") == "Accept-Encoding"
    assert [ae for _, ae in api.watches] == ["gzip"]  # the client's own Accept-Encoding
    assert body == api.first_body
