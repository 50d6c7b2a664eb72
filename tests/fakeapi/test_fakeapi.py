"""The fake apiserver behaves like the real one where clients can tell."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from kubefake import Churner, FakeApiServer, Store
from kubefake.errors import Expired

PODS = "/api/v1/namespaces/default/pods"
CMS = "/api/v1/namespaces/default/configmaps"
TABLE_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        "status": {"phase": "Pending"},
    }


@asynccontextmanager
async def client(api: FakeApiServer, token: str | None = None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token or api.token}"}
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(api.url, headers=headers, timeout=timeout) as session:
        yield Client(session, api)


class Client:
    def __init__(self, session: aiohttp.ClientSession, api: FakeApiServer) -> None:
        self.session = session
        self.ssl = api.client_ssl_context()

    async def request(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.request(method, path, ssl=self.ssl, **kw) as resp:
            body = await resp.read()
            if resp.content_type == "application/json":
                return resp.status, json.loads(body)
            return resp.status, body.decode()

    @asynccontextmanager
    async def watch(self, path: str, **params: str) -> AsyncIterator[Watch]:
        params = {"watch": "true", **params}
        headers = {"Accept": params.pop("accept")} if "accept" in params else {}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=float(params.pop("read_timeout", 10)))
        async with self.session.get(
            path, params=params, ssl=self.ssl, headers=headers, timeout=timeout
        ) as resp:
            yield Watch(resp)


class Watch:
    """Reads a watch stream line by line (no aiohttp line-length limit)."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self._buf = b""

    async def line(self, within: float = 5.0) -> bytes | None:
        async with asyncio.timeout(within):
            while b"\n" not in self._buf:
                chunk = await self.resp.content.readany()
                if not chunk:
                    return None
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    async def event(self, within: float = 5.0) -> dict[str, Any] | None:
        line = await self.line(within)
        return None if line is None else json.loads(line)

    async def events(self, n: int, within: float = 5.0, skip_bookmarks: bool = True) -> list[Any]:
        out: list[Any] = []
        async with asyncio.timeout(within):
            while len(out) < n:
                ev = await self.event(within)
                assert ev is not None, f"stream ended after {out}"
                if skip_bookmarks and ev["type"] == "BOOKMARK":
                    continue
                out.append(ev)
        return out


def names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in events]


# -- store (pure) ------------------------------------------------------------------------------


def test_every_write_bumps_one_global_resource_version() -> None:
    store = Store()
    start = store.resource_version
    p = store.create("pods", "default", pod("a"))
    c = store.create("configmaps", "default", {"metadata": {"name": "c"}, "data": {}})
    assert int(p["metadata"]["resourceVersion"]) == start + 1
    assert int(c["metadata"]["resourceVersion"]) == start + 2
    assert store.update("pods", "default", p) == p  # a no-op update writes nothing
    assert store.resource_version == start + 2


def test_snapshot_rebuilds_the_past_and_compact_expires_it() -> None:
    store = Store(history_size=10)
    store.create("pods", "default", pod("a", v="1"))
    at = store.resource_version
    store.patch_labels("pods", "default", "a", {"v": "2"})
    store.delete("pods", "default", "a")
    objects, rv = store.snapshot("pods", at)
    assert rv == at and [o["metadata"]["labels"]["v"] for o in objects.values()] == ["1"]
    store.compact()
    with pytest.raises(Expired):
        store.snapshot("pods", at)


def test_history_ring_overflow_moves_the_horizon() -> None:
    store = Store(history_size=3)
    store.create("pods", "default", pod("a"))
    first = store.resource_version
    for i in range(5):
        store.patch_labels("pods", "default", "a", {"i": str(i)})
    with pytest.raises(Expired):
        store.changes_since("pods", first)
    assert len(store.changes_since("pods", store.resource_version - 2)) == 2


def test_churner_steps_keep_the_population_near_its_target() -> None:
    store = Store()
    churn = Churner(store, population=10, seed=7)
    churn.fill()
    kinds = {churn.step() for _ in range(200)}
    assert kinds == {"ADDED", "MODIFIED", "DELETED"}
    assert 5 <= len(store.list("pods", "default")) <= 15


async def test_churner_task_is_owned_and_awaited() -> None:
    store = Store()
    churn = Churner(store, rate=200.0, seed=1)
    enough = asyncio.Event()
    store.subscribe("pods", lambda _change: churn.events >= 20 and enough.set())
    churn.start()
    async with asyncio.timeout(5):
        await enough.wait()
    await churn.stop()
    stopped_at = store.resource_version
    await asyncio.sleep(0.05)
    assert store.resource_version == stopped_at


