"""The first client of a cold key is relayed its initial events as the apiserver sends them
(issue 43, item 3; watchproxy/hub/firstsync.py): it does not wait for the hub to have read,
parsed and encoded the whole collection, its stream is the one the apiserver gives directly
(asked in the same test, as the oracle), and the key costs one upstream request, the
watch-list that goes on as the shared watch. Later clients are served from the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from kubefake import FakeApiServer
from tests.component.test_hub_history import direct
from tests.component.test_pitfalls import pod
from tests.harness import Running, running_proxy, wait_for

PODS = "/api/v1/namespaces/default/pods"
PLAIN = "?watch=1"
WATCH_LIST = (
    "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
)


def set_phase(phase: str) -> Any:
    def apply(obj: dict[str, Any]) -> None:
        obj.setdefault("status", {})["phase"] = phase

    return apply


class Reader:
    """One watch read in the background: its events as parsed JSON, as they arrive."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._read(session, url))

    async def _read(self, session: aiohttp.ClientSession, url: str) -> None:
        async with session.get(url) as response:
            assert response.status == 200, await response.text()
            async for raw in response.content:
                if raw.strip():
                    self.events.append(json.loads(raw))
                    self._changed.set()

    async def until(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The first ``count`` events, once they have come (bounded in time)."""
        async with asyncio.timeout(timeout):
            while len(self.events) < count:
                if self._task.done():
                    self._task.result()
                    raise AssertionError(f"the watch ended after {len(self.events)} events")
                self._changed.clear()
                await asyncio.wait(
                    [asyncio.ensure_future(self._changed.wait()), self._task],
                    return_when=asyncio.FIRST_COMPLETED,
                )
        return self.events[:count]

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def reading(session: aiohttp.ClientSession, url: str) -> AsyncIterator[Reader]:
    reader = Reader(session, url)
    try:
        yield reader
    finally:
        await reader.close()


def without_progress_bookmarks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events but for periodic bookmarks (their timing is the server's own)."""
    end = "k8s.io/initial-events-end"
    return [
        e
        for e in events
        if e["type"] != "BOOKMARK"
        or (e["object"]["metadata"].get("annotations") or {}).get(end) == "true"
    ]


def pod_requests(fake: FakeApiServer) -> list[str]:
    return [r.query_string for r in fake.stats.requests if r.path == PODS]


async def fill(running: Running, count: int) -> None:
    for i in range(count):
        running.fake.store.create("pods", "default", pod(f"web-{i:02}"))


async def test_the_first_client_has_initial_events_before_the_apiserver_has_sent_them_all(
    tmp_path: Any,
) -> None:
    """The apiserver sends 20 of 40 initial events and stalls: the client through the proxy
    already has those 20. Released, its whole stream (ADDEDs, then a change) equals the one
    the apiserver gives a client directly, and the key cost one upstream request."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        await fill(running, 40)
        fake = running.fake
        fake.faults.hold_initial_events(after=20)
        async with (
            direct(fake) as oracle,
            reading(oracle, PODS + PLAIN) as want,
            reading(session, running.url + PODS + PLAIN) as got,
        ):
            first = await got.until(20)
            assert [e["type"] for e in first] == ["ADDED"] * 20
            assert fake.faults.initial_events_held == 2  # the proxy's and the oracle's
            assert len(got.events) == 20  # nothing more came while the apiserver stalled
            fake.faults.hold_initial_events(None)
            await want.until(40)
            await got.until(40)
            fake.store.modify("pods", "default", "web-07", set_phase("Moved"))
            assert await got.until(41) == await want.until(41)
            assert got.events[40]["type"] == "MODIFIED"
        assert len(pod_requests(fake)) == 2  # the proxy's one (its watch-list), the oracle's


async def test_a_watch_list_client_is_relayed_the_initial_events_end_bookmark(
    tmp_path: Any,
) -> None:
    """sendInitialEvents=true: the initial events, the initial-events-end bookmark and the
    changes after it, as the apiserver gives them directly."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        await fill(running, 30)
        fake = running.fake
        fake.faults.hold_initial_events(after=10)
        async with (
            direct(fake) as oracle,
            reading(oracle, PODS + WATCH_LIST) as want,
            reading(session, running.url + PODS + WATCH_LIST) as got,
        ):
            assert [e["type"] for e in await got.until(10)] == ["ADDED"] * 10
            fake.faults.hold_initial_events(None)
            await got.until(31)
            fake.store.modify("pods", "default", "web-03", set_phase("Moved"))
            await wait_for(
                lambda: (
                    any(e["type"] == "MODIFIED" for e in got.events)
                    and any(e["type"] == "MODIFIED" for e in want.events)
                ),
                what="the change through the proxy and directly",
            )
            assert without_progress_bookmarks(got.events) == without_progress_bookmarks(want.events)
            assert [e["type"] for e in without_progress_bookmarks(got.events)] == [
                *["ADDED"] * 30,
                "BOOKMARK",
                "MODIFIED",
            ]


async def test_later_clients_of_a_relayed_key_are_served_from_its_cache(tmp_path: Any) -> None:
    """Once the relayed key has its state, a second client gets its initial events from the
    cache: neither a LIST of the collection nor a watch upstream (only the one-item LIST that
    tells whether the state is current, hub/freshwatch.py)."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        await fill(running, 25)
        hub = running.proxy.hub
        assert hub is not None
        async with reading(session, running.url + PODS + PLAIN) as first:
            await first.until(25)
            await wait_for(
                lambda: any(w.cache.synced for w in hub.watches.values()), what="a synced key"
            )
            (relayed,) = pod_requests(running.fake)
            assert "sendInitialEvents=true" in relayed
            async with reading(session, running.url + PODS + PLAIN) as second:
                names = [e["object"]["metadata"]["name"] for e in await second.until(25)]
                assert sorted(names) == [f"web-{i:02}" for i in range(25)]
            assert pod_requests(running.fake)[1:] in ([], ["limit=1"])


async def test_a_client_that_leaves_during_the_relay_leaves_the_key_to_sync(
    tmp_path: Any,
) -> None:
    """The first client goes away while its initial events are relayed: the key still syncs
    from the same watch-list, and the next client is served from it (after the one-item LIST
    that tells whether the state is current)."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        await fill(running, 30)
        fake = running.fake
        hub = running.proxy.hub
        assert hub is not None
        fake.faults.hold_initial_events(after=10)
        async with reading(session, running.url + PODS + PLAIN) as first:
            await first.until(10)
        async with reading(session, running.url + PODS + PLAIN) as second:
            fake.faults.hold_initial_events(None)
            names = [e["object"]["metadata"]["name"] for e in await second.until(30)]
            assert sorted(names) == [f"web-{i:02}" for i in range(30)]
        relayed, *after = pod_requests(fake)
        assert "sendInitialEvents=true" in relayed and after in ([], ["limit=1"])


async def test_a_key_synced_from_an_empty_watch_list_makes_bookmarks_of_its_kind(
    tmp_path: Any,
) -> None:
    """A watch-list of an empty collection carries no object to learn the kind from but its
    bookmark: the hub's own bookmarks for the key (here a later client's initial-events-end)
    still carry kind and apiVersion, which client-go's decoder requires ("Object 'Kind' is
    missing")."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        hub = running.proxy.hub
        assert hub is not None
        async with reading(session, running.url + PODS + WATCH_LIST) as first:
            (end,) = await first.until(1)
            assert end["type"] == "BOOKMARK"
            await wait_for(
                lambda: any(w.cache.synced for w in hub.watches.values()), what="a synced key"
            )
            async with reading(session, running.url + PODS + WATCH_LIST) as second:
                (bookmark,) = await second.until(1)
        assert bookmark["type"] == "BOOKMARK"
        assert (bookmark["object"]["kind"], bookmark["object"]["apiVersion"]) == ("Pod", "v1")
