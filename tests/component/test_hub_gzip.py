"""Compressed watch-lists from the hub, as kube-apiserver 1.37 serves them.

A client whose watch-list asks for gzip gets ``Content-Encoding: gzip``, ``Vary:
Accept-Encoding`` and one gzip member per flush (its initial events, then each change as a
member of its own); a client that does not ask, or whose watch is not a watch-list, gets
identity from the same shared watch. Many gzip clients at the same point of the stream share
one compressed member per change: the proxy compresses a change once, not once per client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

import watchproxy.server.watchsink as watchsink
from tests.harness import Running, running_proxy, wait_for
from watchproxy.upstream.bodies import GzipMembers

pytestmark = pytest.mark.timeout(60, func_only=True)

CMS = "/api/v1/namespaces/default/configmaps"
WATCH_LIST = (
    "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
)
END = b'"k8s.io/initial-events-end":"true"'
GZIP_CLIENTS = 20


class RawWatch:
    """One watch read as it comes off the wire: raw bytes, members, decoded lines."""

    def __init__(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str]):
        self.session, self.url, self.headers = session, url, headers
        self.response_headers: dict[str, str] = {}
        self.raw = bytearray()
        self.members = GzipMembers()
        self.decoded = bytearray()
        self.ready = asyncio.Event()
        self.changed = asyncio.Event()

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.decoded.splitlines() if line.strip()]

    async def run(self) -> None:
        async with self.session.get(self.url, headers=self.headers) as response:
            assert response.status == 200, await response.text()
            self.response_headers = dict(response.headers)
            gzipped = response.headers.get("Content-Encoding") == "gzip"
            async for chunk in response.content.iter_any():
                self.raw += chunk
                self.decoded += self.members.feed(chunk) if gzipped else chunk
                if END in self.decoded:
                    self.ready.set()
                self.changed.set()

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not check():
                self.changed.clear()
                await self.changed.wait()


def modify(running: Running, name: str, value: str) -> None:
    running.fake.store.modify(
        "configmaps", "default", name, lambda obj: obj["data"].update(v=value)
    )


async def test_gzip_watch_lists_get_one_member_per_change_compressed_once_for_all(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    compressed: list[int] = []
    real_member = watchsink.gzip_member

    def counted(data: bytes) -> bytes:
        compressed.append(len(data))
        return real_member(data)

    monkeypatch.setattr(watchsink, "gzip_member", counted)  # a spy: the real compression runs
    async with (
        running_proxy(tmp_path) as running,
        aiohttp.ClientSession(
            auto_decompress=False, skip_auto_headers=("Accept-Encoding",)
        ) as session,
    ):
        for i in range(30):
            running.fake.store.create(
                "configmaps", "default", {"metadata": {"name": f"cm-{i}"}, "data": {"v": "0"}}
            )
        url = running.url + CMS
        gzip = {"Accept": "application/json", "Accept-Encoding": "gzip, deflate"}
        plain = {"Accept": "application/json"}
        gzipped = [RawWatch(session, url + WATCH_LIST, gzip) for _ in range(GZIP_CLIENTS)]
        identity = RawWatch(session, url + WATCH_LIST, plain)
        # Not a watch-list (no bookmarks): the apiserver does not compress it either.
        no_bookmarks = RawWatch(session, url + "?watch=1", gzip)
        everyone = [*gzipped, identity, no_bookmarks]
        tasks = [asyncio.create_task(w.run()) for w in everyone]
        try:
            async with asyncio.timeout(20):
                await asyncio.gather(*(w.ready.wait() for w in [*gzipped, identity]))
                await no_bookmarks.until(lambda: len(no_bookmarks.events) >= 30)
            assert running.proxy.hub is not None
            [shared] = running.proxy.hub.watches.values()
            await wait_for(lambda: len(shared.fanout) == len(everyone), what="all clients parked")
            initial = len(compressed)
            assert initial == GZIP_CLIENTS  # each client's initial events, for it alone
            for change in range(1, 6):
                modify(running, f"cm-{change}", str(change))
                for watch in everyone:
                    # 30 ADDED, the end bookmark (watch-lists only), then the changes.
                    base = 30 if watch is no_bookmarks else 31
                    await watch.until(lambda w=watch, n=base + change: len(w.events) >= n)  # type: ignore[misc]
            # One member per change, shared by the 20 gzip clients; none for the others.
            assert len(compressed) == initial + 5
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    for watch in gzipped:
        assert watch.response_headers.get("Content-Encoding") == "gzip"
        assert watch.response_headers.get("Vary") == "Accept-Encoding"
        assert watch.members.members == 1 + 5  # the initial events, then one per change
        assert watch.events == identity.events
    for watch in (identity, no_bookmarks):
        assert "Content-Encoding" not in watch.response_headers
        assert "Vary" not in watch.response_headers
        assert watch.members.members == 0 and bytes(watch.raw) == bytes(watch.decoded)
    assert identity.events[30]["type"] == "BOOKMARK"
    assert [e["object"]["data"]["v"] for e in identity.events[31:]] == ["1", "2", "3", "4", "5"]
    assert no_bookmarks.events == identity.events[:30] + identity.events[31:]