# -- auth, CRUD, list --------------------------------------------------------------------------


async def test_requests_without_the_token_get_401_status(fake_api: FakeApiServer) -> None:
    async with client(fake_api, token="wrong") as c:
        status, body = await c.request("GET", PODS)
        assert status == 401 and body["reason"] == "Unauthorized" and body["kind"] == "Status"
    async with aiohttp.ClientSession(fake_api.url) as s:
        async with s.get("/healthz", ssl=fake_api.client_ssl_context()) as resp:
            assert resp.status == 200
        async with s.get(PODS, ssl=fake_api.client_ssl_context()) as resp:
            assert resp.status == 401


async def test_crud_round_trip_with_kubernetes_errors(fake_api: FakeApiServer) -> None:
    async with client(fake_api) as c:
        status, created = await c.request("POST", PODS, json=pod("a", app="web"))
        assert status == 201 and created["status"]["phase"] == "Pending"
        assert created["metadata"]["uid"] and created["metadata"]["creationTimestamp"]
        status, body = await c.request("POST", PODS, json=pod("a"))
        assert (status, body["reason"], body["details"]["name"]) == (409, "AlreadyExists", "a")
        status, got = await c.request("GET", f"{PODS}/a")
        assert status == 200 and got == created
        stale = {**got, "metadata": {**got["metadata"], "resourceVersion": "1"}}
        status, body = await c.request("PUT", f"{PODS}/a", json=stale)
        assert (status, body["reason"]) == (409, "Conflict")
        ct = {"Content-Type": "application/merge-patch+json"}
        status, patched = await c.request(
            "PATCH", f"{PODS}/a", data=json.dumps({"metadata": {"labels": {"v": "2"}}}), headers=ct
        )
        assert status == 200 and patched["metadata"]["labels"] == {"app": "web", "v": "2"}
        ops = [{"op": "replace", "path": "/metadata/labels/v", "value": "3"}]
        ct = {"Content-Type": "application/json-patch+json"}
        status, patched = await c.request("PATCH", f"{PODS}/a", data=json.dumps(ops), headers=ct)
        assert patched["metadata"]["labels"]["v"] == "3"
        status_body = {**patched, "status": {"phase": "Running"}}
        status, updated = await c.request("PUT", f"{PODS}/a/status", json=status_body)
        assert status == 200 and updated["status"]["phase"] == "Running"
        status, body = await c.request("POST", PODS, json={"metadata": {"name": "bad"}})
        assert (status, body["reason"]) == (422, "Invalid")
        status, body = await c.request(
            "POST", PODS, data=b"{nope", headers={"Content-Type": "application/json"}
        )
        assert status == 400
        status, body = await c.request(
            "POST", PODS, json={"metadata": {"generateName": "g-"}, "spec": pod("x")["spec"]}
        )
        assert status == 201 and body["metadata"]["name"].startswith("g-")
        status, deleted = await c.request("DELETE", f"{PODS}/a")
        assert status == 200 and deleted["metadata"]["name"] == "a"
        status, body = await c.request("GET", f"{PODS}/a")
        assert (status, body["reason"], body["details"]) == (
            404,
            "NotFound",
            {"name": "a", "kind": "pods"},
        )


async def test_big_configmap_is_created_and_watched(fake_api: FakeApiServer) -> None:
    big = {"metadata": {"name": "big"}, "data": {"blob": "x" * (1536 * 1024)}}
    async with client(fake_api) as c, c.watch(CMS) as w:
        body = io.BytesIO(json.dumps(big).encode())
        ct = {"Content-Type": "application/json"}
        status, _ = await c.request("POST", CMS, data=body, headers=ct)
        assert status == 201
        (ev,) = await w.events(1)
        assert ev["type"] == "ADDED" and len(ev["object"]["data"]["blob"]) == 1536 * 1024


