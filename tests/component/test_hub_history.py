"""A new shared watch starts where its clients need it (issue 18): never a 410 the apiserver
would not give. Each test asks the same fake apiserver directly, in the same test, as the
oracle for what a client should get."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import aiohttp

from kubefake import FakeApiServer
from tests.component.test_pitfalls import Stream, annotate, pod
from tests.harness import running_proxy, wait_for

PODS = "/api/v1/namespaces/default/pods"


@contextlib.asynccontextmanager
async def direct(fake: FakeApiServer) -> AsyncIterator[aiohttp.ClientSession]:
    """A session straight to the fake apiserver: the oracle."""
    connector = aiohttp.TCPConnector(ssl=fake.client_ssl_context() or False)
    async with aiohttp.ClientSession(
        base_url=fake.url, connector=connector, headers=fake.auth_headers
    ) as session:
        yield session


async def list_rv(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200, await response.text()
        rv: str = (await response.json())["metadata"]["resourceVersion"]
        return rv


async def first_events(
    session: aiohttp.ClientSession, url: str, count: int, timeout: float = 10.0
) -> list[tuple[str, str, str]]:
    """The first ``count`` events of a watch (or fewer, if it ends or says ERROR)."""
    events: list[tuple[str, str, str]] = []
    async with asyncio.timeout(timeout), session.get(url) as response:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            if not raw.strip():
                continue
            event = json.loads(raw)
            obj = event["object"]
            if event["type"] == "ERROR":
                events.append(("ERROR", str(obj.get("code")), obj.get("message", "")))
                return events
            meta = obj["metadata"]
            events.append((event["type"], meta.get("name", ""), meta["resourceVersion"]))
            if len(events) >= count:
                return events
    return events


def requests_to(fake: FakeApiServer, *, watch: bool, selector: str) -> int:
    return sum(
        1
        for r in fake.stats.requests
        if r.path == PODS
        and r.watch == watch
        and parse_qs(r.query_string).get("labelSelector", [""])[0] == selector
    )


async def churn(fake: FakeApiServer, stop: asyncio.Event) -> None:
    """Changes all the time, as on a busy cluster: the RV moves between any two requests."""
    rng, step = random.Random(7), 0
    while not stop.is_set() and step < 5000:
        step += 1
        fake.store.modify("pods", "default", f"c{rng.randrange(5)}", annotate(str(step)))
        await asyncio.sleep(0.002)


async def test_list_then_watch_on_fresh_keys_under_churn_gets_no_410(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as proxy:
        fake = running.fake
        for i in range(5):
            fake.store.create("pods", "default", pod(f"c{i}", app="churn"))
        stop = asyncio.Event()
        churner = asyncio.ensure_future(churn(fake, stop))
        try:
            async with direct(fake) as oracle:
                for i in range(20):
                    # An informer: LIST, then WATCH from the list's RV, on a key nobody shares.
                    selector = f"app=churn,start!=s{i}"
                    query = f"?labelSelector=app%3Dchurn%2Cstart%21%3Ds{i}"
                    rv = await list_rv(proxy, running.url + PODS + query)
                    watch = f"{query}&watch=1&resourceVersion={rv}"
                    via_proxy = await first_events(proxy, running.url + PODS + watch, 3)
                    via_direct = await first_events(oracle, PODS + watch, 3)
                    assert via_direct[0][0] != "ERROR"
                    assert via_proxy == via_direct, (i, rv)
                    # No extra LIST: the client's own, and the hub's one for the new key.
                    assert requests_to(fake, watch=False, selector=selector) == 2
        finally:
            stop.set()
            await churner
        assert running.proxy.metrics.expired._value.get() == 0  # type: ignore[attr-defined]
        assert running.proxy.metrics.relists._value.get() == 0  # type: ignore[attr-defined]


async def test_resume_one_change_older_than_the_hubs_first_list_gets_the_change(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as proxy:
        fake = running.fake
        fake.store.create("pods", "default", pod("a"))
        before = str(fake.store.resource_version)
        fake.store.modify("pods", "default", "a", annotate("one change"))
        url = f"{PODS}?watch=1&resourceVersion={before}"
        async with direct(fake) as oracle:
            want = await first_events(oracle, url, 1)
        got = await first_events(proxy, running.url + url, 1)
        assert got == want and want[0][:2] == ("MODIFIED", "a")
        # The hub's history now starts there: a second client at the same RV shares it.
        again = await first_events(proxy, running.url + url, 1)
        assert again == want
        assert fake.stats.watch_opens(PODS) == 1 + 1  # the oracle's and the hub's one


async def test_waiting_for_a_deletion_with_a_name_selector_sees_it(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as proxy:
        fake = running.fake
        created = fake.store.create("pods", "default", pod("target"))
        fake.store.create("pods", "default", pod("other"))
        rv = created["metadata"]["resourceVersion"]
        fake.store.delete("pods", "default", "target")  # before the client's watch arrives
        url = f"{PODS}?watch=1&fieldSelector=metadata.name%3Dtarget&resourceVersion={rv}"
        async with direct(fake) as oracle:
            want = await first_events(oracle, url, 1)
        got = await first_events(proxy, running.url + url, 1)
        assert got == want and want[0][:2] == ("DELETED", "target")


async def test_clients_resuming_after_a_restart_get_what_the_apiserver_would_give(
    tmp_path: Any,
) -> None:
    fake = FakeApiServer(bookmark_interval=0.5)
    await fake.start()
    try:
        apps = ("web", "db", "cache")
        for app in apps:
            fake.store.create("pods", "default", pod(f"{app}-0", app=app))
        last: dict[str, str] = {}
        async with running_proxy(tmp_path, fake=fake) as running, aiohttp.ClientSession() as s:
            for app in apps:
                url = f"{running.url}{PODS}?watch=1&labelSelector=app%3D{app}"
                events = await first_events(s, url, 1)
                last[app] = events[-1][2]
        # While watchproxy is away, things change.
        for app in apps:
            fake.store.modify("pods", "default", f"{app}-0", annotate("restart"))
            fake.store.create("pods", "default", pod(f"{app}-1", app=app))
        fake.stats.reset()
        async with (
            running_proxy(tmp_path, fake=fake, seed=2) as running,
            aiohttp.ClientSession() as s,
            direct(fake) as oracle,
        ):
            urls = {
                app: f"{PODS}?watch=1&labelSelector=app%3D{app}&resourceVersion={last[app]}"
                for app in apps
            }
            wants = {app: await first_events(oracle, urls[app], 2) for app in apps}
            fake.stats.reset()
            # Four clients per key come back at once, each from the RV it last had.
            resumed = await asyncio.gather(
                *(first_events(s, running.url + urls[app], 2) for app in apps for _ in range(4))
            )
            for n, got in enumerate(resumed):
                assert got == wants[apps[n // 4]]
            for app in apps:
                assert requests_to(fake, watch=True, selector=f"app={app}") == 1
    finally:
        await fake.stop()


async def test_the_history_byte_budget_bounds_the_rings_and_a_live_client_loses_nothing(
    tmp_path: Any,
) -> None:
    """Two busy keys under a small hub.history_max_bytes: the rings together stay within it
    (each keeps at least its newest event), clients that keep up get every change, and a
    client resuming from before what is left gets what the apiserver gives."""
    budget = 40_000
    padding = "x" * 1_000
    apps = ("web", "db")
    async with (
        running_proxy(tmp_path, {"hub.history_max_bytes": budget}) as running,
        aiohttp.ClientSession() as s,
        direct(running.fake) as oracle,
    ):
        fake = running.fake
        first = {
            app: fake.store.create("pods", "default", pod(f"{app}-0", app=app)) for app in apps
        }
        streams = {
            app: Stream(s, f"{running.url}{PODS}?watch=1&labelSelector=app%3D{app}") for app in apps
        }
        try:
            for app in apps:
                await streams[app].wait(lambda st: len(st.events) >= 1)
            # In bursts of five per key, each delivered before the next: clients that keep up.
            # (A burst larger than the budget would end them as too slow, as one larger than
            # hub.history_size does.)
            for burst in range(12):
                for step in range(5):
                    for app in apps:
                        change = annotate(f"{burst}.{step}{padding}")
                        fake.store.modify("pods", "default", f"{app}-0", change)
                for app in apps:
                    count = 1 + 5 * (burst + 1)
                    await streams[app].wait(lambda st, n=count: len(st.events) >= n)
            for app in apps:
                got = [e["object"]["metadata"]["resourceVersion"] for e in streams[app].events]
                assert [int(rv) for rv in got] == sorted(int(rv) for rv in got)
                assert [e["type"] for e in streams[app].events] == ["ADDED"] + ["MODIFIED"] * 60
        finally:
            for stream in streams.values():
                await stream.close()
        registry = running.proxy.metrics.registry
        assert registry.get_sample_value("watchproxy_history_budget_bytes") == budget
        # Both keys' rings in the one series of their resource (a label per key is unbounded).
        history = {
            sample.labels["resource"]: sample.value
            for family in registry.collect()
            if family.name == "watchproxy_history_bytes"
            for sample in family.samples
        }
        assert list(history) == ["v1/pods"] and 0 < history["v1/pods"] <= budget
        hub = running.proxy.hub
        assert hub is not None
        assert history["v1/pods"] == sum(w.cache.history_bytes for w in hub.watches.values())
        # The first change is gone from the rings: that resume is the apiserver's to answer.
        oldest = first["web"]["metadata"]["resourceVersion"]
        url = f"{PODS}?watch=1&labelSelector=app%3Dweb&resourceVersion={oldest}"
        want = await first_events(oracle, url, 3)
        assert await first_events(s, running.url + url, 3) == want


async def test_a_collection_past_the_cache_budget_is_passed_through_not_cached(
    tmp_path: Any, caplog: Any
) -> None:
    """hub.cache_max_bytes: a key whose LIST would not fit is not shared; its clients are
    served by the apiserver directly, and a small key still fits beside it. The first client
    keeps the watch-list the hub began for it (relayed as it came): one upstream request."""
    padding = "x" * 2000
    async with running_proxy(tmp_path, {"hub.cache_max_bytes": 20_000}) as running:
        store = running.fake.store
        for i in range(30):  # about 60 KB: past the budget
            store.create("pods", "default", {**pod(f"big-{i}"), "data": padding})
        store.create("namespaces", None, {"metadata": {"name": "small"}})
        store.create("pods", "small", pod("s"))
        hub = running.proxy.hub
        assert hub is not None
        metrics = running.proxy.metrics.registry

        def passed() -> float:
            sample = "watchproxy_watch_passthrough_total"
            return metrics.get_sample_value(sample, {"reason": "cache-budget"}) or 0.0

        def pod_requests() -> int:
            return sum(1 for r in running.fake.stats.requests if r.path == PODS)

        async with aiohttp.ClientSession() as session:
            big = await first_events(session, running.url + PODS + "?watch=1", 30)
            assert sorted(name for _, name, _ in big) == sorted(f"big-{i}" for i in range(30))
            assert passed() == 1 and pod_requests() == 1
            # The next client passes through at once: its own watch, no LIST for a while.
            again = await first_events(session, running.url + PODS + "?watch=1", 30)
            assert len(again) == 30 and passed() == 2 and pod_requests() == 2
            small = "/api/v1/namespaces/small/pods?watch=1"
            assert [name for _, name, _ in await first_events(session, running.url + small, 1)] == [
                "s"
            ]
        assert [k.collection_path for k in hub.watches] == ["/api/v1/namespaces/small/pods"]
        # Its first client had its event relayed; the state is built from it right after.
        await wait_for(lambda: hub.cache_bytes() > 0, what="the small key's state")
        assert 0 < hub.cache_bytes() <= 20_000
        assert metrics.get_sample_value("watchproxy_cache_bytes") == hub.cache_bytes()
        assert sum("the cache is full" in r.getMessage() for r in caplog.records) == 1
