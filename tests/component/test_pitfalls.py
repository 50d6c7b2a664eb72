"""Bugs that comparable systems shipped (../shared/PITFALLS.md), one test each, named after the
failure they guard against. docs/pitfalls.md maps every item to its test; items that a test
elsewhere in the suite already pins are named there rather than repeated here."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest

from tests.harness import make_config, read_watch, running_proxy, rv_of, wait_for
from watchproxy.app import Proxy
from watchproxy.upstream.credentials import from_kubeconfig

PODS = "/api/v1/namespaces/default/pods"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
FAST_BACKOFF = {"backoff.initial_seconds": 0.05, "backoff.max_seconds": 0.3}


def pod(name: str, app: str = "web") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def annotate(value: str) -> Any:
    def apply(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("annotations", {})["step"] = value

    return apply


class Stream:
    """One client watch held open; events are collected as they arrive and can be awaited."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.status: int | None = None
        self._changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._run(session, url))

    async def _run(self, session: aiohttp.ClientSession, url: str) -> None:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as response:
                self.status = response.status
                self._changed.set()
                async for raw in response.content:
                    if raw.strip():
                        self.events.append(json.loads(raw))
                        self._changed.set()
        finally:
            self._changed.set()  # a waiter learns of the end now, not at its timeout

    async def wait(self, predicate: Any, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self):
                if self._task.done():
                    self._task.result()
                    raise AssertionError(f"the stream ended early after {self.events[-3:]}")
                self._changed.clear()
                await self._changed.wait()

    def seen(self, kind: str, name: str) -> bool:
        return any(
            e["type"] == kind and e["object"]["metadata"].get("name") == name for e in self.events
        )

    def changes(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] in ("ADDED", "MODIFIED", "DELETED")]

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def lists_after(records: list[Any], since: float, path: str = PODS) -> list[Any]:
    return [r for r in records if r.path == path and not r.watch and r.time >= since]


def watches_after(records: list[Any], since: float, path: str = PODS) -> list[Any]:
    return [r for r in records if r.path == path and r.watch and r.time >= since]