async def test_list_pagination_and_expired_continue_token(fake_api: FakeApiServer) -> None:
    for i in range(5):
        fake_api.store.create("pods", "default", pod(f"p{i}", app="web" if i % 2 else "db"))
    async with client(fake_api) as c:
        _, page1 = await c.request("GET", PODS, params={"limit": "2"})
        assert [o["metadata"]["name"] for o in page1["items"]] == ["p0", "p1"]
        assert page1["metadata"]["remainingItemCount"] == 3
        fake_api.store.delete("pods", "default", "p2")  # the pages are a consistent snapshot
        _, page2 = await c.request(
            "GET", PODS, params={"limit": "2", "continue": page1["metadata"]["continue"]}
        )
        assert [o["metadata"]["name"] for o in page2["items"]] == ["p2", "p3"]
        assert page2["metadata"]["resourceVersion"] == page1["metadata"]["resourceVersion"]
        _, sel = await c.request(
            "GET", "/api/v1/pods", params={"labelSelector": "app in (web),app!=db"}
        )
        assert [o["metadata"]["name"] for o in sel["items"]] == ["p1", "p3"]
        _, sel = await c.request(
            "GET", PODS, params={"fieldSelector": "metadata.name!=p0,status.phase=Pending"}
        )
        assert [o["metadata"]["name"] for o in sel["items"]] == ["p1", "p3", "p4"]
        _, sel = await c.request("GET", PODS, params={"fieldSelector": "status.phase==Running"})
        assert sel["items"] == []
        fake_api.store.compact()
        status, body = await c.request(
            "GET", PODS, params={"limit": "2", "continue": page2["metadata"]["continue"]}
        )
        assert (status, body["reason"]) == (410, "Expired")
        status, body = await c.request("GET", PODS, params={"fieldSelector": "spec.bogus=1"})
        assert status == 400


# -- watch semantics ---------------------------------------------------------------------------


@pytest.mark.parametrize("rv", [None, "0"])
async def test_watch_without_rv_sends_current_state_then_changes(
    fake_api: FakeApiServer, rv: str | None
) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    fake_api.store.create("pods", "default", pod("b"))
    params = {} if rv is None else {"resourceVersion": rv}
    async with client(fake_api) as c, c.watch(PODS, **params) as w:
        assert w.resp.status == 200 and w.resp.headers["Content-Type"] == "application/json"
        assert names(await w.events(2)) == [("ADDED", "a"), ("ADDED", "b")]
        fake_api.store.patch_labels("pods", "default", "a", {"x": "1"})
        fake_api.store.delete("pods", "default", "b")
        assert names(await w.events(2)) == [("MODIFIED", "a"), ("DELETED", "b")]


async def test_watch_from_rv_n_gets_only_later_events(fake_api: FakeApiServer) -> None:
    store = fake_api.store
    store.create("pods", "default", pod("a"))
    rv = store.resource_version
    store.create("pods", "default", pod("b"))
    store.patch_labels("pods", "default", "a", {"x": "1"})
    async with client(fake_api) as c, c.watch(PODS, resourceVersion=str(rv)) as w:
        events = await w.events(2)
        assert names(events) == [("ADDED", "b"), ("MODIFIED", "a")]
        assert [int(e["object"]["metadata"]["resourceVersion"]) for e in events] == [rv + 1, rv + 2]


async def test_rv_older_than_history_gets_in_stream_410(fake_api: FakeApiServer) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    old = fake_api.store.resource_version - 1
    fake_api.store.compact()
    async with client(fake_api) as c, c.watch(PODS, resourceVersion=str(old)) as w:
        assert w.resp.status == 200
        ev = await w.event()
        assert ev is not None and ev["type"] == "ERROR"
        assert (ev["object"]["code"], ev["object"]["reason"]) == (410, "Expired")
        assert await w.line() is None  # then the end of the stream


async def test_bookmarks_carry_only_the_resource_version(fake_api: FakeApiServer) -> None:
    async with (
        client(fake_api) as c,
        c.watch(PODS, allowWatchBookmarks="true", resourceVersion="0") as w,
    ):
        # From "0" with bookmarks is a watch-list (kube-apiserver 1.34 on): the (empty)
        # initial events end with the annotated bookmark; the periodic ones follow.
        end = await w.event()
        assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        ev = await w.event()
        assert ev == {
            "type": "BOOKMARK",
            "object": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(fake_api.store.resource_version)},
            },
        }


async def test_timeout_seconds_ends_the_stream_cleanly_on_time(fake_api: FakeApiServer) -> None:
    async with client(fake_api) as c, c.watch(PODS, timeoutSeconds="1") as w:
        start = time.monotonic()
        assert await w.line(within=3) is None
        assert 0.9 <= time.monotonic() - start < 1.5
        assert w.resp.content.is_eof()


