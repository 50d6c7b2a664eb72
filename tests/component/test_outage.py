"""Upstream outages and throttling: one backoff schedule, streams kept open, nothing lost."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp

from tests.harness import running_proxy, rv_of, wait_for
from watchproxy.policy.backoff import BackoffPolicy

PODS = "/api/v1/namespaces/default/pods"

# The defaults (0.8 s, x2, cap 30 s) scaled by 1/10 so the suite stays fast; the same schedule
# over a 30 s outage with the real defaults is exercised by bench/outage.py.
SCALE = 0.1
BACKOFF = {
    "backoff.initial_seconds": 0.8 * SCALE,
    "backoff.max_seconds": 30 * SCALE,
    "backoff.factor": 2.0,
    "backoff.jitter": "proportional",
}
OUTAGE_SECONDS = 30 * SCALE


def pod(name: str, app: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def max_attempts(policy: BackoffPolicy, window: float) -> int:
    """Most probes the schedule allows in ``window`` s: each delay is at least its base."""
    attempts, elapsed, attempt = 1, 0.0, 0
    while True:
        elapsed += policy.base_delay(attempt)  # proportional jitter never waits less
        if elapsed > window:
            return attempts
        attempts += 1
        attempt += 1


async def test_outage_attempts_follow_one_schedule_and_streams_survive(tmp_path: Any) -> None:
    overrides = dict(BACKOFF, **{"hub.max_subscriber_lag": 100000})
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        for i in range(4):
            store.create("pods", "default", pod(f"web-{i}", "web"))
            store.create("pods", "default", pod(f"db-{i}", "db"))
        streams: dict[int, list[dict[str, Any]]] = {}
        cut: set[int] = set()
        stop = asyncio.Event()

        async def watcher(n: int, app: str) -> None:
            """A client that holds one watch open for the whole test."""
            streams[n] = []
            url = f"{running.url}{PODS}?watch=1&labelSelector=app%3D{app}"
            async with session.get(url) as response:
                async for raw in response.content:
                    streams[n].append(json.loads(raw))
                    if stop.is_set():
                        return
            cut.add(n)  # the stream ended before the test said so

        async def hammer(path: str) -> int:
            """A client with no backoff at all: re-requests the moment an answer comes."""
            count = 0
            deadline = time.monotonic() + OUTAGE_SECONDS + 1
            while not stop.is_set() and time.monotonic() < deadline and count < 5000:
                async with session.get(running.url + path) as response:
                    await response.read()
                count += 1
                await asyncio.sleep(0)
            return count

        watchers = [asyncio.ensure_future(watcher(n, "web" if n % 2 else "db")) for n in range(30)]
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: hub.active_clients == 30, what="30 shared-watch clients")
        await wait_for(lambda: all(len(s) == 4 for s in streams.values()), what="initial state")

        running.fake.stats.reset()
        await running.fake.faults.outage("reset")
        loop_clients = [
            asyncio.ensure_future(hammer(f"{PODS}?labelSelector=app%3Dweb")) for _ in range(10)
        ] + [
            # A watch nobody shared before the outage: the hub has no state to serve it from.
            asyncio.ensure_future(
                hammer(f"{PODS}?watch=1&labelSelector=app%3Dcache&timeoutSeconds=1")
            )
            for _ in range(10)
        ]
        # Changes keep happening in the apiserver's storage while the proxy cannot reach it.
        during = [store.create("pods", "default", pod(f"web-new-{i}", "web")) for i in range(3)]
        await asyncio.sleep(OUTAGE_SECONDS)
        attempts = running.fake.stats.outage_connection_attempts
        await running.fake.faults.recover()
        stop_hammering = asyncio.gather(*loop_clients)
        requests_made = sum(await asyncio.wait_for(stop_hammering, 10))

        policy = BackoffPolicy(initial=0.8 * SCALE, factor=2.0, cap=30 * SCALE)
        allowed = max_attempts(policy, OUTAGE_SECONDS) + 2  # + the two shared watches' own try
        assert requests_made > 100  # the clients really did hammer
        assert attempts <= allowed, (attempts, allowed)

        after = store.create("pods", "default", pod("web-after", "web"))
        web_watchers = [n for n in streams if n % 2]
        await wait_for(
            lambda: all(
                streams[n] and streams[n][-1]["object"]["metadata"]["name"] == "web-after"
                for n in web_watchers
            ),
            timeout=20,
            what="every web watcher to see the post-outage event",
        )
        stop.set()
        store.create("pods", "default", pod("db-after", "db"))
        store.create("pods", "default", pod("web-last", "web"))  # wakes the web watchers
        await asyncio.wait_for(asyncio.gather(*watchers), 10)
        assert not cut, f"streams cut during the outage: {sorted(cut)}"
        want = [("ADDED", o["metadata"]["name"]) for o in [*during, after]]
        for n in web_watchers:
            got = [(e["type"], e["object"]["metadata"]["name"]) for e in streams[n][4:-1]]
            assert got == want, n
            rvs = [rv_of(e) for e in streams[n]][4:]
            assert rvs == sorted(set(rvs))


async def test_no_upstream_request_before_retry_after(tmp_path: Any) -> None:
    """With fixed limits only, one 429's Retry-After holds every upstream request back (the
    adaptive limit does so only from its floor: tests/unit/test_ratelimit.py)."""
    overrides = {"ratelimit.adaptive": False}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.faults.throttle(1.0)
        async with session.get(running.url + PODS) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "1"
            assert (await response.json())["reason"] == "TooManyRequests"
        throttled_at = running.fake.stats.requests[-1].time
        running.fake.faults.throttle(None)
        running.fake.stats.reset()
        # Clients ask again at once; the proxy holds them until Retry-After has passed.
        answers = await asyncio.gather(
            *(session.get(running.url + PODS) for _ in range(5)), return_exceptions=False
        )
        for answer in answers:
            assert answer.status == 200
            answer.release()
        first_after = min(r.time for r in running.fake.stats.requests)
        assert first_after - throttled_at >= 1.0 - 0.01


async def test_list_rv0_and_new_watches_are_served_from_hub_state_during_outage(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path, BACKOFF) as running, aiohttp.ClientSession() as session:
        for i in range(3):
            running.fake.store.create("pods", "default", pod(f"web-{i}", "web"))
        watch = asyncio.ensure_future(
            session.get(f"{running.url}{PODS}?watch=1&labelSelector=app%3Dweb")
        )
        hub = running.proxy.hub
        assert hub is not None
        # Known = listed and its WATCH accepted by the apiserver (clients are answered only
        # then: an account may be allowed to list but not to watch).
        await wait_for(
            lambda: (
                hub.active_clients == 1
                and all(w.cache.synced for w in hub.watches.values())
                and running.fake.stats.active_watches >= 1
            )
        )
        await running.fake.faults.outage("refuse")
        await wait_for(lambda: running.proxy.connectivity.down, what="the proxy to notice")

        async with session.get(
            f"{running.url}{PODS}?labelSelector=app%3Dweb&resourceVersion=0"
        ) as response:
            assert response.status == 200
            listed = await response.json()
        assert listed["kind"] == "PodList"
        assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["web-0", "web-1", "web-2"]

        # A consistent read cannot be served: it fails fast with a Status that names the cause,
        # and no Retry-After (client-go would retry it 10 times; see upstream/client.py).
        started = time.monotonic()
        async with session.get(f"{running.url}{PODS}?labelSelector=app%3Dweb") as response:
            assert response.status == 503
            assert "Retry-After" not in response.headers
            status = await response.json()
            assert status["reason"] == "ServiceUnavailable"
            assert "unreachable" in status["message"]
        assert time.monotonic() - started < 1.0

        # So does a watch on a key the hub has no state for.
        async with session.get(f"{running.url}{PODS}?watch=1&labelSelector=app%3Ddb") as response:
            assert response.status == 503
            assert "Retry-After" not in response.headers
            assert "no shared state yet" in (await response.json())["message"]

        # A new watch on the known key joins the shared state without the upstream.
        async with session.get(
            f"{running.url}{PODS}?watch=1&labelSelector=app%3Dweb&timeoutSeconds=1"
        ) as response:
            assert response.status == 200
            lines = (await response.read()).splitlines()
        assert len(lines) == 3
        await running.fake.faults.recover()
        (await watch).close()


async def test_backoff_schedule_has_jitter_so_many_proxies_spread(tmp_path: Any) -> None:
    """Two proxies with different seeds do not probe a dead apiserver in lock-step."""
    from watchproxy.policy.backoff import Backoff

    policy = BackoffPolicy()
    a = Backoff(policy, random.Random(1), time.monotonic)
    b = Backoff(policy, random.Random(2), time.monotonic)
    assert [round(a.failure(), 3) for _ in range(5)] != [round(b.failure(), 3) for _ in range(5)]


async def test_bookmarks_continue_at_the_last_rv_during_an_outage(tmp_path: Any) -> None:
    overrides = dict(BACKOFF, **{"hub.bookmark_interval_seconds": 0.2})
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        last = running.fake.store.create("pods", "default", pod("web-0", "web"))
        bookmarks: list[str] = []
        outage_started = asyncio.Event()

        async def follow() -> None:
            url = f"{running.url}{PODS}?watch=1&allowWatchBookmarks=true"
            async with session.get(url) as response:
                async for raw in response.content:
                    event = json.loads(raw)
                    if event["type"] == "BOOKMARK" and outage_started.is_set():
                        bookmarks.append(event["object"]["metadata"]["resourceVersion"])
                        if len(bookmarks) == 3:
                            return

        task = asyncio.ensure_future(follow())
        hub = running.proxy.hub
        assert hub is not None
        # Synced, not just subscribed: an outage during the first list is another test.
        # Known = listed and its WATCH accepted by the apiserver (clients are answered only
        # then: an account may be allowed to list but not to watch).
        await wait_for(
            lambda: (
                hub.active_clients == 1
                and all(w.cache.synced for w in hub.watches.values())
                and running.fake.stats.active_watches >= 1
            )
        )
        await running.fake.faults.outage("refuse")
        await wait_for(lambda: running.proxy.connectivity.down, what="the proxy to notice")
        outage_started.set()
        await asyncio.wait_for(task, 10)
        await running.fake.faults.recover()
        # Every bookmark during the outage carries the last RV the proxy had seen, no newer.
        assert all(int(rv) >= int(last["metadata"]["resourceVersion"]) for rv in bookmarks)
        assert len(set(bookmarks)) == 1
