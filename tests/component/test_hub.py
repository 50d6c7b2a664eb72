"""The watch hub against the fake apiserver: one upstream watch per key, exact client streams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tests.harness import Running, read_watch, running_proxy, rv_of, wait_for

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, app: str = "web", phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": phase},
    }


def set_phase(phase: str) -> Any:
    def apply(obj: dict[str, Any]) -> None:
        obj.setdefault("status", {})["phase"] = phase

    return apply


def watch_opens(running: Running, path: str = PODS) -> int:
    return sum(1 for p in running.fake.stats.watch_paths if p == path)


def names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in events]


async def test_identical_watches_share_one_upstream_watch(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        for i in range(3):
            store.create("pods", "default", pod(f"web-{i}"))
        store.create("pods", "default", pod("db-0", app="db"))
        web = running.url + PODS + "?watch=true&labelSelector=app%3Dweb"
        db = running.url + PODS + "?watch=true&labelSelector=app%3Ddb"

        def until(count: int) -> Any:
            return lambda events: len(events) >= count

        web_clients = [read_watch(session, web, until=until(3 + 10)) for _ in range(10)]
        db_clients = [read_watch(session, db, until=until(1 + 10)) for _ in range(5)]
        tasks = [asyncio.ensure_future(c) for c in web_clients + db_clients]
        await running.fake.stats.wait_until(lambda s: s.active_watches >= 2)
        # Every client subscribed before the churn starts (a client joining a running shared
        # watch first checks that its state is current: see hub/freshwatch.py).
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: sum(len(w.cursors) for w in hub.watches.values()) == 15)
        for i in range(10):
            store.modify("pods", "default", f"web-{i % 3}", set_phase(f"P{i}"))
            store.modify("pods", "default", "db-0", set_phase(f"P{i}"))
        results = await asyncio.wait_for(asyncio.gather(*tasks), 20)

        assert watch_opens(running) == 2  # one upstream watch per distinct selector
        first_web = results[0]
        assert names(first_web[:3]) == [("ADDED", f"web-{i}") for i in range(3)]
        for events in results[:10]:
            assert events == first_web
            rvs = [rv_of(e) for e in events[3:]]
            assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
        for events in results[10:]:
            assert events == results[10]
            assert all(e["object"]["metadata"]["labels"]["app"] == "db" for e in events)


async def test_resource_version_semantics(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        created = [store.create("pods", "default", pod(f"p{i}")) for i in range(3)]
        # Warm the shared watch so that later starts are served from its history.
        warm = await read_watch(
            session, running.url + PODS + "?watch=1", until=lambda e: len(e) == 3
        )
        assert {n for _, n in names(warm)} == {"p0", "p1", "p2"}
        assert created
        # History starts at the shared watch's list: replay from an RV inside it.
        mid_rv = store.modify("pods", "default", "p1", set_phase("Running"))["metadata"][
            "resourceVersion"
        ]
        store.create("pods", "default", pod("p3"))
        store.modify("pods", "default", "p0", set_phase("Running"))

        def stream(query: str, count: int) -> Any:
            return read_watch(session, running.url + PODS + query, until=lambda e: len(e) >= count)

        await asyncio.sleep(0.2)  # let the shared watch take in the changes
        unset = await stream("?watch=1", 4)
        zero = await stream("?watch=1&resourceVersion=0", 4)
        assert {e["type"] for e in unset} == {e["type"] for e in zero} == {"ADDED"}
        assert {n for _, n in names(unset)} == {"p0", "p1", "p2", "p3"}
        replay = await stream(f"?watch=1&resourceVersion={mid_rv}", 2)
        assert names(replay) == [("ADDED", "p3"), ("MODIFIED", "p0")]
        assert all(rv_of(e) > int(mid_rv) for e in replay)
        # The upstream saw one watch for all of this.
        assert watch_opens(running) == 1


async def test_rv_older_than_window_gets_the_apiservers_answer(tmp_path: Any) -> None:
    """Older than the hub's history: passed through, never a 410 the apiserver would not give."""
    overrides = {"hub.history_size": 3}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        first = store.create("pods", "default", pod("p"))
        await read_watch(session, running.url + PODS + "?watch=1", until=lambda e: len(e) == 1)
        for i in range(6):
            store.modify("pods", "default", "p", set_phase(f"P{i}"))
        await asyncio.sleep(0.2)
        old_rv = first["metadata"]["resourceVersion"]
        url = running.url + PODS + f"?watch=1&resourceVersion={old_rv}&timeoutSeconds=1"
        # The apiserver still has that history: the client gets all six changes from it.
        replay = await read_watch(session, url, until=lambda e: len(e) == 6)
        assert [(e["type"], e["object"]["status"]["phase"]) for e in replay] == [
            ("MODIFIED", f"P{i}") for i in range(6)
        ]
        passed = running.proxy.metrics.passthrough_watches.labels("outside-window")
        assert passed._value.get() == 1  # type: ignore[attr-defined]
        # Once the apiserver has compacted it, the 410 the client gets is the apiserver's own.
        store.compact()
        async with session.get(url) as response:
            assert response.status == 200
            body = await asyncio.wait_for(response.read(), 5)
        lines = body.splitlines()
        assert len(lines) == 1
        event = json.loads(lines[0])
        assert event["type"] == "ERROR"
        assert event["object"]["code"] == 410
        assert event["object"]["reason"] == "Expired"
        assert running.proxy.metrics.expired._value.get() == 0  # type: ignore[attr-defined]