async def test_selector_watch_sees_deleted_when_leaving_and_added_when_entering(
    fake_api: FakeApiServer,
) -> None:
    store = fake_api.store
    store.create("pods", "default", pod("a", app="web"))
    store.create("pods", "default", pod("b", app="db"))
    async with client(fake_api) as c, c.watch(PODS, labelSelector="app=web") as w:
        assert names(await w.events(1)) == [("ADDED", "a")]
        store.patch_labels("pods", "default", "a", {"app": "db"})
        store.patch_labels("pods", "default", "b", {"app": "web"})
        events = await w.events(2)
        assert names(events) == [("DELETED", "a"), ("ADDED", "b")]
        assert events[0]["object"]["metadata"]["labels"]["app"] == "web"  # the old state
        assert events[0]["object"]["metadata"]["resourceVersion"] == str(store.resource_version - 1)
    async with client(fake_api) as c, c.watch(PODS, fieldSelector="metadata.name=b") as w:
        assert names(await w.events(1)) == [("ADDED", "b")]


async def test_table_watch_sends_column_definitions_only_in_the_first_event(
    fake_api: FakeApiServer,
) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    async with client(fake_api) as c, c.watch(PODS, accept=TABLE_ACCEPT) as w:
        fake_api.store.patch_labels("pods", "default", "a", {"x": "1"})
        first, second = await w.events(2)
        for ev in (first, second):
            table = ev["object"]
            assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
            (row,) = table["rows"]
            assert row["cells"][0] == "a" and row["object"]["kind"] == "PartialObjectMetadata"
        assert [col["name"] for col in first["object"]["columnDefinitions"]][:3] == [
            "Name",
            "Ready",
            "Status",
        ]
        assert second["object"]["columnDefinitions"] is None
    async with client(fake_api) as c:
        status, body = await c.request(
            "GET", PODS, headers={"Accept": "application/vnd.kubernetes.protobuf"}
        )
        assert (status, body["reason"]) == (406, "NotAcceptable")


