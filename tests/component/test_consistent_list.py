"""Consistent LISTs answered from a live shared watch once it has caught up (issue 16.2).

Each test keeps a client watch open so that the key has a shared watch, then lists without a
resourceVersion. What is pinned: a LIST sees every write that finished before it was sent, and
is then answered from the hub (the apiserver serves only a one-item probe); a quiet collection,
a watch that does not catch up, and a LIST the hub cannot page go to the apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import aiohttp

from tests.component.test_pitfalls import pod
from tests.harness import Running, running_proxy, wait_for
from watchproxy.lists.consistent import probe_target

PODS = "/api/v1/namespaces/default/pods"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
# Room for a loaded machine: the fake, the proxy and the clients share one event loop here.
PATIENT = {"hub.consistent_list_wait_seconds": 2.0}


def names(body: dict[str, Any]) -> list[str]:
    return sorted(item["metadata"]["name"] for item in body["items"])


def versions(items: list[dict[str, Any]]) -> dict[str, str]:
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in items}


def in_flight(running: Running) -> float:
    registry = running.proxy.metrics.registry
    return registry.get_sample_value("watchproxy_requests_in_flight", {"kind": "request"}) or 0


def outcome(running: Running, name: str) -> float:
    value = running.proxy.metrics.registry.get_sample_value(
        "watchproxy_consistent_lists_total", {"outcome": name}
    )
    return value or 0.0


def outcomes(running: Running) -> dict[str, float]:
    """Every counted outcome of ``watchproxy_consistent_lists_total`` (for a failure's message)."""
    metric = running.proxy.metrics.consistent_lists
    return {
        sample.labels["outcome"]: sample.value
        for family in metric.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def upstream_lists(running: Running, query: str = "") -> list[Any]:
    return [
        r
        for r in running.fake.stats.requests
        if r.path == PODS
        and not r.watch
        and parse_qs(r.query_string).get("limit", [""])[0] == query
    ]


def synced_watches(running: Running) -> int:
    hub = running.proxy.hub
    assert hub is not None
    return sum(1 for shared in hub.watches.values() if shared.cache.synced)


@contextlib.asynccontextmanager
async def watching(
    running: Running,
    session: aiohttp.ClientSession,
    headers: dict[str, str] | None = None,
    path: str = PODS,
) -> AsyncIterator[None]:
    """A client watch on the pods, holding the key's shared watch open."""
    stop = asyncio.Event()

    async def watch() -> None:
        async with session.get(
            running.url + path + "?watch=1&allowWatchBookmarks=true", headers=headers or {}
        ) as response:
            assert response.status == 200
            # Read in chunks, not lines: an event may be larger than aiohttp's line limit.
            async for _ in response.content.iter_any():
                if stop.is_set():
                    break

    task = asyncio.create_task(watch())
    try:
        # Synced, not only started: a LIST that comes before the shared watch's first LIST is
        # in has no cover and goes upstream uncounted (a stressed CI run listed that early).
        await wait_for(lambda: synced_watches(running) == 1, what="the shared watch, synced")
        yield
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def writing(running: Running) -> AsyncIterator[None]:
    """Pods written every few milliseconds: a collection whose watch moves all the time."""

    async def write() -> None:
        for i in range(100_000):
            running.fake.store.create("pods", "default", pod(f"busy-{i:05}"))
            await asyncio.sleep(0.01)

    task = asyncio.create_task(write())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def get(session: aiohttp.ClientSession, url: str, **kwargs: Any) -> dict[str, Any]:
    async with session.get(url, **kwargs) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


async def test_lists_see_every_earlier_write_and_are_answered_by_the_hub(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, PATIENT) as running, aiohttp.ClientSession() as session:
        async with watching(running, session), writing(running):
            await wait_for(lambda: len(running.fake.store.list("pods", "default")) >= 20,
                           what="a busy collection")  # fmt: skip
            full_lists = len(upstream_lists(running))
            for round_ in range(3):
                # Written before the LISTs are sent: every answer must hold it.
                running.fake.store.create("pods", "default", pod(f"mark-{round_}"))
                # The first probe is held upstream until all 20 LISTs are in watchproxy, so
                # the other 19 share the next one: two probes for 20 LISTs, by construction.
                running.fake.faults.hold_lists(True)
                want = in_flight(running) + 20  # the client watch, and the 20
                calls = [asyncio.ensure_future(get(session, running.url + PODS)) for _ in range(20)]
                await wait_for(
                    lambda want=want: in_flight(running) == want and running.fake.faults.lists_held,
                    what="20 LISTs waiting on one probe",
                )
                running.fake.faults.hold_lists(False)
                for body in await asyncio.gather(*calls):
                    assert f"mark-{round_}" in names(body)
        assert outcome(running, "hub") == 60
        assert len(upstream_lists(running)) == full_lists  # no full LIST went upstream
        assert len(upstream_lists(running, "1")) == 6
        # Once writes stop, the hub's answer is the apiserver's, object for object.
        direct = running.fake.store.list("pods", "default")
        body = await get(session, running.url + PODS)
        assert versions(body["items"]) == versions(direct)


async def test_a_list_is_not_held_for_a_watch_that_lags(tmp_path: Any) -> None:
    """The watch lags 0.3 s behind the store: a LIST answered from it at once would miss
    "late", which was written before the LIST was sent, and a LIST held until the watch has it
    would be 0.3 s late. It is waited for only as long as an event on its way takes
    (freshwatch.IN_FLIGHT_SECONDS, even with a longer hub.consistent_list_wait_seconds), then
    sent upstream: the apiserver's answer, with "late", in about the time direct takes."""
    async with running_proxy(tmp_path, PATIENT) as running, aiohttp.ClientSession() as session:
        async with watching(running, session):
            for i in range(3):  # the collection moves: the hub would wait for it
                running.fake.store.create("pods", "default", pod(f"early-{i}"))
            (shared,) = running.proxy.hub.watches.values()  # type: ignore[union-attr]
            want = running.fake.store.resource_version
            await wait_for(lambda: shared.cache.resource_version == want, what="the writes")
            running.fake.faults.delay_watch_events(0.3)
            running.fake.store.create("pods", "default", pod("late"))
            loop = asyncio.get_running_loop()
            started = loop.time()
            body = await get(session, running.url + PODS)
            elapsed = loop.time() - started
            assert "late" in names(body)
        assert outcome(running, "behind") == 1 and outcome(running, "hub") == 0
        assert elapsed < 0.25


async def test_a_quiet_collection_is_listed_upstream_without_a_probe(tmp_path: Any) -> None:
    overrides = {"hub.consistent_list_wait_seconds": 0.05}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("only"))
        async with watching(running, session):
            (shared,) = running.proxy.hub.watches.values()  # type: ignore[union-attr]
            loop = asyncio.get_running_loop()
            # Quiet: nothing moved for 4 waits (0.2 s); time passing is the event here.
            await wait_for(
                lambda: shared.advanced_at is not None and loop.time() - shared.advanced_at > 0.3,
                what="the collection to be quiet",
            )
            assert names(await get(session, running.url + PODS)) == ["only"]
        assert outcome(running, "quiet") == 1 and outcome(running, "hub") == 0
        assert upstream_lists(running, "1") == []
        assert len(upstream_lists(running)) == 1  # the client's LIST, once


async def test_a_watch_that_does_not_catch_up_sends_the_list_upstream(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        async with watching(running, session), writing(running):
            await wait_for(lambda: outcome(running, "hub") >= 0 and
                           len(running.fake.store.list("pods", "default")) >= 5,
                           what="a busy collection")  # fmt: skip
            # The shared watch stays open but lags: its state is behind the probe's revision.
            assert running.fake.faults.lag_open_watches(5.0) >= 1
            running.fake.store.create("pods", "default", pod("unseen"))
            body = await get(session, running.url + PODS)
            assert "unseen" in names(body)
        assert outcome(running, "behind") == 1
        # What this fallback costs upstream: the probe (shared by the LISTs waiting with it)
        # and the client's LIST, sent once: the one fallback that still sends twice (and then
        # pauses the watch: see the next test).
        assert len(upstream_lists(running, "1")) == 1
        assert len(upstream_lists(running)) == 1


async def test_after_a_watch_left_a_list_behind_its_next_lists_go_upstream_once_each(
    tmp_path: Any,
) -> None:
    """A miss is a property of the watch (its collection is written less often than the wait,
    or its events lag), so it repeats: before, every LIST then cost a probe and its LIST. Now
    the first miss pauses the watch, and the LISTs after it cost one request each."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        async with watching(running, session), writing(running):
            await wait_for(lambda: len(running.fake.store.list("pods", "default")) >= 5,
                           what="a busy collection")  # fmt: skip
            assert running.fake.faults.lag_open_watches(5.0) >= 1
            before = len(running.fake.stats.requests)
            for i in range(4):
                running.fake.store.create("pods", "default", pod(f"unseen-{i}"))
                assert f"unseen-{i}" in names(await get(session, running.url + PODS))
            sent = [r for r in running.fake.stats.requests[before:] if not r.watch]
        assert (outcome(running, "behind"), outcome(running, "lagging")) == (1, 3), outcomes(
            running
        )
        # One probe, then the four LISTs: five requests for four, not eight.
        assert [parse_qs(r.query_string) for r in sent] == [{"limit": ["1"]}] + [{}] * 4


async def test_a_one_item_list_is_its_own_probe(tmp_path: Any) -> None:
    """A LIST with limit=1 is the probe's size: it is sent as it is, one request, even when the
    watch would have been behind (before: the probe, a wait, then the LIST)."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        async with watching(running, session), writing(running):
            await wait_for(lambda: len(running.fake.store.list("pods", "default")) >= 5,
                           what="a busy collection")  # fmt: skip
            assert running.fake.faults.lag_open_watches(5.0) >= 1
            before = len(running.fake.stats.requests)
            body = await get(session, running.url + PODS + "?limit=1")
            assert len(body["items"]) == 1 and body["metadata"]["continue"]
            sent = [r for r in running.fake.stats.requests[before:] if not r.watch]
        assert outcome(running, "one-item") == 1, outcomes(running)
        assert [parse_qs(r.query_string) for r in sent] == [{"limit": ["1"]}]


async def test_a_list_in_pages_is_answered_by_the_hub_at_one_revision(tmp_path: Any) -> None:
    """Page 1 from the hub once current, the next pages from its snapshot (no probe), all at
    page 1's revision while pods keep coming; the tokens are the apiserver's own, so the fake
    continues one the same way, and a token of the apiserver's goes upstream."""
    async with running_proxy(tmp_path, PATIENT) as running, aiohttp.ClientSession() as session:
        fake = {
            "headers": running.fake.auth_headers,
            "ssl": running.fake.client_ssl_context() or True,
        }
        async with watching(running, session), writing(running):
            await wait_for(lambda: len(running.fake.store.list("pods", "default")) >= 7,
                           what="seven pods")  # fmt: skip
            first = await get(session, running.url + PODS + "?limit=3")
            rv = first["metadata"]["resourceVersion"]
            items, body = list(first["items"]), first
            paging = len(running.fake.stats.requests)
            while body["metadata"].get("continue"):
                token = body["metadata"]["continue"]
                assert body["metadata"]["remainingItemCount"] > 0
                body = await get(session, running.url + PODS + f"?limit=3&continue={token}")
                assert body["metadata"]["resourceVersion"] == rv
                items += body["items"]
            assert "remainingItemCount" not in body["metadata"]
            # The pages from the snapshot cost the apiserver nothing.
            assert [r for r in running.fake.stats.requests[paging:] if not r.watch] == []
            pages = outcome(running, "page")
            # The same token, continued by the apiserver itself.
            token = first["metadata"]["continue"]
            upstream = await get(session, running.fake.url + PODS + f"?continue={token}", **fake)
            # A token of the apiserver's own at a later revision: no snapshot of that here, so
            # it goes upstream (at page 1's revision the snapshot would answer, rightly).
            await wait_for(lambda: running.fake.store.resource_version > int(rv),
                           what="a newer revision")  # fmt: skip
            theirs = await get(session, running.fake.url + PODS + "?limit=2", **fake)
            their_token = theirs["metadata"]["continue"]
            gone = len(running.fake.stats.requests)
            rest = await get(session, running.url + PODS + f"?continue={their_token}")
            # One request for it: the continuation as sent, no probe.
            sent = [r.query_string for r in running.fake.stats.requests[gone:] if not r.watch]
            assert sent == [f"continue={their_token}"]
        exact = await get(session, running.url + PODS + f"?resourceVersion={rv}"
                          "&resourceVersionMatch=Exact")  # fmt: skip
    assert [i["metadata"]["name"] for i in items] == [i["metadata"]["name"] for i in exact["items"]]
    assert versions(items) == versions(exact["items"])
    assert versions(upstream["items"]) == versions(items[3:])
    assert outcome(running, "hub") == 1 and pages == len(items) // 3 + (len(items) % 3 > 0) - 1
    assert outcome(running, "page-gone") == 1 and rest["items"]
    assert rest["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]


async def test_a_table_list_is_answered_from_a_table_watch(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, PATIENT) as running, aiohttp.ClientSession() as session:
        async with watching(running, session, {"Accept": TABLE}), writing(running):
            running.fake.store.create("pods", "default", pod("mark"))
            async with session.get(running.url + PODS, headers={"Accept": TABLE}) as response:
                assert response.status == 200
                table = await response.json()
        assert table["kind"] == "Table"
        assert "mark" in [row["object"]["metadata"]["name"] for row in table["rows"]]
        assert outcome(running, "hub") == 1, outcomes(running)


async def test_a_namespaced_list_is_answered_from_a_cluster_wide_watch(tmp_path: Any) -> None:
    """An informer watching all pods answers ``kubectl get pods -n other`` too."""
    other = "/api/v1/namespaces/other/pods"
    async with running_proxy(tmp_path, PATIENT) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        store.create("namespaces", None, {"metadata": {"name": "other"}})
        for i in range(3):
            store.create("pods", "other", pod(f"o{i}"))
        async with watching(running, session, path="/api/v1/pods"), writing(running):
            store.create("pods", "other", pod("mark"))
            body = await get(session, running.url + other)
            assert names(body) == ["mark", "o0", "o1", "o2"]
            assert outcome(running, "hub") == 1
            cached = await get(session, running.url + PODS + "?resourceVersion=0")
            assert cached["items"] and all(
                i["metadata"]["namespace"] == "default" for i in cached["items"]
            )
            registry = running.proxy.metrics.registry
            assert registry.get_sample_value("watchproxy_lists_from_cache_total") == 1
        body = await get(session, running.url + other)
        assert versions(body["items"]) == versions(store.list("pods", "other"))
        lists = [r for r in running.fake.stats.requests if r.path == other and not r.watch]
        assert [r.query_string for r in lists] == ["limit=1", "limit=1"]  # probes only


async def test_hub_lists_come_in_the_apiservers_key_order(tmp_path: Any) -> None:
    """By "namespace/name" bytes, as etcd sorts: "a-b/x" before "a/x" ("-" sorts before "/"),
    and objects created after the watch synced in their place, not at the end."""
    everywhere = "/api/v1/pods"
    async with running_proxy(tmp_path, PATIENT) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        for namespace in ("a", "a-b", "a.b", "a0"):
            store.create("namespaces", None, {"metadata": {"name": namespace}})
        store.create("pods", "a", pod("m"))
        async with watching(running, session, path=everywhere), writing(running):
            for namespace, name in (("a0", "z"), ("a", "b"), ("a-b", "y"), ("a.b", "c")):
                store.create("pods", namespace, pod(name))
            consistent = await get(session, running.url + everywhere)
            cached = await get(session, running.url + everywhere + "?resourceVersion=0")
            assert outcome(running, "hub") == 1
        oracle = await get(session, running.url + everywhere)  # no watch left: the fake's

    def keys(body: dict[str, Any]) -> list[str]:
        return [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in body["items"]]

    ours = [k for k in keys(consistent) if not k.startswith("default/")]
    assert ours == ["a-b/y", "a.b/c", "a/b", "a/m", "a0/z"]
    seen = set(keys(consistent))  # the pods written later are in the oracle only
    assert [k for k in keys(oracle) if k in seen] == keys(consistent)
    assert [k for k in keys(cached) if not k.startswith("default/")] == ours


async def test_a_refused_probe_is_the_clients_answer_and_no_list_follows_it(
    tmp_path: Any,
) -> None:
    """The probe carries the LIST's path, selectors and credential, so its error answer is the
    one the LIST would get: the client gets it, and nothing else goes upstream (before: the
    probe, then the client's LIST, two requests)."""
    async with running_proxy(tmp_path, PATIENT) as running, aiohttp.ClientSession() as session:
        async with watching(running, session), writing(running):
            await wait_for(
                lambda: len(running.fake.store.list("pods", "default")) >= 5,
                what="a busy collection",
            )
            before = len(running.fake.stats.requests)
            running.fake.faults.fail_next(1, 500)
            async with session.get(running.url + PODS) as response:
                assert response.status == 500
                assert "injected failure" in (await response.json())["message"]
            sent = running.fake.stats.requests[before:]
        assert outcome(running, "probe-failed") == 1
        assert [(r.path, parse_qs(r.query_string)) for r in sent] == [(PODS, {"limit": ["1"]})]


async def test_a_probe_answer_without_a_revision_pauses_the_watch(tmp_path: Any) -> None:
    """A probe that answers 200 without a revision to wait for (here: a first object larger
    than a probe may be) sends the LIST upstream after it, and the next LISTs go upstream
    without a probe: two LISTs cost three requests, not four."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        huge = pod("a-huge")  # first in key order: the probe's one item
        huge["metadata"]["annotations"] = {"big": "x" * (5 * 2**20)}
        running.fake.store.create("pods", "default", huge)
        async with watching(running, session), writing(running):
            await wait_for(lambda: len(running.fake.store.list("pods", "default")) >= 5,
                           what="a busy collection")  # fmt: skip
            before = len(running.fake.stats.requests)
            for _ in range(2):
                assert "a-huge" in names(await get(session, running.url + PODS))
            sent = [r for r in running.fake.stats.requests[before:] if not r.watch]
        assert (outcome(running, "probe-failed"), outcome(running, "lagging")) == (1, 1), outcomes(
            running
        )
        assert [parse_qs(r.query_string) for r in sent] == [{"limit": ["1"]}, {}, {}]


def test_the_probe_keeps_the_lists_selectors_and_asks_for_one_item() -> None:
    target = PODS + "?labelSelector=app%3Dx&limit=500&fieldSelector=a%3Db&timeoutSeconds=9"
    assert probe_target(target) == PODS + "?labelSelector=app%3Dx&fieldSelector=a%3Db&limit=1"
    assert probe_target(PODS) == PODS + "?limit=1"


async def test_a_list_while_the_shared_watch_backs_off_goes_upstream_once_without_a_probe(
    tmp_path: Any,
) -> None:
    """A shared watch that is backing off cannot catch up in time: the LIST is sent upstream
    at once, one request (before: a probe, a wait, then the LIST)."""
    overrides = {
        **PATIENT,
        "backoff.initial_seconds": 30.0,
        "backoff.probe_max_seconds": 30.0,
        "backoff.jitter": "none",
    }
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        async with watching(running, session), writing(running):
            (shared,) = running.proxy.hub.watches.values()  # type: ignore[union-attr]
            await wait_for(lambda: outcome(running, "hub") >= 0 and
                           len(running.fake.store.list("pods", "default")) >= 5,
                           what="a busy collection")  # fmt: skip
            # Its watch is cut: it backs off (30 s) before it watches again.
            running.fake.faults.cut_watches()
            await wait_for(
                lambda: shared.state.value == "backing-off", what="the shared watch backing off"
            )
            before = len(running.fake.stats.requests)
            running.fake.store.create("pods", "default", pod("unseen"))
            assert "unseen" in names(await get(session, running.url + PODS))
            sent = running.fake.stats.requests[before:]
        assert outcome(running, "not-watching") == 1
        assert [(r.path, r.query_string) for r in sent if not r.watch] == [(PODS, "")]
