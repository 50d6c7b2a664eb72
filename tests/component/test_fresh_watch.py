"""A watch from "now" (resourceVersion unset) sees every write that finished before it was sent.

The apiserver answers such a watch consistently: it reads etcd's current revision first and
serves the initial events from a state at least that new (1.34 and 1.37 turn it into a
watch-list; before, etcd served it). A shared watch's state can lag the apiserver by the events
still on their way, so the hub must not hand a joining client its state as it stands. Each test
makes a write, holds its event back from the hub's upstream watch (``lag_open_watches``), and
opens a watch from now through the proxy: its initial events must hold the write. A watch from
"0" (any state) is served from the state at once, as the apiserver's watch cache serves it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest

from tests.component.test_consistent_list import PODS, upstream_lists, watching
from tests.component.test_pitfalls import pod
from tests.harness import Running, running_proxy, wait_for
from watchproxy.hub.fetcher import PROBE_SECONDS, REPLAY_SECONDS
from watchproxy.hub.freshwatch import PROBE_MAX_OBJECTS

WATCH_LIST = "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
FROM_NOW = {
    "watch-list": WATCH_LIST + "&allowWatchBookmarks=true",
    "watch-list-without-bookmarks": WATCH_LIST,
    "legacy": "?watch=1&allowWatchBookmarks=true",
    "legacy-without-bookmarks": "?watch=1",
}
QUIET = {"hub.consistent_list_wait_seconds": 0.05}  # quiet after 0.2 s without an event


async def first_added(
    running: Running, session: aiohttp.ClientSession, query: str, n: int
) -> list[str]:
    """The names of a watch's first ``n`` ADDEDs, in order. Initial events come in key order,
    so a write whose name sorts first is first when it is in the initial state and last when
    it only comes later, as a change."""
    names: list[str] = []
    url = running.url + PODS + query + "&timeoutSeconds=10"
    async with session.get(url) as response, asyncio.timeout(10):
        assert response.status == 200, await response.text()
        while len(names) < n:
            line = await response.content.readline()
            assert line, f"the watch ended after {names}"
            event = json.loads(line)
            if event["type"] == "ADDED":
                names.append(event["object"]["metadata"]["name"])
    return names


async def lag_hub(running: Running, lag: float) -> None:
    """The hub's upstream watch, synced, lags ``lag`` seconds from now on; watches opened
    later do not: a write made next is a client's own write still on its way to the hub."""
    shared = next(iter(running.proxy.hub.watches.values()))  # type: ignore[union-attr]
    store = running.fake.store
    await wait_for(lambda: shared.cache.resource_version == store.resource_version, what="sync")
    # Synced from its LIST, the shared watch may still be opening its WATCH: lag it once open.
    await wait_for(
        lambda: running.fake.faults.lag_open_watches(lag) == 1, what="the upstream watch open"
    )


async def lagging_write(running: Running, name: str, lag: float) -> None:
    """``name`` created while the hub's upstream watch lags ``lag`` seconds."""
    await lag_hub(running, lag)
    running.fake.store.create("pods", "default", pod(name))


@pytest.mark.parametrize("query", FROM_NOW.values(), ids=FROM_NOW.keys())
async def test_a_watch_from_now_on_a_quiet_collection_holds_the_last_write(
    tmp_path: Any, query: str
) -> None:
    async with running_proxy(tmp_path, QUIET) as running, aiohttp.ClientSession() as session:
        for i in range(3):
            running.fake.store.create("pods", "default", pod(f"early-{i}"))
        async with watching(running, session):
            shared = next(iter(running.proxy.hub.watches.values()))  # type: ignore[union-attr]
            loop = asyncio.get_running_loop()
            await wait_for(
                lambda: shared.advanced_at is not None and loop.time() - shared.advanced_at > 0.3,
                what="the collection to be quiet",
            )
            await lagging_write(running, "a-late", 1.0)
            names = await first_added(running, session, query, 4)
            assert names == ["a-late", "early-0", "early-1", "early-2"]
            assert running.proxy.hub.active_clients == 2  # type: ignore[union-attr]
            assert not_current(running) == 0