async def test_send_initial_events_ends_with_an_annotated_bookmark(fake_api: FakeApiServer) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    params = {
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    async with client(fake_api) as c, c.watch(PODS, **params) as w:
        added, bookmark = await w.events(2, skip_bookmarks=False)
        assert names([added]) == [("ADDED", "a")]
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["object"]["metadata"]["annotations"] == {
            "k8s.io/initial-events-end": "true"
        }
    async with client(fake_api) as c:
        status, body = await c.request(
            "GET", PODS, params={"watch": "1", "sendInitialEvents": "true"}
        )
        assert (status, body["reason"]) == (422, "Invalid")


# -- faults ------------------------------------------------------------------------------------


async def test_outage_refuse_then_recover_on_the_same_port(fake_api: FakeApiServer) -> None:
    port = fake_api.port
    async with client(fake_api) as c, c.watch(PODS) as w:
        await fake_api.faults.outage("refuse")
        with pytest.raises(aiohttp.ClientPayloadError):
            await w.line()
    async with client(fake_api) as c:
        with pytest.raises(aiohttp.ClientConnectorError):
            await c.request("GET", PODS)
        await fake_api.faults.recover()
        assert fake_api.port == port
        assert (await c.request("GET", PODS))[0] == 200


async def test_outage_reset_counts_connection_attempts(fake_api: FakeApiServer) -> None:
    await fake_api.faults.outage("reset")
    async with client(fake_api) as c:
        for _ in range(3):
            with pytest.raises(aiohttp.ClientError):
                await c.request("GET", PODS)
    assert fake_api.stats.outage_connection_attempts == 3
    await fake_api.faults.recover()
    async with client(fake_api) as c:
        assert (await c.request("GET", PODS))[0] == 200


async def test_outage_503_throttle_and_fail_next(fake_api: FakeApiServer) -> None:
    async with client(fake_api) as c:
        await fake_api.faults.outage("503")
        status, body = await c.request("GET", PODS)
        assert (status, body["reason"]) == (503, "ServiceUnavailable")
        await fake_api.faults.recover()
        fake_api.faults.throttle(2.5)
        async with c.session.get(PODS, ssl=c.ssl) as resp:
            body = await resp.json()
            assert resp.status == 429 and resp.headers["Retry-After"] == "3"
            assert body["reason"] == "TooManyRequests" and body["details"]["retryAfterSeconds"] == 3
        fake_api.faults.throttle(None)
        fake_api.faults.fail_next(2, 500)
        assert [(await c.request("GET", PODS))[0] for _ in range(3)] == [500, 500, 200]


async def test_cut_watches_aborts_mid_stream(fake_api: FakeApiServer) -> None:
    async with client(fake_api) as c, c.watch(PODS) as w:
        await fake_api.stats.wait_until(lambda s: s.active_watches == 1)
        assert fake_api.faults.cut_watches() == 1
        with pytest.raises(aiohttp.ClientPayloadError):
            await w.line()
    await fake_api.stats.wait_until(lambda s: s.active_watches == 0)
    assert fake_api.stats.watch_opens(PODS) == 1


async def test_hung_watch_sends_headers_and_nothing_else(fake_api: FakeApiServer) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    fake_api.faults.hang_watches(True)
    async with client(fake_api) as c, c.watch(PODS, read_timeout="0.5") as w:
        assert w.resp.status == 200
        with pytest.raises(asyncio.TimeoutError):
            await w.line(within=3)


async def test_garbage_watch_line_is_invalid_json(fake_api: FakeApiServer) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    fake_api.store.create("pods", "default", pod("b"))
    fake_api.faults.garbage_next_watch_line()
    async with client(fake_api) as c, c.watch(PODS) as w:
        line = await w.line()
        assert line is not None
        with pytest.raises(ValueError):
            json.loads(line)
        assert names(await w.events(1)) == [("ADDED", "b")]


# -- real clients ------------------------------------------------------------------------------

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


async def kubectl(
    api: FakeApiServer, tmp: str, *args: str, within: float = 15.0, stdin: bytes | None = None
) -> tuple[int, str, str]:
    """Run kubectl against the fake, in a subprocess so that this loop keeps serving."""
    kubeconfig = api.write_kubeconfig(os.path.join(tmp, "kubeconfig"))
    assert KUBECTL is not None
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        "--kubeconfig",
        kubeconfig,
        "--cache-dir",
        os.path.join(tmp, "cache"),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(within):
            out, err = await proc.communicate(stdin)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@needs_kubectl
async def test_kubectl_get_create_patch_delete_logs(fake_api: FakeApiServer, tmp_path: Any) -> None:
    tmp = str(tmp_path)
    fake_api.store.create(
        "pods", "default", {**pod("web-1", app="web"), "status": {"phase": "Running"}}
    )
    rc, out, err = await kubectl(fake_api, tmp, "get", "pods")
    assert rc == 0, err
    assert out.split("\n")[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert out.split("\n")[1].split()[:3] == ["web-1", "0/1", "Running"]
    manifest = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1"}, "data": {"k": "v"}}
    )
    rc, out, err = await kubectl(fake_api, tmp, "create", "-f", "-", stdin=manifest.encode())
    assert (rc, out.strip()) == (0, "configmap/cm1 created"), err
    rc, out, err = await kubectl(
        fake_api, tmp, "patch", "configmap", "cm1", "-p", '{"data":{"x":"y"}}'
    )
    assert rc == 0, err
    assert fake_api.store.get("configmaps", "default", "cm1")["data"] == {"k": "v", "x": "y"}
    rc, out, err = await kubectl(
        fake_api, tmp, "apply", "--server-side", "-f", "-", stdin=manifest.encode()
    )
    assert rc == 0, err
    rc, out, err = await kubectl(fake_api, tmp, "logs", "web-1")
    assert rc == 0 and out.startswith("log line 1 from default/web-1/c"), err
    rc, out, err = await kubectl(fake_api, tmp, "delete", "configmap", "cm1")
    assert (rc, out.strip()) == (0, 'configmap "cm1" deleted'), err
    assert fake_api.store.list("configmaps", "default") == []


@needs_kubectl
async def test_kubectl_get_watch_renders_rows(fake_api: FakeApiServer, tmp_path: Any) -> None:
    fake_api.store.create("pods", "default", pod("a"))

    async def change_when_watching() -> None:
        await fake_api.stats.wait_until(lambda s: s.active_watches == 1, within=10)
        fake_api.store.create("pods", "default", pod("b"))
        fake_api.store.modify(
            "pods", "default", "a", lambda o: o.setdefault("status", {}).update(phase="Running")
        )

    changer = asyncio.create_task(change_when_watching())
    try:
        _rc, out, err = await kubectl(
            fake_api, str(tmp_path), "get", "pods", "-w", "--request-timeout=2s", within=15
        )
    finally:
        await changer
    lines = [line.split() for line in out.strip().split("\n")]
    assert lines[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], (out, err)
    assert [line[:3] for line in lines[1:]] == [
        ["a", "0/1", "Pending"],
        ["b", "0/1", "Pending"],
        ["a", "0/1", "Running"],
    ]


async def test_official_python_client_lists_and_watches(
    fake_api: FakeApiServer, tmp_path: Any
) -> None:
    from kubernetes import client as k8s
    from kubernetes import config, watch

    kubeconfig = fake_api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    fake_api.store.create("pods", "default", pod("a"))

    def run() -> list[tuple[str, str]]:
        api = k8s.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        pods = api.list_namespaced_pod("default")
        seen = [("LIST", p.metadata.name) for p in pods.items]
        w = watch.Watch()
        for ev in w.stream(
            api.list_namespaced_pod,
            "default",
            resource_version=pods.metadata.resource_version,
            timeout_seconds=5,
        ):
            seen.append((ev["type"], ev["object"].metadata.name))
            if len(seen) == 3:
                w.stop()
                break
        return seen

    async def write_when_watching() -> None:
        await fake_api.stats.wait_until(lambda s: s.active_watches == 1, within=10)
        fake_api.store.create("pods", "default", pod("b"))
        fake_api.store.delete("pods", "default", "a")

    writer = asyncio.create_task(write_when_watching())
    try:
        seen = await asyncio.wait_for(asyncio.to_thread(run), 20)
    finally:
        await writer
    assert seen == [("LIST", "a"), ("ADDED", "b"), ("DELETED", "a")]


async def test_log_follow_streams_lines_until_the_client_leaves(fake_api: FakeApiServer) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    async with client(fake_api) as c, c.watch(f"{PODS}/a/log", follow="true", watch="false") as w:
        assert w.resp.content_type == "text/plain"
        assert await w.line() == b"log line 1 from default/a/c"
        assert await w.line() == b"log line 2 from default/a/c"


async def test_metadata_only_list_and_legacy_watch_path(fake_api: FakeApiServer) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
    async with client(fake_api) as c:
        _, body = await c.request("GET", PODS, headers={"Accept": accept})
        assert body["kind"] == "PartialObjectMetadataList"
        assert body["items"][0]["kind"] == "PartialObjectMetadata"
        assert "spec" not in body["items"][0]
        async with c.watch("/api/v1/watch/namespaces/default/pods", watch="false") as w:
            assert names(await w.events(1)) == [("ADDED", "a")]


# -- watches over WebSocket (as kube-apiserver 1.37's HandleWS) ---------------------------------


async def test_a_websocket_watch_sends_one_text_message_per_event_and_closes_with_1000(
    fake_api: FakeApiServer,
) -> None:
    fake_api.store.create("pods", "default", pod("a"))
    async with client(fake_api) as c:
        url = PODS + "?watch=true&timeoutSeconds=1"
        async with c.session.ws_connect(
            url,
            ssl=c.ssl,
            headers={"Origin": fake_api.url},
            protocols=("v4.channel.k8s.io",),
            autoping=False,
        ) as ws:
            assert ws.protocol == "v4.channel.k8s.io"  # the one offered is echoed
            first = await asyncio.wait_for(ws.receive(), 5)
            assert first.type is aiohttp.WSMsgType.TEXT and first.data.endswith("}\n")
            assert names([json.loads(first.data)]) == [("ADDED", "a")]
            await ws.ping(b"p")
            pong = await asyncio.wait_for(ws.receive(), 5)
            assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, b"p")
            fake_api.store.create("pods", "default", pod("b"))
            second = await asyncio.wait_for(ws.receive(), 5)
            assert names([json.loads(second.data)]) == [("ADDED", "b")]
            end = await asyncio.wait_for(ws.receive(), 5)  # timeoutSeconds
            assert (end.type, end.data) == (aiohttp.WSMsgType.CLOSE, 1000)


async def test_a_websocket_watch_without_origin_or_with_two_subprotocols_is_refused(
    fake_api: FakeApiServer,
) -> None:
    async with client(fake_api) as c:
        for headers, status in (
            (None, 403),
            ({"Origin": "x://y", "Sec-WebSocket-Protocol": "a, b"}, 400),
        ):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await c.session.ws_connect(PODS + "?watch=1", ssl=c.ssl, headers=headers)
            assert refused.value.status == status