# 2 -----------------------------------------------------------------------------------------
async def test_a_missing_resource_does_not_slow_the_other_shared_watches(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        missing = Stream(s, running.url + "/apis/example.com/v1/namespaces/default/widgets?watch=1")
        pods = Stream(s, running.url + PODS + "?watch=1")
        await running.fake.stats.wait_until(lambda st: st.active_watches >= 1)
        await missing.wait(lambda st: st.status is not None, timeout=5)
        assert missing.status == 404  # the apiserver's own answer, not a hang
        for i in range(5):
            written = time.monotonic()
            running.fake.store.create("pods", "default", pod(f"p{i}"))
            await pods.wait(lambda st, i=i: st.seen("ADDED", f"p{i}"), timeout=2)
            assert time.monotonic() - written < 1.0
        await missing.close()
        await pods.close()


# 3 -----------------------------------------------------------------------------------------
async def test_fifty_upstream_drops_leave_the_shared_watch_live_and_readiness_true(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        stream = Stream(s, running.url + PODS + "?watch=1")
        stats = running.fake.stats
        for _ in range(50):
            await stats.wait_until(lambda st: st.active_watches >= 1, within=10)
            assert running.fake.faults.cut_watches() >= 1
        await stats.wait_until(lambda st: st.active_watches >= 1, within=10)
        running.fake.store.create("pods", "default", pod("after-the-drops"))
        await stream.wait(lambda st: st.seen("ADDED", "after-the-drops"))
        assert [e["object"]["metadata"]["name"] for e in stream.changes()] == ["after-the-drops"]
        async with s.get(running.admin_url + "/readyz") as ready:
            assert ready.status == 200
        await stream.close()


# 4 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["http-status", "in-stream"])
async def test_a_410_on_resume_relists_once_instead_of_retrying_the_same_rv(
    tmp_path: Any, form: str
) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        store, faults, stats = running.fake.store, running.fake.faults, running.fake.stats
        store.create("pods", "default", pod("before"))
        stream = Stream(s, running.url + PODS + "?watch=1")
        await stream.wait(lambda st: st.seen("ADDED", "before"))
        since = time.monotonic()
        if form == "http-status":
            faults.fail_next(1, 410)  # the resume request itself answers 410
        else:
            store.create("pods", "default", pod("compacted-away"))
            store.compact()  # the resume gets an in-stream 410 ERROR event
        faults.cut_watches()
        await wait_for(lambda: len(lists_after(stats.requests, since)) >= 1, what="a relist")
        store.create("pods", "default", pod("after"))
        await stream.wait(lambda st: st.seen("ADDED", "after"))
        assert len(lists_after(stats.requests, since)) == 1
        assert len(watches_after(stats.requests, since)) <= 3
        await stream.close()


# 5 -----------------------------------------------------------------------------------------
async def test_a_resource_version_ahead_of_the_proxy_waits_instead_of_jumping(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as s:
        store = running.fake.store
        store.create("pods", "default", pod("a"))
        warm = Stream(s, running.url + PODS + "?watch=1")
        await warm.wait(lambda st: st.seen("ADDED", "a"))
        ahead = store.resource_version + 2  # as if the client had talked to a fresher apiserver
        client = Stream(s, running.url + PODS + f"?watch=1&resourceVersion={ahead}")
        opens_before = running.fake.stats.watch_opens()
        await client.wait(lambda st: st.status is not None)
        assert client.status == 200
        for step in range(4):
            store.modify("pods", "default", "a", annotate(str(step)))
        await client.wait(lambda st: len(st.changes()) >= 2)
        assert [rv_of(e) for e in client.changes()] == [ahead + 1, ahead + 2]
        assert not any(e["type"] == "ERROR" for e in client.events)
        assert running.fake.stats.watch_opens() - opens_before <= 1  # no tight loop upstream
        await warm.close()
        await client.close()


# 8 -----------------------------------------------------------------------------------------
async def test_relists_are_served_by_the_apiserver_cache_not_etcd(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        store, stats = running.fake.store, running.fake.stats
        store.create("pods", "default", pod("a"))
        stream = Stream(s, running.url + PODS + "?watch=1")
        await stream.wait(lambda st: st.seen("ADDED", "a"))
        since = time.monotonic()
        store.create("pods", "default", pod("b"))
        store.compact()
        running.fake.faults.cut_watches()
        await wait_for(lambda: len(lists_after(stats.requests, since)) >= 1, what="a relist")
        query = parse_qs(lists_after(stats.requests, since)[0].query_string)
        match = query.get("resourceVersionMatch", [""])[0]
        rv = query.get("resourceVersion", [""])[0]
        assert rv == "0" or (rv not in ("", "0") and match == "NotOlderThan")
        await stream.close()


# 9 -----------------------------------------------------------------------------------------
async def test_initial_events_are_not_sent_again_when_the_upstream_resumes(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        store = running.fake.store
        for i in range(3):
            store.create("pods", "default", pod(f"p{i}"))
        url = (
            running.url + PODS + "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
            "&resourceVersionMatch=NotOlderThan"
        )
        stream = Stream(s, url)

        def initial_end(st: Stream) -> bool:
            return any(
                e["type"] == "BOOKMARK"
                and e["object"]["metadata"].get("annotations", {}).get("k8s.io/initial-events-end")
                for e in st.events
            )

        await stream.wait(initial_end)
        for _ in range(3):
            await running.fake.stats.wait_until(lambda st: st.active_watches >= 1)
            running.fake.faults.cut_watches()
        store.modify("pods", "default", "p1", annotate("x"))
        await stream.wait(lambda st: st.seen("MODIFIED", "p1"))
        assert [e["type"] for e in stream.changes()] == ["ADDED"] * 3 + ["MODIFIED"]
        await stream.close()


# 11 ----------------------------------------------------------------------------------------
async def test_upstream_watches_and_tasks_return_to_baseline_after_the_last_client(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as s:
        baseline_tasks = len(asyncio.all_tasks())
        streams = [
            Stream(s, running.url + path + "?watch=1")
            for path in (PODS, PODS, CONFIGMAPS, CONFIGMAPS, PODS)
        ]
        await running.fake.stats.wait_until(lambda st: st.active_watches == 2)
        for stream in streams:
            await stream.close()
        await running.fake.stats.wait_until(lambda st: st.active_watches == 0, within=10)
        # The shared watches' LISTs left keep-alive connections in the pool (bounded, closed
        # after their idle time); the in-process fake holds a task for each. They are not
        # what this test is after.
        running.proxy.upstream.close_idle_connections()
        await wait_for(
            lambda: len(asyncio.all_tasks()) <= baseline_tasks, what="tasks back to baseline"
        )
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: len(hub.debug()) == 0, what="no shared watch left")


# 14 ----------------------------------------------------------------------------------------
async def test_a_cold_start_during_an_outage_never_serves_an_empty_list(tmp_path: Any) -> None:
    from kubefake import FakeApiServer

    async with FakeApiServer(bookmark_interval=0.5) as fake:
        fake.store.create("pods", "default", pod("exists"))
        kubeconfig = fake.write_kubeconfig(str(tmp_path / "upstream.kubeconfig"))
        await fake.faults.outage("reset")
        proxy = Proxy(make_config(FAST_BACKOFF), from_kubeconfig(kubeconfig), rng=random.Random(1))
        await proxy.start()
        try:
            base = f"http://127.0.0.1:{proxy.api_port}"
            async with aiohttp.ClientSession() as s:
                for query in ("", "?resourceVersion=0", "?resourceVersion=0&limit=500"):
                    async with s.get(base + PODS + query) as response:
                        body = await response.json()
                        assert response.status == 503, body
                        assert body["kind"] == "Status"
                async with s.get(f"http://127.0.0.1:{proxy.admin_port}/readyz") as ready:
                    assert ready.status == 503
        finally:
            await proxy.stop()


# 15 ----------------------------------------------------------------------------------------
async def test_readiness_metrics_and_debug_view_say_when_data_is_stale(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        stream = Stream(s, running.url + PODS + "?watch=1")
        await running.fake.stats.wait_until(lambda st: st.active_watches >= 1)
        await running.fake.faults.outage("reset")
        await wait_for(lambda: not running.proxy.connectivity.up, what="the outage to be seen")
        async with s.get(running.admin_url + "/readyz") as ready:
            assert ready.status == 503
        async with s.get(running.admin_url + "/metrics") as metrics:
            assert "watchproxy_upstream_up 0.0" in await metrics.text()
        async with s.get(running.admin_url + "/debug/watches") as debug:
            [watch] = (await debug.json())["watches"]
        assert watch["state"] != "watching"  # the shared watch says it is not live
        await running.fake.faults.recover()
        await wait_for(lambda: running.proxy.connectivity.up, timeout=10, what="recovery")
        async with s.get(running.admin_url + "/readyz") as ready:
            assert ready.status == 200
        await stream.close()


# 16 ----------------------------------------------------------------------------------------
async def test_a_quiet_watch_gets_its_headers_at_once_and_each_event_alone(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as s:
        started = time.monotonic()
        async with s.get(running.url + CONFIGMAPS + "?watch=1") as response:
            assert response.status == 200
            assert time.monotonic() - started < 1.0
            assert response.headers["Content-Type"].startswith("application/json")
            for i in range(3):
                running.fake.store.create("configmaps", "default", {"metadata": {"name": f"c{i}"}})
                line = await asyncio.wait_for(response.content.readline(), 2)
                assert json.loads(line)["object"]["metadata"]["name"] == f"c{i}"


# 18 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        *("/version", "/api", "/apis", "/api/v1", "/apis/apps/v1", "/openapi/v3"),
        # ... and with a trailing slash, as some clients ask (kube-apiserver serves them alike).
        *("/version/", "/api/", "/apis/", "/api/v1/", "/apis/apps/", "/apis/apps/v1/"),
    ],
)
async def test_discovery_openapi_and_version_pass_through_unchanged(
    tmp_path: Any, path: str
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {running.fake.token}"}
        async with s.get(running.fake.url + path, headers=headers, ssl=False) as direct:
            direct_status, direct_body = direct.status, await direct.read()
        async with s.get(running.url + path) as proxied:
            assert proxied.status == direct_status == 200
            assert await proxied.read() == direct_body


# 22 ----------------------------------------------------------------------------------------
async def test_an_upstream_429_on_a_watch_is_waited_out_and_rewatched_not_relisted(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        store, faults, stats = running.fake.store, running.fake.faults, running.fake.stats
        store.create("pods", "default", pod("a"))
        stream = Stream(s, running.url + PODS + "?watch=1")
        await stream.wait(lambda st: st.seen("ADDED", "a"))
        since = time.monotonic()
        faults.fail_next(1, 429, retry_after=1.0)
        faults.cut_watches()
        await wait_for(lambda: len(watches_after(stats.requests, since)) >= 2, what="a re-watch")
        first, second = watches_after(stats.requests, since)[:2]
        assert second.time - first.time >= 0.9  # Retry-After honoured
        assert lists_after(stats.requests, since) == []  # a re-watch, not a relist
        store.create("pods", "default", pod("b"))
        await stream.wait(lambda st: st.seen("ADDED", "b"))
        assert [e["object"]["metadata"]["name"] for e in stream.changes()] == ["a", "b"]
        await stream.close()


# 24 ----------------------------------------------------------------------------------------
async def test_routine_watch_timeouts_and_410s_are_not_counted_or_logged_as_errors(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    overrides = {"hub.history_size": 5}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as s:
        store = running.fake.store
        store.create("pods", "default", pod("a"))
        old = store.resource_version
        await read_watch(s, running.url + PODS + "?watch=1", until=lambda e: len(e) >= 1)
        for i in range(10):
            store.modify("pods", "default", "a", annotate(str(i)))
        # Older than the hub's window goes to the apiserver (issue 18): the 410 is its own.
        store.compact()
        caplog.clear()
        async with s.get(running.url + PODS + "?watch=1&timeoutSeconds=1") as timed:
            assert timed.status == 200
            await timed.read()
        expired = await read_watch(
            s, running.url + PODS + f"?watch=1&resourceVersion={old}", until=lambda e: True
        )
        assert expired[0]["type"] == "ERROR" and expired[0]["object"]["code"] == 410
        async with s.get(running.admin_url + "/metrics") as response:
            metrics = await response.text()
        error_lines = [
            ln
            for ln in metrics.splitlines()
            if ln.startswith(("watchproxy_requests_total", "watchproxy_upstream_errors_total"))
            and ('code="5' in ln or "errors_total" in ln)
            and not ln.rstrip().endswith(" 0.0")
        ]
        assert error_lines == []
        noisy = [r for r in caplog.records if r.name.startswith("watchproxy") and r.levelno >= 30]
        assert noisy == []