async def test_a_watch_list_on_a_busy_collection_waits_for_the_writes_before_it(
    tmp_path: Any,
) -> None:
    async with (
        running_proxy(tmp_path, {"hub.consistent_list_wait_seconds": 2.0}) as running,
        aiohttp.ClientSession() as session,
        watching(running, session),
    ):
        for i in range(3):
            running.fake.store.create("pods", "default", pod(f"early-{i}"))
        await lagging_write(running, "a-late", 0.3)
        names = await first_added(running, session, FROM_NOW["watch-list"], 4)
        assert names == ["a-late", "early-0", "early-1", "early-2"]


async def test_a_watch_from_0_is_served_from_the_state_at_once(tmp_path: Any) -> None:
    """Any state will do: no probe goes upstream, and a write still on its way may be missing
    (the apiserver's watch cache answers the same way)."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("early"))
        async with watching(running, session):
            probes = len(upstream_lists(running, "1"))
            query = WATCH_LIST + "&allowWatchBookmarks=true&resourceVersion=0"
            assert await first_added(running, session, query, 1) == ["early"]
            assert len(upstream_lists(running, "1")) == probes


def not_current(running: Running) -> float:
    value = running.proxy.metrics.registry.get_sample_value(
        "watchproxy_watch_passthrough_total", {"reason": "not-current"}
    )
    return value or 0.0


async def test_a_watch_from_now_that_cannot_be_shown_current_is_passed_through(
    tmp_path: Any,
) -> None:
    """A key too large for a watch-list probe is checked by a replay from the state's
    resourceVersion, which is refused here (history compacted): the apiserver answers the
    watch, with the write."""
    async with (
        running_proxy(tmp_path, QUIET) as running,
        aiohttp.ClientSession() as session,
        watching(running, session),
    ):
        for i in range(PROBE_MAX_OBJECTS + 1):
            running.fake.store.create("pods", "default", pod(f"early-{i:03d}"))
        await lagging_write(running, "a-late", 1.0)
        running.fake.store.compact()
        names = await first_added(running, session, FROM_NOW["watch-list"], 2)
        assert names == ["a-late", "early-000"]
        assert not_current(running) == 1
        assert probe_watch_lists(running) == []
        assert len(replays(running)) == 1


def probe_watch_lists(running: Running) -> list[Any]:
    """The hub's watch-list probes sent upstream."""
    return [
        r
        for r in running.fake.stats.requests
        if r.path == PODS
        and r.watch
        and parse_qs(r.query_string).get("timeoutSeconds") == [str(PROBE_SECONDS)]
    ]


def replays(running: Running) -> list[Any]:
    return [
        r
        for r in running.fake.stats.requests
        if r.path == PODS
        and r.watch
        and parse_qs(r.query_string).get("timeoutSeconds") == [str(REPLAY_SECONDS)]
        and "sendInitialEvents" not in parse_qs(r.query_string)
    ]


def watch_list_outcome(running: Running, outcome: str) -> float:
    value = running.proxy.metrics.registry.get_sample_value(
        "watchproxy_freshness_watch_lists_total", {"outcome": outcome}
    )
    return value or 0.0


async def quiet_shared_key(running: Running, session: aiohttp.ClientSession) -> None:
    shared = next(iter(running.proxy.hub.watches.values()))  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()
    await wait_for(
        lambda: shared.advanced_at is not None and loop.time() - shared.advanced_at > 0.3,
        what="the collection to be quiet",
    )


async def timed_first_added(
    running: Running, session: aiohttp.ClientSession, n: int
) -> tuple[float, list[str]]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    names = await first_added(running, session, FROM_NOW["watch-list"], n)
    return loop.time() - start, names


async def test_a_watch_from_now_joining_a_quiet_unchanged_key_is_served_at_once(
    tmp_path: Any,
) -> None:
    """Nothing changed in the key since its state: a watch-list probe shows it at once, where
    a replay from the state's resourceVersion would hold the client a whole second."""
    async with running_proxy(tmp_path, QUIET) as running, aiohttp.ClientSession() as session:
        for i in range(3):
            running.fake.store.create("pods", "default", pod(f"early-{i}"))
        async with watching(running, session):
            await quiet_shared_key(running, session)
            await lag_hub(running, 5.0)
            running.fake.store.create("configmaps", "default", {"metadata": {"name": "other"}})
            elapsed, names = await timed_first_added(running, session, 3)
            assert names == ["early-0", "early-1", "early-2"]
            assert elapsed < 0.5
            assert watch_list_outcome(running, "same") == 1
            assert (len(probe_watch_lists(running)), replays(running)) == (1, [])
            assert not_current(running) == 0


