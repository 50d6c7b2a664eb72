"""What the hub holds while it syncs a big collection is bounded by construction (issue 43,
item 1): the collection's objects once, as the cache keeps them, plus a bounded amount in
flight, whatever the path of the sync: a watch-list's initial events (firstsync.py), LIST
pages (an apiserver that refuses watch-lists), a relist after a 410. Never the upstream body,
its parsed objects and their encoded lines all at once; two keys synced at once fit the cache
budget together; pages parsed whole (not plain JSON) are asked for by size.

The load is the real-node memory test's (tests/realnode/test_sidecar_memory.py): ConfigMaps
of 900 KiB (random, as compression cannot shrink them), 64 MiB of JSON, watched by four
clients at the same moment, three of them reading at 16 MiB/s through small socket buffers. A
scripted apiserver on a real socket serves them from bytes encoded before the measure starts;
tracemalloc measures the peak of what Python allocated meanwhile, the proxy running in this
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import tracemalloc
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.harness import proxy_for_upstream, running_proxy, wait_for
from tests.scriptedapi import ScriptedApiServer
from watchproxy.hub.fetcher import FIRST_WHOLE_PAGE_SIZE, LIST_PAGE_SIZE

pytestmark = pytest.mark.timeout(120, func_only=True)

MIB = 1024 * 1024
CMS = "/api/v1/namespaces/default/configmaps"
OBJECT_BYTES = 900 * 1024
COLLECTION_BYTES = 64 * MIB
SLOW = 16 * MIB  # bytes/s
NAME_PREFIX = b'"name":"big-'
# What the hub may hold beyond the cache's own bytes while it syncs: a few pieces of the
# upstream body and the object being parsed (each under a MiB here), and the proxy's own
# small allocations; not a second copy of the collection (64 MiB).
IN_FLIGHT_BOUND = 24 * MIB


class BigCollectionApiServer(ScriptedApiServer):
    """An apiserver of one collection of big ConfigMaps, encoded once: LISTs honour ``limit``
    and ``continue``; a watch-list (``sendInitialEvents=true``) sends every object then the
    initial-events-end bookmark, or is refused with a 422 (``watch_lists`` False, as with the
    WatchList gate off); any watch then stays open and quiet."""

    def __init__(
        self,
        *,
        watch_lists: bool,
        object_bytes: int = OBJECT_BYTES,
        collection_bytes: int = COLLECTION_BYTES,
    ) -> None:
        super().__init__()
        self.watch_lists = watch_lists
        count = -(-collection_bytes // object_bytes)
        self.count = count
        self.rv = str(count + 1)
        self.items: list[bytes] = []
        self.events: list[bytes] = []
        for i in range(count):
            item = json.dumps(
                {
                    "metadata": {
                        "name": f"big-{i:03}",
                        "namespace": "default",
                        "resourceVersion": str(i + 1),
                    },
                    "data": {"blob": os.urandom(object_bytes // 2).hex()},
                },
                separators=(",", ":"),
            ).encode()
            self.items.append(item)
            self.events.append(
                b'{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1",'
                + item[1:]
                + b"}\n"
            )
        self.hub_requests: list[str] = []  # the query strings of the hub's requests
        self.done = asyncio.Event()
        self.expire = asyncio.Event()  # set: open watches from a resourceVersion end in a 410
        self.url = ""
        self._runner: web.AppRunner | None = None

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/v1/namespaces/{namespace}/configmaps", self._configmaps)

    def _status(self, code: int, reason: str) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
        return web.json_response({**body, "reason": reason}, status=code)

    async def _stream(self, request: web.Request, pieces: Iterator[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
        return response

    def _page(self, start: int, limit: int) -> Iterator[bytes]:
        end = len(self.items) if limit <= 0 else min(len(self.items), start + limit)
        meta: dict[str, Any] = {"resourceVersion": self.rv}
        if end < len(self.items):
            meta["continue"] = str(end)
            meta["remainingItemCount"] = len(self.items) - end
        head = json.dumps({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta})
        yield head[:-1].encode() + b',"items":['
        for index in range(start, end):
            if index > start:
                yield b","
            yield self.items[index]
        yield b"]}"

    async def _configmaps(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        if request.headers.get("User-Agent", "").startswith("watchproxy"):
            self.hub_requests.append(request.query_string)
        if query.get("watch") not in ("1", "true"):
            start = int(query.get("continue") or 0)
            return await self._stream(request, self._page(start, int(query.get("limit") or 0)))
        if query.get("sendInitialEvents") == "true":
            if not self.watch_lists:
                return self._status(422, "Invalid")
            if query.get("fieldSelector"):  # the hub asks whether watch-lists are served
                return self._status(400, "BadRequest")
            bookmark = json.dumps(
                {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": "ConfigMap",
                        "apiVersion": "v1",
                        "metadata": {
                            "resourceVersion": self.rv,
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                },
                separators=(",", ":"),
            ).encode()
            response = await self._stream(request, iter([*self.events, bookmark + b"\n"]))
        else:
            response = await self._stream(request, iter(()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(float(query.get("timeoutSeconds") or 600)):
                waits = [asyncio.ensure_future(e.wait()) for e in (self.done, self.expire)]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for wait in waits:
                        wait.cancel()
        if self.expire.is_set() and query.get("resourceVersion") and not self.done.is_set():
            self.expire.clear()  # (the next watch, from the relist, stays)
            expired = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410}
            await response.write(json.dumps({"type": "ERROR", "object": expired}).encode() + b"\n")
        return response


async def watch_until_synced(port: int, objects: int, rate: float, path: str = CMS) -> None:
    """One watch of the collection from now through a small socket buffer, read at ``rate``
    bytes/s (0: at once) until it has delivered every object."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 128 * 1024)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(
            sock,
            f"GET {path}?watch=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n"
            .encode(),
        )  # fmt: skip
        began = time.monotonic()
        read = names = 0
        carry = b""
        while names < objects:
            piece = await loop.sock_recv(sock, 64 * 1024)
            assert piece, f"the watch ended after {names} of {objects} objects"
            if not read:
                assert piece.startswith(b"HTTP/1.1 200 "), piece[:200]
            read += len(piece)
            data = carry + piece
            names += data.count(NAME_PREFIX)
            carry = data[-(len(NAME_PREFIX) - 1) :]
            if rate:
                # Paced: the client reads no faster than ``rate``.
                ahead = began + read / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        assert names == objects, names
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def traced() -> AsyncIterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("watch_lists", "object_bytes", "collection_bytes", "rates"),
    [
        # The real-node test's load: the first client (relayed the watch-list) reads at once.
        (True, OBJECT_BYTES, COLLECTION_BYTES, [0, SLOW, SLOW, SLOW]),
        # An apiserver that refuses watch-lists: the hub lists in pages of 500 objects (here
        # one page, the whole collection).
        (False, OBJECT_BYTES, COLLECTION_BYTES, [0, SLOW, SLOW, SLOW]),
        # Small objects (a run of the watch-list holds many lines), and a first client that
        # takes longer than the hub waits for it (RELAY_WRITE_SECONDS) before it builds its
        # state: what the client is relayed and what the state keeps are the same bytes.
        (True, 3 * 1024, 32 * MIB, [3 * MIB, 0, 0, 0]),
    ],
    ids=["watch-list", "pages", "watch-list-small-objects-slow-first-client"],
)
async def test_the_hub_syncs_a_big_collection_for_slow_watchers_holding_it_once(
    tmp_path: Path, watch_lists: bool, object_bytes: int, collection_bytes: int, rates: list[int]
) -> None:
    async with (
        BigCollectionApiServer(
            watch_lists=watch_lists, object_bytes=object_bytes, collection_bytes=collection_bytes
        ) as api,
        proxy_for_upstream(tmp_path, api.kubeconfig(tmp_path)) as up,
    ):
        port = up.proxy.api_port
        hub = up.proxy.hub
        assert hub is not None
        async with traced():
            tracemalloc.reset_peak()
            first, *others = [watch_until_synced(port, api.count, rate) for rate in rates]
            first_task = asyncio.ensure_future(first)
            # The first to ask is the one relayed the watch-list.
            await wait_for(lambda: len(api.hub_requests) > 0, what="the hub's first request")
            await asyncio.wait_for(asyncio.gather(first_task, *others), 90)
            peak = tracemalloc.get_traced_memory()[1]
            (shared,) = hub.watches.values()
            cached = shared.cache.state.bytes
        hub_requests = list(api.hub_requests)
    print(
        f"{'watch-list' if watch_lists else 'pages'}: collection "
        f"{sum(map(len, api.items)) / MIB:.1f} MiB in {api.count} objects, cached "
        f"{cached / MIB:.1f} MiB, peak traced {peak / MIB:.1f} MiB, hub requests {hub_requests}"
    )
    assert peak < cached + IN_FLIGHT_BOUND, (
        f"peak {peak / MIB:.1f} MiB for {cached / MIB:.1f} MiB cached"
    )


