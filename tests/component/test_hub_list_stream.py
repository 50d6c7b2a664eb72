"""LISTs answered from the hub's cache are written in pieces encoded from the cached objects as
the client reads, never assembled into one body per request (issue 43, item 1).

Each test keeps a client watch open on the configmaps so that the key has a synced shared watch,
then lists with ``resourceVersion=0`` (served from the cache) over raw sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.component.test_http_protocol import Conn, request
from tests.harness import Running, running_proxy, wait_for

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


# The representations the fake serves (protobuf: tests/realapi/test_protobuf.py).
ACCEPT = {
    "json": "application/json",
    "table": "application/json;as=Table;g=meta.k8s.io;v=v1",
    # (What the hub serves a LIST from: a metadata client's as=PartialObjectMetadataList LIST
    # is passed through.)
    "partial": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
}


def fill(running: Running, count: int, size: int) -> None:
    """ConfigMaps of about ``size`` bytes each, most of it in an annotation: a Table's rows
    and PartialObjectMetadata carry the metadata only."""
    for i in range(count):
        obj = {
            "metadata": {"name": f"cm-{i:03}", "annotations": {"a": "y" * size}},
            "data": {"v": "x"},
        }
        running.fake.store.create("configmaps", "default", obj)


def upstream_lists(running: Running) -> int:
    return sum(1 for r in running.fake.stats.requests if r.path == CONFIGMAPS and not r.watch)


@contextlib.asynccontextmanager
async def watching(
    running: Running, session: aiohttp.ClientSession, accept: str = ACCEPT["json"]
) -> AsyncIterator[Any]:
    """A client watch on the configmaps; yields the key's shared watch once it is synced."""
    stop = asyncio.Event()

    async def watch() -> None:
        headers = {"Accept": accept}
        async with session.get(running.url + CONFIGMAPS + "?watch=1", headers=headers) as response:
            assert response.status == 200
            while not stop.is_set() and await response.content.readline():
                pass

    task = asyncio.create_task(watch())
    hub = running.proxy.hub
    assert hub is not None
    try:
        await wait_for(
            lambda: any(w.cache.synced for w in hub.watches.values()), what="a synced watch"
        )
        (shared,) = hub.watches.values()
        yield shared
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("connection", ["keep-alive", "close"], ids=["keep-alive", "close"])
async def test_a_large_list_from_the_cache_is_streamed_as_the_state_it_was_answered_at(
    tmp_path: Any, connection: str
) -> None:
    """The body is chunked (no Content-Length: it was never one bytes object), equal byte for
    byte to the whole encoding of the state when the LIST was answered, even though objects
    change while the client is still reading it; and no LIST went upstream for it."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        fill(running, 60, 20_000)  # about 1.2 MB: several pieces
        async with watching(running, session) as shared:
            expected = shared.cache.list_response()
            lists_before = upstream_lists(running)
            conn = await Conn.open(running.proxy.api_port)
            conn.send(request("GET", CONFIGMAPS + "?resourceVersion=0", Connection=connection))
            status_line = await conn.reader.readline()
            assert status_line.startswith(b"HTTP/1.1 200"), status_line
            # Changed while the answer is being written: the answer is the state it began at.
            for i in range(5):
                running.fake.store.delete("configmaps", "default", f"cm-{i:03}")
            await wait_for(lambda: len(shared.cache) == 55, what="the deletes in the hub")
            headers = b""
            while (line := await conn.reader.readline()) != b"\r\n":
                headers += line.lower()
            assert b"transfer-encoding: chunked" in headers and b"content-length" not in headers
            parts = []
            while size := int((await conn.reader.readline()).strip(), 16):
                parts.append(await conn.reader.readexactly(size))
                await conn.reader.readexactly(2)
            conn.close()
            body = b"".join(parts)
            assert body == expected
            assert len(json.loads(body)["items"]) == 60
            assert upstream_lists(running) == lists_before


async def slow_connection(port: int) -> Conn:
    """A keep-alive connection with a small receive buffer that reads nothing for now."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return Conn(*await asyncio.open_connection(sock=sock))


@pytest.mark.parametrize("representation", list(ACCEPT))
async def test_slow_readers_of_a_cached_list_hold_a_piece_each_not_a_copy_of_the_answer(
    tmp_path: Any, representation: str
) -> None:
    """Six clients that ask for an 8 MB LIST from the cache and read nothing: what the proxy
    allocates meanwhile (tracemalloc) stays under one answer's size; then each reads it whole.
    In every representation the hub shares (before, Tables and PartialObjectMetadataLists were
    encoded whole per answer: six answers' worth at the peak)."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        fill(running, 200, 40_000)
        async with watching(running, session, ACCEPT[representation]) as shared:
            whole = shared.cache.list_response()
            size = len(whole)
            served = running.proxy.metrics.registry
            ask = request("GET", CONFIGMAPS + "?resourceVersion=0", Accept=ACCEPT[representation])
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
                    # Each answer is as far as its client's socket takes it; the rest is
                    # unwritten.
                    await asyncio.sleep(0.5)
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                print(f"answer {size / 2**20:.1f} MiB; 6 slow readers: peak {peak / 2**20:.1f} MiB")
                assert peak < size, (size, peak)
                for conn in slow:
                    status, _, body = await conn.answer()
                    assert (status, body) == (200, whole)
            finally:
                # Closed also when an assertion failed: a connection left open with megabytes
                # unread keeps the event loop's close waiting, and the worker hangs.
                for conn in slow:
                    conn.close()