async def test_a_watch_from_now_joining_a_key_just_written_is_not_held_for_the_wait(
    tmp_path: Any,
) -> None:
    """The key was written a moment ago (it looks busy) and the revision has moved on since in
    another resource, as leases move it every few seconds in a cluster: the state will not
    reach the revision with this key's events. The watch-list probe shows it current within
    milliseconds; waiting the whole hub.consistent_list_wait_seconds (0.5 s by default) for a
    change that is not coming first held the client that long (CI saw 0.58 s against 0.07 s
    direct, tests/realapi/test_informer_timing.py)."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        for i in range(3):
            running.fake.store.create("pods", "default", pod(f"early-{i}"))
        async with watching(running, session):
            shared = next(iter(running.proxy.hub.watches.values()))  # type: ignore[union-attr]
            store = running.fake.store
            store.create("pods", "default", pod("early-3"))
            await wait_for(
                lambda: shared.cache.resource_version == store.resource_version,
                what="the write in the state",
            )
            store.create("configmaps", "default", {"metadata": {"name": "other"}})
            elapsed, names = await timed_first_added(running, session, 4)
            assert names == ["early-0", "early-1", "early-2", "early-3"]
            assert elapsed < 0.25
            assert watch_list_outcome(running, "same") == 1
            assert not_current(running) == 0


async def test_a_watch_from_now_joining_a_quiet_key_waits_only_for_the_write_before_it(
    tmp_path: Any,
) -> None:
    """The probe shows the write the shared watch has not had yet: the client is served once
    it has (0.2 s on its way here), with it, and not a replay's second later."""
    async with running_proxy(tmp_path, QUIET) as running, aiohttp.ClientSession() as session:
        for i in range(3):
            running.fake.store.create("pods", "default", pod(f"early-{i}"))
        async with watching(running, session):
            await quiet_shared_key(running, session)
            await lagging_write(running, "a-late", 0.2)
            elapsed, names = await timed_first_added(running, session, 4)
            assert names == ["a-late", "early-0", "early-1", "early-2"]
            assert elapsed < 0.7
            assert watch_list_outcome(running, "caught-up") == 1
            assert replays(running) == []
            assert not_current(running) == 0


async def test_a_watch_from_now_joining_a_quiet_key_waits_for_a_delete_before_it(
    tmp_path: Any,
) -> None:
    """The probe lacks an object the state holds: the client is served once the shared watch
    has dropped it too, without it."""
    async with running_proxy(tmp_path, QUIET) as running, aiohttp.ClientSession() as session:
        for i in range(3):
            running.fake.store.create("pods", "default", pod(f"early-{i}"))
        async with watching(running, session):
            await quiet_shared_key(running, session)
            await lag_hub(running, 0.2)
            running.fake.store.delete("pods", "default", "early-0")
            elapsed, names = await timed_first_added(running, session, 2)
            assert names == ["early-1", "early-2"]
            assert elapsed < 0.7
            assert watch_list_outcome(running, "caught-up") == 1
            assert replays(running) == []


async def test_a_watch_from_now_is_served_from_the_state_while_the_apiserver_is_down(
    tmp_path: Any,
) -> None:
    """No current revision can be read: the state is all there is (clients of an outage keep
    being served, and the shared watch resumes behind them)."""
    async with (
        running_proxy(tmp_path, QUIET) as running,
        aiohttp.ClientSession() as session,
        watching(running, session),
    ):
        running.fake.store.create("pods", "default", pod("early-0"))
        shared = next(iter(running.proxy.hub.watches.values()))  # type: ignore[union-attr]
        store = running.fake.store
        await wait_for(lambda: shared.cache.resource_version == store.resource_version, what="sync")
        # The outage must cut an open upstream watch, not race the WATCH that follows the LIST.
        await wait_for(lambda: running.fake.stats.active_watches >= 1, what="the upstream watch")
        await running.fake.faults.outage("refuse")
        await wait_for(lambda: running.proxy.connectivity.down, what="the outage to be seen")
        assert await first_added(running, session, FROM_NOW["watch-list"], 1) == ["early-0"]
        assert not_current(running) == 0
