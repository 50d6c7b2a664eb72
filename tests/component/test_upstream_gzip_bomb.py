"""A compressed upstream answer cannot make the hub hold more than a bound once inflated.

gzip expands up to about 1,000 times: a 128 KiB piece of a body may hold 128 MiB. The hub
decodes what it asked for itself (``upstream/bodies.py``), so it bounds the inflation: at most
``DECODED_PIECE_BYTES`` per decompress call (a watch line over ``upstream.max_event_bytes``
then fails as an upstream error and the watch resumes with back-off), and a LIST page at most
``hub.cache_max_bytes`` in all (a page that could not be cached is not shared: the key is
passed through). A scripted apiserver on a real socket serves the bombs; tracemalloc measures
the peak of what Python allocated meanwhile, the proxy running in this process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.harness import proxy_for_upstream, wait_for
from tests.scriptedapi import ScriptedApiServer

pytestmark = pytest.mark.timeout(90, func_only=True)

CMS = "/api/v1/namespaces/default/configmaps"
LIST_RV = 100
EVENTS = 10
BOMB_BYTES = 128 * 1024 * 1024  # inflated size of each bomb
MIB = 1024 * 1024
OVERRIDES: dict[str, Any] = {
    "backoff.initial_seconds": 0.05,
    "backoff.max_seconds": 0.2,
    "backoff.jitter": "none",
    "upstream.max_event_bytes": MIB,
}


def gzip_pieces(head: bytes, filler: bytes, size: int, tail: bytes) -> Iterator[bytes]:
    """One gzip member of head + ``size`` bytes of ``filler`` + tail, compressed as it goes
    (never held inflated here either)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    yield compressor.compress(head)
    block = filler * (MIB // len(filler))
    for _ in range(size // len(block)):
        piece = compressor.compress(block)
        if piece:
            yield piece
    yield compressor.compress(tail) + compressor.flush()


def event(i: int) -> bytes:
    obj = {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": f"cm-{i}", "namespace": "default", "resourceVersion": str(i)},
        "data": {"i": str(i)},
    }
    return json.dumps({"type": "ADDED", "object": obj}, separators=(",", ":")).encode() + b"\n"


class BombingApiServer(ScriptedApiServer):
    """Answers LISTs with an empty ConfigMapList at ``LIST_RV`` (``list_bomb``: inflated past
    ``BOMB_BYTES`` with JSON whitespace, still a valid list) and WATCHes with events
    LIST_RV+1 .. LIST_RV+EVENTS, except that the first watch from the hub gets a bomb of
    ``x`` bytes without a newline when ``watch_bomb`` is set."""

    def __init__(self, *, list_bomb: bool, watch_bomb: bool) -> None:
        super().__init__()
        self.list_bomb, self.watch_bomb = list_bomb, watch_bomb
        self.requests: list[tuple[str, str]] = []  # (verb, User-Agent)
        self.bombs_sent = 0

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get(CMS, self._configmaps)

    async def _gzip_stream(
        self, request: web.Request, pieces: Iterator[bytes]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
        await response.write_eof()
        self.bombs_sent += 1
        return response

    async def _configmaps(self, request: web.Request) -> web.StreamResponse:
        agent = request.headers.get("User-Agent", "")
        watch = request.query.get("watch") in ("1", "true")
        self.requests.append(("watch" if watch else "list", agent))
        if not watch:
            head = (
                b'{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"'
                + str(LIST_RV).encode()
                + b'"},"items":[]'
            )
            if self.list_bomb and "gzip" in request.headers.get("Accept-Encoding", ""):
                return await self._gzip_stream(request, gzip_pieces(head, b" ", BOMB_BYTES, b"}"))
            return web.Response(body=head + b"}", content_type="application/json")
        if self.watch_bomb and agent == "watchproxy" and self.bombs_sent == 0:
            return await self._gzip_stream(request, gzip_pieces(b"", b"x", BOMB_BYTES, b""))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        start = int(request.query.get("resourceVersion") or 0) + 1
        for i in range(start, LIST_RV + EVENTS + 1):
            await response.write(event(i))
        await self.done.wait()
        return response


async def watch_events(url: str) -> list[int]:
    """The resourceVersions of the first EVENTS events of a watch from LIST_RV."""
    rvs: list[int] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}{CMS}?watch=1&resourceVersion={LIST_RV}") as response,
    ):
        assert response.status == 200, await response.text()
        async for line in response.content:
            if line.strip():
                rvs.append(int(json.loads(line)["object"]["metadata"]["resourceVersion"]))
                if len(rvs) == EVENTS:
                    return rvs
    return rvs


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


async def test_a_gzip_bomb_in_a_watch_breaks_it_with_bounded_memory_and_it_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, traced: None
) -> None:
    async with BombingApiServer(list_bomb=False, watch_bomb=True) as api:
        with caplog.at_level(logging.WARNING, logger="watchproxy"):
            async with proxy_for_upstream(tmp_path, api.kubeconfig(tmp_path), OVERRIDES) as up:
                tracemalloc.reset_peak()
                rvs = await asyncio.wait_for(watch_events(up.url), 60)
                peak = tracemalloc.get_traced_memory()[1]
    print(f"watch bomb of {BOMB_BYTES // MIB} MiB inflated: peak traced {peak / MIB:.1f} MiB")
    assert api.bombs_sent == 1
    # The client behind the hub got every event once, from the resumed watch.
    assert rvs == list(range(LIST_RV + 1, LIST_RV + EVENTS + 1))
    assert [verb for verb, agent in api.requests if agent == "watchproxy"].count("watch") == 2
    broke = [r.getMessage() for r in caplog.records if "stream broke" in r.getMessage()]
    assert broke and "exceeds the limit" in broke[0], broke
    # One event line's limit (1 MiB) and a few decoded pieces, not the bomb.
    assert peak < 24 * MIB, f"peak {peak / MIB:.1f} MiB while inflating a watch bomb"


async def test_a_gzip_bomb_as_a_list_page_is_not_shared_and_memory_stays_bounded(
    tmp_path: Path, traced: None
) -> None:
    overrides = {**OVERRIDES, "hub.cache_max_bytes": 4 * MIB}
    async with (
        BombingApiServer(list_bomb=True, watch_bomb=False) as api,
        proxy_for_upstream(tmp_path, api.kubeconfig(tmp_path), overrides) as up,
    ):
        tracemalloc.reset_peak()
        rvs = await asyncio.wait_for(watch_events(up.url), 60)
        peak = tracemalloc.get_traced_memory()[1]
        await wait_for(lambda: api.bombs_sent == 1, what="the bomb to be written")
    print(f"list bomb of {BOMB_BYTES // MIB} MiB inflated: peak traced {peak / MIB:.1f} MiB")
    assert rvs == list(range(LIST_RV + 1, LIST_RV + EVENTS + 1))
    # The hub's LIST inflated past the cache budget: the key is not shared, the client's watch
    # went to the apiserver as it was sent (its own User-Agent), the hub never watched.
    hub = [verb for verb, agent in api.requests if agent == "watchproxy"]
    assert hub == ["list"], api.requests
    assert [verb for verb, agent in api.requests if agent != "watchproxy"] == ["watch"]
    assert peak < 4 * MIB + 24 * MIB, f"peak {peak / MIB:.1f} MiB while inflating a list bomb"