async def test_a_relist_of_a_big_collection_holds_its_unchanged_objects_once(
    tmp_path: Path,
) -> None:
    """The shared watch expires (410) and the hub lists the collection again: the objects
    that did not change are kept once, not as the cache's copy and the relist's."""
    async with (
        BigCollectionApiServer(watch_lists=True) as api,
        proxy_for_upstream(tmp_path, api.kubeconfig(tmp_path)) as up,
    ):
        hub = up.proxy.hub
        assert hub is not None
        # A client that keeps the key shared through the relist.
        watcher = asyncio.ensure_future(watch_until_synced(up.proxy.api_port, api.count + 1, 0))
        try:
            await wait_for(
                lambda: any(w.cache.synced for w in hub.watches.values()), what="the sync"
            )
            (shared,) = hub.watches.values()
            async with traced():
                tracemalloc.reset_peak()
                lists = sum(1 for q in api.hub_requests if "limit=500" in q)
                api.expire.set()
                await wait_for(
                    lambda: (
                        shared.machine.counters.relists == 1
                        and shared.cache.synced
                        and sum(1 for q in api.hub_requests if "limit=500" in q) == lists + 1
                        and api.hub_requests[-1].startswith("watch=true")
                    ),
                    what="the relist",
                    timeout=60,
                )
                peak = tracemalloc.get_traced_memory()[1]
                cached = shared.cache.state.bytes
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    print(f"relist: cached {cached / MIB:.1f} MiB, peak traced {peak / MIB:.1f} MiB")
    assert peak < IN_FLIGHT_BOUND, f"peak {peak / MIB:.1f} MiB relisting {cached / MIB:.1f} MiB"