async def test_bookmarks_only_for_clients_that_asked(tmp_path: Any) -> None:
    overrides = {"hub.bookmark_interval_seconds": 0.2}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("p"))
        with_bookmarks = await read_watch(
            session,
            running.url + PODS + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=1",
            until=lambda e: False,
        )
        without = await read_watch(
            session, running.url + PODS + "?watch=1&timeoutSeconds=1", until=lambda e: False
        )
        bookmarks = [e for e in with_bookmarks if e["type"] == "BOOKMARK"]
        assert len(bookmarks) >= 2
        assert bookmarks[0]["object"]["kind"] == "Pod"
        # A watch from "now" that allows bookmarks is a watch-list (kube-apiserver 1.34 on):
        # its initial events end with the annotated bookmark; the periodic ones carry only
        # the resourceVersion.
        end = bookmarks[0]["object"]["metadata"]
        assert end["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert set(bookmarks[1]["object"]["metadata"]) == {"resourceVersion"}
        assert [e["type"] for e in without] == ["ADDED"]


async def test_timeout_seconds_ends_with_clean_eof(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with session.get(running.url + PODS + "?watch=1&timeoutSeconds=1") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("application/json")
            body = await asyncio.wait_for(response.read(), 5)  # raises if the end is not clean
        elapsed = loop.time() - started
        assert body == b""
        assert 0.9 <= elapsed < 3


async def test_send_initial_events_ends_with_annotated_bookmark(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        for i in range(2):
            running.fake.store.create("pods", "default", pod(f"p{i}"))
        query = (
            "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
            "&allowWatchBookmarks=true"
        )
        events = await read_watch(session, running.url + PODS + query, until=lambda e: len(e) == 3)
        assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
        annotations = events[2]["object"]["metadata"]["annotations"]
        assert annotations == {"k8s.io/initial-events-end": "true"}


async def test_upstream_410_relists_without_breaking_client_streams(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        for i in range(3):
            store.create("pods", "default", pod(f"p{i}"))
        events: list[dict[str, Any]] = []
        done = asyncio.Event()

        async def follow() -> None:
            async with session.get(running.url + PODS + "?watch=1") as response:
                async for raw in response.content:
                    events.append(json.loads(raw))
                    if ("DELETED", "p1") in names(events) and ("ADDED", "p9") in names(events):
                        done.set()
                        return

        task = asyncio.ensure_future(follow())
        await running.fake.stats.wait_until(lambda s: s.active_watches >= 1)
        await asyncio.sleep(0.1)
        # While the upstream watch is down, things change and history is compacted away.
        await running.fake.faults.outage("refuse")
        store.delete("pods", "default", "p1")
        store.create("pods", "default", pod("p9"))
        store.modify("pods", "default", "p0", set_phase("Running"))
        store.compact()
        await running.fake.faults.recover()
        await asyncio.wait_for(done.wait(), 20)
        await asyncio.wait_for(task, 5)
        state = {n: t for t, n in names(events)}
        assert state == {"p0": "MODIFIED", "p1": "DELETED", "p2": "ADDED", "p9": "ADDED"}
        rvs = [rv_of(e) for e in events[3:]]
        assert rvs == sorted(rvs)
        assert running.proxy.metrics.relists._value.get() >= 1  # type: ignore[attr-defined]


async def test_watch_the_hub_cannot_serve_passes_through(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("p"))
        headers = {"Accept": "application/vnd.kubernetes.protobuf, application/json"}
        async with session.get(
            running.url + PODS + "?watch=1&timeoutSeconds=1", headers=headers
        ) as response:
            await response.read()
        assert watch_opens(running) == 1
        [record] = [r for r in running.fake.stats.requests if r.watch]
        assert "timeoutSeconds=1" in record.query_string  # forwarded exactly as the client sent it


async def test_a_client_that_reads_nothing_is_ended_alone(tmp_path: Any) -> None:
    overrides = {
        "hub.slow_subscriber_timeout_seconds": 1.0,
        "hub.history_size": 50,
        "hub.max_subscriber_lag": 40,
    }
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        store.create("pods", "default", pod("big"))
        hub = running.proxy.hub
        assert hub is not None
        # A client that sends its watch request and then never reads a byte.
        _reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        writer.write(f"GET {PODS}?watch=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        await wait_for_clients(hub, 1)
        healthy: list[dict[str, Any]] = []

        async def follow() -> None:
            async with session.get(running.url + PODS + "?watch=1") as response:
                async for raw in response.content:
                    healthy.append(json.loads(raw))
                    if len(healthy) == 1 + 200:
                        return

        task = asyncio.ensure_future(follow())
        await wait_for_clients(hub, 2)
        # Both subscribed before the changes start: a client that joins later starts from a
        # newer state, with fewer changes to come than this test waits for.
        await wait_for(lambda: sum(len(w.cursors) for w in hub.watches.values()) == 2)
        blob = "x" * 65536  # big events fill the stalled client's socket buffers quickly
        for i in range(200):
            store.modify("pods", "default", "big", annotate(blob, i))
            if i % 20 == 19:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(task, 30)
        rvs = [rv_of(e) for e in healthy[1:]]
        assert len(rvs) == 200 and rvs == sorted(set(rvs))  # the healthy client got everything
        await wait_for_clients(hub, 0, timeout=15)
        assert running.proxy.metrics.slow_subscribers._value.get() == 1  # type: ignore[attr-defined]
        assert all(w.cache.history_len() <= 50 for w in hub.watches.values())
        writer.close()


def annotate(blob: str, i: int) -> Any:
    def apply(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("annotations", {})["blob"] = f"{i}-{blob}"

    return apply


async def wait_for_clients(hub: Any, count: int, timeout: float = 10) -> None:
    from tests.harness import wait_for

    await wait_for(lambda: hub.active_clients == count, timeout=timeout, what=f"{count} clients")


async def test_a_watch_event_bigger_than_aiohttps_line_limit_is_shared(tmp_path: Any) -> None:
    """etcd allows 1.5 MiB objects; aiohttp's readline stops at 512 KiB."""
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        url = running.url + "/api/v1/namespaces/default/configmaps?watch=1"
        events: list[dict[str, Any]] = []

        async def follow() -> None:
            async with session.get(url) as response:
                buffer = b""
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        events.append(json.loads(line))
                        return

        task = asyncio.ensure_future(follow())
        hub = running.proxy.hub
        assert hub is not None
        await wait_for_clients(hub, 1)
        await wait_for_synced(hub)
        big = {"metadata": {"name": "big"}, "data": {"blob": "y" * (1536 * 1024)}}
        running.fake.store.create("configmaps", "default", big)
        await asyncio.wait_for(task, 20)
        assert events[0]["type"] == "ADDED"
        assert len(events[0]["object"]["data"]["blob"]) == 1536 * 1024


async def wait_for_synced(hub: Any) -> None:
    from tests.harness import wait_for

    await wait_for(lambda: all(w.cache.synced for w in hub.watches.values()), what="synced")


async def test_an_upstream_that_ends_watches_at_once_is_backed_off(tmp_path: Any) -> None:
    # timeoutSeconds=0 upstream ends each watch the moment it starts, with no event.
    overrides = {
        "hub.upstream_watch_min_seconds": 0,
        "hub.upstream_watch_max_seconds": 0,
        "backoff.initial_seconds": 0.2,
    }
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        async with session.get(running.url + PODS + "?watch=1&timeoutSeconds=2") as response:
            assert response.status == 200
            await response.read()  # the client's own stream lasts its full 2 s
        # 2 s of instant upstream endings: the backoff (0.2, 0.4, 0.8, ...) allows a handful.
        assert watch_opens(running) <= 6, watch_opens(running)


async def test_a_paced_fanout_batches_events_and_every_client_gets_the_apiservers_record(
    tmp_path: Any,
) -> None:
    # A share so small that every pass is followed by the whole max delay: events that come
    # during the pause are held and go out together. The clients must not see the difference.
    pacing = {"hub.fanout_cpu_share": 0.0001, "hub.fanout_max_delay_seconds": 0.05}
    async with (
        running_proxy(tmp_path, pacing) as running,
        aiohttp.ClientSession() as session,
    ):
        store = running.fake.store
        start_rv = store.create("pods", "default", pod("web-0"))["metadata"]["resourceVersion"]
        changes = 60
        url = running.url + PODS + f"?watch=true&resourceVersion={start_rv}"
        clients = [
            asyncio.ensure_future(read_watch(session, url, until=lambda e: len(e) >= changes))
            for _ in range(20)
        ]
        await wait_for(
            lambda: running.proxy.metrics.subscribers.labels("v1/pods")._value.get() == 20
        )  # type: ignore[attr-defined]
        received = running.proxy.metrics.events_received.labels("v1/pods")
        base = received._value.get()  # type: ignore[attr-defined]

        def upstream_has(count: int) -> bool:
            return bool(received._value.get() >= base + count)  # type: ignore[attr-defined]

        for i in range(changes):
            store.modify("pods", "default", "web-0", set_phase(f"P{i}"))
            # One event per read upstream, so that only the pacing can put several in a write.
            await wait_for(lambda: upstream_has(i + 1), what="the event upstream")  # noqa: B023
        results = await asyncio.wait_for(asyncio.gather(*clients), 20)

        record = store.changes_since("pods", int(start_rv))
        expected = [(c.type, c.rv) for c in record]
        assert len(expected) == changes
        for events in results:
            assert [(e["type"], int(rv_of(e))) for e in events] == expected
        registry = running.proxy.metrics.registry
        passes = registry.get_sample_value(
            "watchproxy_fanout_delay_seconds_count", {"resource": "v1/pods"}
        )
        held = registry.get_sample_value(
            "watchproxy_fanout_delay_seconds_sum", {"resource": "v1/pods"}
        )
        assert passes is not None and held is not None
        assert passes < changes / 2  # several events to a write
        assert held > 0.05


async def test_a_client_that_leaves_a_quiet_watch_is_noticed_and_the_others_stay(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running:
        store = running.fake.store
        store.create("pods", "default", pod("web-0"))
        url = running.url + PODS + "?watch=true"
        subscribers = running.proxy.metrics.subscribers.labels("v1/pods")
        sessions = [aiohttp.ClientSession() for _ in range(3)]
        responses: list[aiohttp.ClientResponse] = []
        try:
            responses += [await session.get(url) for session in sessions]
            for response in responses:
                assert (await response.content.readline()).startswith(b'{"type":"ADDED"')
            assert subscribers._value.get() == 3  # type: ignore[attr-defined]
            await sessions[1].close()  # its connection closes; the key stays quiet
            await wait_for(lambda: subscribers._value.get() == 2, timeout=15, what="the sweep")  # type: ignore[attr-defined]
            store.modify("pods", "default", "web-0", set_phase("Running"))
            for response in (responses[0], responses[2]):
                line = json.loads(await asyncio.wait_for(response.content.readline(), 5))
                assert line["type"] == "MODIFIED"
        finally:
            for response in responses:
                response.close()
            for session in sessions:
                await session.close()