async def test_two_keys_whose_first_syncs_run_at_once_fit_the_cache_budget_together(
    tmp_path: Path,
) -> None:
    """Two collections of 40 MiB synced at the same moment under a cache budget of 64 MiB:
    each would fit alone, not both. One is cached, the other is passed through to its client
    (the rest of its watch-list); each client gets its whole collection."""
    budget = 64 * MIB
    overrides = {"hub.cache_max_bytes": budget}
    async with (
        BigCollectionApiServer(watch_lists=True, collection_bytes=40 * MIB) as api,
        proxy_for_upstream(tmp_path, api.kubeconfig(tmp_path), overrides) as up,
    ):
        hub = up.proxy.hub
        assert hub is not None
        port = up.proxy.api_port
        most = 0

        async def cached() -> None:
            nonlocal most
            while True:
                most = max(most, hub.cache_bytes())
                await asyncio.sleep(0.01)  # sampled while the syncs run

        sampler = asyncio.ensure_future(cached())
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    *(
                        watch_until_synced(
                            port, api.count, 0, f"/api/v1/namespaces/{ns}/configmaps"
                        )
                        for ns in ("one", "two")
                    )
                ),
                60,
            )
            await wait_for(lambda: hub.cache_bytes() > 0, what="one key cached")
            most = max(most, hub.cache_bytes())
        finally:
            sampler.cancel()
    print(
        f"two keys of {sum(map(len, api.items)) / MIB:.1f} MiB: at most {most / MIB:.1f} MiB cached"
    )
    assert 0 < most <= budget, most


@pytest.mark.parametrize(
    ("accept", "query", "objects_per_page"),
    [
        # Table rows with whole objects of 100 KB: pages of about WHOLE_PAGE_BYTES.
        ("application/json;as=Table;v=v1;g=meta.k8s.io", "&includeObject=Object", 41),
        # Metadata only (small, whatever the object's size): pages of LIST_PAGE_SIZE.
        ("application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io", "", LIST_PAGE_SIZE),
    ],
    ids=["table-of-objects", "metadata"],
)
async def test_pages_read_whole_are_asked_for_by_the_size_of_their_objects(
    tmp_path: Path, accept: str, query: str, objects_per_page: int
) -> None:
    """A representation parsed whole (not plain JSON) is listed in pages that hold about
    WHOLE_PAGE_BYTES: the first of FIRST_WHOLE_PAGE_SIZE objects, the next ones sized from the
    pages before; every client gets every object."""
    count = 150
    async with running_proxy(tmp_path) as running:
        for i in range(count):
            obj = {"metadata": {"name": f"big-{i:03}"}, "data": {"blob": "x" * 100_000}}
            running.fake.store.create("configmaps", "default", obj)
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"{running.url}{CMS}?watch=1{query}", headers={"Accept": accept}
            ) as response,
        ):
            assert response.status == 200, await response.text()
            names = 0
            async with asyncio.timeout(30):
                async for line in response.content:
                    names += line.count(NAME_PREFIX)
                    if names >= count:
                        break
        limits = [
            urllib.parse.parse_qs(r.query_string).get("limit", [""])[0]
            for r in running.fake.stats.requests
            if r.path == CMS and not r.watch and "as=" in r.headers.get("Accept", "")
        ]
    assert names == count
    assert limits[0] == str(FIRST_WHOLE_PAGE_SIZE), limits
    assert {int(limit) for limit in limits[1:]} == {objects_per_page}, limits
