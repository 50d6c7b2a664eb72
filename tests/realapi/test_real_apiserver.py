"""watchproxy against a real kube-apiserver (with etcd): each request is also made directly.

The direct answer is the oracle. Every test works in a namespace of its own on the one
session-wide apiserver (``real_apiserver``) and starts its own watchproxy in front of it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import KUBECTL, RunningProxy, kubectl, proxy_for_upstream, wait_for
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Answer, Api, Event, TcpRelay, names, objects

# Fast reconnects: an outage in these tests lasts seconds, not minutes.
FAST = {"backoff.initial_seconds": 0.2, "backoff.max_seconds": 1.0, "backoff.jitter": "none"}


def pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "demo"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]},
    }


def configmap(name: str, value: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"v": value},
    }


@contextlib.asynccontextmanager
async def proxy(
    tmp_path: Path,
    real: RealApiServer,
    overrides: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    server: str | None = None,
) -> AsyncIterator[tuple[RunningProxy, Api]]:
    """A watchproxy in front of the real apiserver (as ``token``, the admin by default)."""
    upstream = real.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=token or real.token, server=server
    )
    async with (
        proxy_for_upstream(tmp_path, upstream, overrides) as running,
        aiohttp.ClientSession() as client,
    ):
        yield running, Api(client, running.url)


def list_outcomes(running: RunningProxy, *names: str) -> dict[str, float | None]:
    """``watchproxy_consistent_lists_total`` by outcome (None: never counted)."""
    registry = running.proxy.metrics.registry
    return {
        name: registry.get_sample_value("watchproxy_consistent_lists_total", {"outcome": name})
        for name in names
    }


def rv(event: Event) -> int:
    return int(event["object"]["metadata"]["resourceVersion"])


def count(n: int) -> Any:
    return lambda events: len(objects(events)) >= n


def item_view(list_body: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted(
        (i["metadata"]["name"], i["metadata"]["resourceVersion"], i["metadata"]["uid"])
        for i in list_body["items"]
    )


async def test_list_matches_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(3):
        await direct.ok("POST", pods, body=pod(f"p{i}"))
    async with proxy(tmp_path, real_apiserver) as (_running, via):
        plain, want = await via.ok("GET", pods), await direct.ok("GET", pods)
        assert (
            (plain["kind"], plain["apiVersion"])
            == (want["kind"], want["apiVersion"])
            == ("PodList", "v1")
        )
        assert item_view(plain) == item_view(want)
        assert plain["items"] == want["items"]

        # Pages: the continue token is the apiserver's, passed through unchanged.
        first = await via.ok("GET", pods + "?limit=2")
        assert len(first["items"]) == 2 and first["metadata"]["continue"]
        rest = await via.ok("GET", pods + "?limit=2&continue=" + first["metadata"]["continue"])
        assert item_view({"items": first["items"] + rest["items"]}) == item_view(want)

        # resourceVersion=0 while a shared watch holds the key: answered from watchproxy's cache,
        # as the apiserver answers it from its watch cache.
        async with via.watch(pods + "?watch=1") as stream:
            await stream.wait_for(count(3), what="3 ADDED")
            cached, direct_cached = (
                await via.ok("GET", pods + "?resourceVersion=0"),
                await direct.ok("GET", pods + "?resourceVersion=0"),
            )
        assert item_view(cached) == item_view(direct_cached)
        assert _untyped(cached["items"]) == direct_cached["items"]


def _untyped(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")} for item in items]


async def test_list_from_cache_items_are_as_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await direct.ok("POST", pods, body=pod("a"))
    async with (
        proxy(tmp_path, real_apiserver) as (_running, via),
        via.watch(pods + "?watch=1") as stream,
    ):
        await stream.wait_for(count(1), what="ADDED")
        cached = await via.ok("GET", pods + "?resourceVersion=0")
        assert cached["items"] == (await direct.ok("GET", pods + "?resourceVersion=0"))["items"]


async def test_watch_matches_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await direct.ok("POST", pods, body=pod("before"))
    async with (
        proxy(tmp_path, real_apiserver) as (_running, via),
        via.watch(pods + "?watch=1") as proxied,
        direct.watch(pods + "?watch=1") as oracle,
    ):
        for stream in (proxied, oracle):
            await stream.wait_for(count(1), what="the existing pod")
        await direct.ok("POST", pods, body=pod("a"))
        await direct.ok("POST", pods, body=pod("b"))
        await direct.ok(
            "PATCH",
            f"{pods}/a",
            body={"metadata": {"labels": {"app": "changed"}}},
            content_type="application/merge-patch+json",
        )
        await direct.ok("DELETE", f"{pods}/b")
        # A pod is deleted in two steps (MODIFIED with deletionTimestamp, then DELETED).
        await oracle.wait_for(deleted("b"), what="b DELETED directly")
        await proxied.wait_for(deleted("b"), what="b DELETED through watchproxy")
        assert objects(proxied.events) == objects(oracle.events)
        assert [e["object"] for e in proxied.events] == [e["object"] for e in oracle.events]


async def test_a_later_watch_gets_the_initial_events_the_apiserver_sends_in_its_order(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """A watch without a resourceVersion, served from a synced shared watch, starts with the
    apiserver's ADDED events in the apiserver's order (by key), objects created after the sync
    included: before, those came last, in the order the shared watch learned them."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await direct.ok("POST", pods, body=pod("m-first"))
    async with (
        proxy(tmp_path, real_apiserver) as (_running, via),
        via.watch(pods + "?watch=1") as first,
    ):
        await first.wait_for(count(1), what="the existing pod")
        for name in ("zeta", "alpha", "m-mid", "beta"):  # not in key order
            await direct.ok("POST", pods, body=pod(name))
        await first.wait_for(count(5), what="the new pods")
        async with via.watch(pods + "?watch=1") as later, direct.watch(pods + "?watch=1") as oracle:
            for stream in (later, oracle):
                await stream.wait_for(count(5), what="the initial events")
            assert later.events == oracle.events
            assert [n for _, n, _ in objects(oracle.events)] == [
                "alpha", "beta", "m-first", "m-mid", "zeta"
            ]  # fmt: skip


def deleted(name: str) -> Any:
    return lambda events: ("DELETED", name) in {(t, n) for t, n, _ in objects(events)}


async def test_resume_by_resource_version_matches_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    async with (
        proxy(tmp_path, real_apiserver) as (_running, via),
        via.watch(pods + "?watch=1") as first,
    ):
        for name in ("a", "b", "c"):
            await direct.ok("POST", pods, body=pod(name))
        await first.wait_for(count(3), what="3 ADDED")
        resume_at = first.events[0]["object"]["metadata"]["resourceVersion"]
        query = f"?watch=1&resourceVersion={resume_at}"
        async with via.watch(pods + query) as resumed, direct.watch(pods + query) as oracle:
            await direct.ok("DELETE", f"{pods}/a")
            await oracle.wait_for(deleted("a"), what="b, c, DELETED a")
            await resumed.wait_for(deleted("a"), what="b, c, DELETED a through watchproxy")
            assert objects(resumed.events) == objects(oracle.events)
            assert [n for _, n, _ in objects(oracle.events)] == ["b", "c", "a", "a"]


async def _first_answer(api: Api, path: str, timeout: float = 6.0) -> tuple[int, list[Event]]:
    """A watch's status and what it delivered within ``timeout`` (an ERROR ends it early)."""
    async with api.watch(path) as stream:
        with contextlib.suppress(AssertionError):
            await stream.wait_for(lambda ev: any(e["type"] == "ERROR" for e in ev), timeout=timeout)
        return stream.status, list(stream.events)


async def test_watch_from_a_fresh_list_rv_is_served(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await direct.ok("POST", pods, body=pod("a"))
    async with proxy(tmp_path, real_apiserver) as (_r, via):
        listed = await via.ok("GET", pods)
        # Any write elsewhere moves etcd's revision, as leases and events do in a real cluster.
        await direct.ok("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("x"))
        path = f"{pods}?watch=1&resourceVersion={listed['metadata']['resourceVersion']}"
        oracle = await _first_answer(direct, path, timeout=1)
        assert oracle == (200, [])
        assert await _first_answer(via, path, timeout=1) == oracle


async def test_watch_from_a_newer_rv_on_a_quiet_collection_is_served(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """The shared watch of a quiet collection lags the cluster's resourceVersion (the apiserver
    sends it no bookmark for a minute); a client's newer RV must still be served at once."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await direct.ok("POST", pods, body=pod("a"))
    async with proxy(tmp_path, real_apiserver) as (_r, via), via.watch(pods + "?watch=1") as first:
        await first.wait_for(count(1), what="the shared watch to sync")
        await direct.ok("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("x"))
        listed = await direct.ok("GET", pods)
        path = f"{pods}?watch=1&resourceVersion={listed['metadata']['resourceVersion']}"
        started = time.monotonic()
        async with via.watch(path) as resumed, direct.watch(path) as oracle:
            assert resumed.status == oracle.status == 200
            assert time.monotonic() - started < 2
            await direct.ok("POST", pods, body=pod("b"))
            await oracle.wait_for(count(1), what="b directly")
            await resumed.wait_for(count(1), what="b through watchproxy")
            assert objects(resumed.events) == objects(oracle.events)


async def _compacted(direct: Api, path: str, rv_: str, deadline: float) -> Event:
    """Wait until a direct watch from ``rv_`` is refused with 410 (etcd compacted past it)."""
    while True:
        async with direct.watch(f"{path}?watch=1&resourceVersion={rv_}&timeoutSeconds=1") as probe:
            if probe.status == 410:
                return {"type": "ERROR", "object": {"code": 410, "body": probe.body.decode()}}
            with contextlib.suppress(AssertionError):
                await probe.wait_for(lambda ev: len(ev) >= 1, timeout=2, what="first event")
            if probe.events and probe.events[0]["type"] == "ERROR":
                return probe.events[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"resourceVersion {rv_} was not compacted in time")
        await asyncio.sleep(0.5)


def replay_state(events: list[Event], initial: int) -> dict[str, str]:
    """name -> resourceVersion after a stream; fails on a duplicate or an impossible event."""
    state: dict[str, str] = {}
    seen: set[tuple[str, str, str]] = set()
    last = 0
    for index, (event_type, name, version) in enumerate(objects(events)):
        assert (event_type, name, version) not in seen, f"duplicate {event_type} {name} {version}"
        seen.add((event_type, name, version))
        if index >= initial:
            # The initial ADDEDs of a watch without resourceVersion come in key order, not RV
            # order (directly as well); after them, RVs never go back.
            assert int(version) >= last, f"resourceVersion went back: {version} after {last}"
        last = max(last, int(version))
        if event_type == "ADDED":
            assert name not in state, f"ADDED for {name}, which the client already has"
            state[name] = version
        elif event_type == "MODIFIED":
            assert name in state and int(version) > int(state[name]), f"MODIFIED {name} {version}"
            state[name] = version
        elif event_type == "DELETED":
            assert name in state, f"DELETED for {name}, which the client never had"
            del state[name]
        else:
            raise AssertionError(f"unexpected event {event_type} {name}")
    return state


async def test_relist_after_compaction_is_hidden_from_clients(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """etcd compacts the proxy's resourceVersion during an outage: its re-watch gets 410 and it
    relists; its client sees every change once, the deletion included, on the same stream."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for name in ("keep", "change", "gone"):
        await direct.ok("POST", cms, body=configmap(name))
    async with (
        TcpRelay(real_apiserver.port) as relay,
        proxy(tmp_path, real_apiserver, FAST, server=relay.url) as (running, via),
        via.watch(cms + "?watch=1") as client,
    ):
        await client.wait_for(count(3), what="3 ADDED")

        relay.set_cut(True)
        await wait_for(lambda: running.proxy.connectivity.down, what="the proxy to see the outage")
        # Where the proxy will resume from (its cache cannot move while it is cut off).
        [shared] = running.proxy.debug_watches()
        before = shared["resourceVersion"]
        await direct.ok("PUT", f"{cms}/change", body=configmap("change", "2"))
        await direct.ok("DELETE", f"{cms}/gone")
        await direct.ok("POST", cms, body=configmap("new"))
        await direct.ok("POST", cms, body=configmap("brief"))
        await direct.ok("DELETE", f"{cms}/brief")
        # The oracle: a client resuming directly from there now gets 410.
        refused = await _compacted(direct, cms, before, time.monotonic() + 20)
        assert refused["object"]["code"] == 410
        relay.set_cut(False)

        final = await direct.ok("GET", cms)
        want = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in final["items"]}
        assert set(want) == {"keep", "change", "new"}
        await client.wait_for(
            lambda ev: {n: v for n, v in _names_rvs(ev).items()} == want,
            timeout=20,
            what="the client to reach the apiserver's state",
        )
        assert replay_state(client.events, initial=3) == want
        assert not client.ended
        assert [w["relists"] for w in running.proxy.debug_watches()] == [1]
        assert "brief" not in names(client.events)


def _names_rvs(events: list[Event]) -> dict[str, str]:
    state: dict[str, str] = {}
    for event_type, name, version in objects(events):
        if event_type == "DELETED":
            state.pop(name, None)
        else:
            state[name] = version
    return state


async def test_bookmarks_are_valid_resume_points(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await direct.ok("POST", pods, body=pod("a"))
    async with (
        proxy(tmp_path, real_apiserver, {"hub.bookmark_interval_seconds": 0.5}) as (_r, via),
        via.watch(pods + "?watch=1&allowWatchBookmarks=true") as stream,
    ):
        events = await stream.wait_for(
            lambda ev: any(e["type"] == "BOOKMARK" for e in ev), timeout=10, what="a bookmark"
        )
        bookmark = next(e for e in events if e["type"] == "BOOKMARK")["object"]
        assert (bookmark["kind"], bookmark["apiVersion"]) == ("Pod", "v1")
        at = bookmark["metadata"]["resourceVersion"]
        assert int(at) >= rv(events[0])
        await direct.ok("POST", pods, body=pod("b"))
        query = f"?watch=1&resourceVersion={at}"
        async with via.watch(pods + query) as resumed, direct.watch(pods + query) as oracle:
            await direct.ok("POST", pods, body=pod("c"))
            await oracle.wait_for(count(2), what="b and c directly")
            await resumed.wait_for(count(2), what="b and c through watchproxy")
            assert objects(resumed.events) == objects(oracle.events)


async def test_send_initial_events_watch_list_matches_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("a", "b", "c"):
        await direct.ok("POST", pods, body=pod(name))
    query = (
        "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    )

    def ended(events: list[Event]) -> bool:
        return any(_initial_events_end(e) for e in events)

    async with (
        proxy(tmp_path, real_apiserver) as (_r, via),
        via.watch(pods + query) as proxied,
        direct.watch(pods + query) as oracle,
    ):
        for stream in (proxied, oracle):
            await stream.wait_for(ended, what="the initial-events-end bookmark")
        heads = [_before_marker(stream.events) for stream in (proxied, oracle)]
        assert sorted(objects(heads[0])) == sorted(objects(heads[1]))
        assert {t for t, _, _ in objects(heads[0])} == {"ADDED"}
        assert names(heads[1]) == {"a", "b", "c"}
        marker = next(e for e in proxied.events if _initial_events_end(e))
        assert int(marker["object"]["metadata"]["resourceVersion"]) >= max(
            int(v) for _, _, v in objects(oracle.events)
        )
        await direct.ok("POST", pods, body=pod("d"))
        for stream in (proxied, oracle):
            await stream.wait_for(count(4), what="d")
        assert objects(proxied.events)[-1] == objects(oracle.events)[-1]


def _before_marker(events: list[Event]) -> list[Event]:
    return events[: next(i for i, e in enumerate(events) if _initial_events_end(e))]


def _initial_events_end(event: Event) -> bool:
    annotations = event["object"].get("metadata", {}).get("annotations") or {}
    return event["type"] == "BOOKMARK" and annotations.get("k8s.io/initial-events-end") == "true"


class LineReader:
    """A long-running subprocess (``kubectl get -w``) whose stdout lines a task collects."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.lines: list[str] = []
        self._process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LineReader:
        self._process = await asyncio.create_subprocess_exec(
            *self.args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            self.lines.append(raw.decode().rstrip("\n"))

    async def wait_for(self, words: tuple[str, ...], timeout: float = 15.0) -> None:
        """Until a line starts with ``words`` (whitespace-separated)."""
        deadline = time.monotonic() + timeout
        while not any(tuple(line.split()[: len(words)]) == words for line in self.lines):
            if time.monotonic() > deadline or (self._task is not None and self._task.done()):
                stderr = b""
                if self._process is not None and self._process.stderr is not None:
                    with contextlib.suppress(TimeoutError):
                        stderr = await asyncio.wait_for(self._process.stderr.read(2000), 1)
                raise AssertionError(f"no line with {words!r} in {self.lines} (stderr {stderr!r})")
            await asyncio.sleep(0.05)

    async def __aexit__(self, *exc: object) -> None:
        assert self._process is not None and self._task is not None
        if self._process.returncode is None:
            self._process.terminate()
        await self._process.wait()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def test_kubectl_get_watch_table_matches_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await direct.ok("POST", pods, body=pod("first"))
    watch_args = ("get", "pods", "-n", namespace, "-w", "--output-watch-events")
    async with proxy(tmp_path, real_apiserver) as (running, _via):
        async with (
            LineReader(KUBECTL, "--kubeconfig", running.kubeconfig, *watch_args) as proxied,
            LineReader(KUBECTL, "--kubeconfig", real_apiserver.kubeconfig, *watch_args) as oracle,
        ):
            for reader in (proxied, oracle):
                await reader.wait_for(("ADDED", "first"))
            await direct.ok("POST", pods, body=pod("second"))
            await direct.ok("DELETE", f"{pods}/second")
            for reader in (proxied, oracle):
                await reader.wait_for(("DELETED", "second"))

        def columns(lines: list[str]) -> list[list[str]]:
            # EVENT NAME READY STATUS RESTARTS (AGE is a clock reading and may differ by a second)
            return [line.split()[:5] for line in lines]

        assert columns(proxied.lines) == columns(oracle.lines)
        assert columns(oracle.lines)[0] == ["EVENT", "NAME", "READY", "STATUS", "RESTARTS"]


async def test_server_side_apply_matches_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    def manifest(name: str, value: str) -> bytes:
        return (
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"
            f"  namespace: {namespace}\ndata:\n  colour: {value}\n"
        ).encode()

    apply = ("apply", "--server-side", "--show-managed-fields", "-f", "-", "-o", "json")
    async with proxy(tmp_path, real_apiserver) as (running, via):
        answers = {}
        for label, config, name in (
            ("proxy", running.kubeconfig, "via-proxy"),
            ("direct", real_apiserver.kubeconfig, "direct"),
        ):
            code, out, err = await kubectl(
                config, *apply, "--field-manager=owner", stdin=manifest(name, "blue")
            )
            assert code == 0, err
            conflict = await kubectl(
                config, *apply, "--field-manager=intruder", stdin=manifest(name, "red")
            )
            answers[label] = (out, conflict)
        (p_out, p_conflict), (d_out, d_conflict) = answers["proxy"], answers["direct"]

        p_obj, d_obj = json.loads(p_out), json.loads(d_out)
        assert p_obj["data"] == d_obj["data"] == {"colour": "blue"}

        def managers(obj: dict[str, Any]) -> list[tuple[str, str, Any]]:
            return [
                (m["manager"], m["operation"], m["fieldsV1"])
                for m in obj["metadata"]["managedFields"]
            ]

        assert managers(p_obj) == managers(d_obj)
        assert p_conflict[0] == d_conflict[0] != 0
        assert p_conflict[2].replace("via-proxy", "X") == d_conflict[2].replace("direct", "X")

        # The same apply as a raw PATCH: status and body match.
        path = f"/api/v1/namespaces/{namespace}/configmaps/%s?fieldManager=intruder"
        raw = {}
        for label, api, name in (("proxy", via, "via-proxy"), ("direct", direct, "direct")):
            raw[label] = await api.request(
                "PATCH",
                path % name,
                body=manifest(name, "red"),
                content_type="application/apply-patch+yaml",
            )
        assert raw["proxy"].status == raw["direct"].status == 409
        p_status, d_status = raw["proxy"].json(), raw["direct"].json()
        assert p_status["reason"] == d_status["reason"] == "Conflict"
        assert p_status["details"]["causes"] == d_status["details"]["causes"]


async def _token(direct: Api, namespace: str, account: str) -> str:
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    answer = await direct.ok(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body=request
    )
    return str(answer["status"]["token"])


async def _service_account(
    direct: Api,
    namespace: str,
    account: str,
    *,
    may_read: list[str],
    verbs: tuple[str, ...] = ("get", "list", "watch"),
) -> str:
    """A service account allowed ``verbs`` on configmaps in ``may_read``; its token."""
    await direct.ok(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        body={"metadata": {"name": account}},
    )
    for target in may_read:
        role = {
            "metadata": {"name": f"read-{account}"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": list(verbs)}],
        }
        await direct.ok(
            "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{target}/roles", body=role
        )
        binding = {
            "metadata": {"name": f"read-{account}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"read-{account}",
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
        await direct.ok(
            "POST",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{target}/rolebindings",
            body=binding,
        )
    return await _token(direct, namespace, account)


async def test_forward_identity_each_account_sees_what_it_may(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    other = f"{namespace}-b"
    await direct.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": other}})
    await direct.ok("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("in-a"))
    await direct.ok("POST", f"/api/v1/namespaces/{other}/configmaps", body=configmap("in-b"))
    token_a = await _service_account(direct, namespace, "reader-a", may_read=[namespace])
    token_b = await _service_account(direct, namespace, "reader-b", may_read=[other])
    cms_a, cms_b = (
        f"/api/v1/namespaces/{namespace}/configmaps",
        f"/api/v1/namespaces/{other}/configmaps",
    )

    async with proxy(tmp_path, real_apiserver, {"security.identity": "forward"}) as (_r, via):
        as_a, as_b, anonymous = (
            via.with_token(token_a),
            via.with_token(token_b),
            via.with_token(None),
        )
        direct_a, direct_b = direct.with_token(token_a), direct.with_token(token_b)
        direct_anonymous = direct.with_token(None)
        # RBAC takes a moment to reach the authorizer's cache.
        await _until_status(direct_a, cms_a, 200)
        await _until_status(direct_b, cms_b, 200)

        async with as_a.watch(cms_a + "?watch=1") as watch_a:
            await watch_a.wait_for(count(1), what="in-a for reader-a")
            assert names(watch_a.events) == {"in-a"}
            for path in (cms_a, cms_a + "?resourceVersion=0", cms_a + "?watch=1"):
                # reader-b asks for what reader-a's shared watch holds: refused, as directly.
                via_b, oracle = await as_b.request("GET", path), await direct_b.request("GET", path)
                assert via_b.status == oracle.status == 403, path
                assert via_b.json()["reason"] == oracle.json()["reason"] == "Forbidden", path
            async with as_b.watch(cms_b + "?watch=1") as watch_b:
                await watch_b.wait_for(count(1), what="in-b for reader-b")
                await direct.ok(
                    "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("later-a")
                )
                await direct.ok(
                    "POST", f"/api/v1/namespaces/{other}/configmaps", body=configmap("later-b")
                )
                await watch_a.wait_for(count(2), what="later-a")
                await watch_b.wait_for(count(2), what="later-b")
                assert names(watch_a.events) == {"in-a", "later-a"}
                assert names(watch_b.events) == {"in-b", "later-b"}
        listed_a = await as_a.ok("GET", cms_a)
        assert item_view(listed_a) == item_view(await direct_a.ok("GET", cms_a))
        forbidden = await as_a.request("GET", cms_b)
        assert forbidden.status == (await direct_a.request("GET", cms_b)).status == 403
        nobody, oracle = (
            await anonymous.request("GET", cms_a),
            await direct_anonymous.request("GET", cms_a),
        )
        assert nobody.status == oracle.status
        assert nobody.json()["message"] == oracle.json()["message"]


async def test_forward_identity_forbidden_watch_message_as_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    token = await _service_account(direct, namespace, "nobody", may_read=[])
    path = f"/api/v1/namespaces/{namespace}/configmaps?watch=1"
    async with proxy(tmp_path, real_apiserver, {"security.identity": "forward"}) as (_r, via):
        via_answer = await via.with_token(token).request("GET", path)
        oracle = await direct.with_token(token).request("GET", path)
    assert via_answer.status == oracle.status == 403
    assert via_answer.json()["message"] == oracle.json()["message"]


async def test_forward_identity_list_without_watch_permission(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """An account that may list but not watch must not get a watch stream through the proxy."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", cms, body=configmap("secret-ish"))
    token = await _service_account(
        direct, namespace, "lister", may_read=[namespace], verbs=("get", "list")
    )
    await _until_status(direct.with_token(token), cms, 200)
    async with proxy(tmp_path, real_apiserver, {"security.identity": "forward"}) as (_r, via):
        oracle = await direct.with_token(token).request("GET", cms + "?watch=1&timeoutSeconds=2")
        assert oracle.status == 403
        async with via.with_token(token).watch(cms + "?watch=1&timeoutSeconds=2") as stream:
            with contextlib.suppress(AssertionError):
                await stream.wait_for(lambda ev: len(ev) > 0, timeout=3)
        assert (stream.status, stream.events) == (403, [])


async def _until_status(api: Api, path: str, status: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (answer := await api.request("GET", path)).status != status:
        if time.monotonic() > deadline:
            raise AssertionError(f"GET {path}: {answer.status}, wanted {status}")
        await asyncio.sleep(0.1)


def _rejected(metrics_text: str, flow_schema: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if (
                sample.name == "apiserver_flowcontrol_rejected_requests_total"
                and sample.labels.get("flow_schema") == flow_schema
            ):
                total += sample.value
    return total


async def _jail(direct: Api, namespace: str, accounts: list[str]) -> str:
    """A priority level with no seats of its own that rejects instead of queueing, and one
    FlowSchema per service account into it (named ``jail-<namespace>-<account>``).

    With zero seats APF still runs one request when none is running (queueset.go,
    canAccommodateSeatsLocked); while that one runs, every other request of the level is
    rejected at once with 429.
    """
    level_name = f"jail-{namespace}"
    base = "/apis/flowcontrol.apiserver.k8s.io/v1"
    level = {
        "metadata": {"name": level_name},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 0,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"},
            },
        },
    }
    await direct.ok("POST", f"{base}/prioritylevelconfigurations", body=level)
    for account in accounts:
        subject = {"name": account, "namespace": namespace}
        schema = {
            "metadata": {"name": f"{level_name}-{account}"},
            "spec": {
                "priorityLevelConfiguration": {"name": level_name},
                "matchingPrecedence": 100,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [{"kind": "ServiceAccount", "serviceAccount": subject}],
                        "resourceRules": [
                            {
                                "verbs": ["*"],
                                "apiGroups": ["*"],
                                "resources": ["*"],
                                "namespaces": ["*"],
                                "clusterScope": True,
                            }
                        ],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    }
                ],
            },
        }
        await direct.ok("POST", f"{base}/flowschemas", body=schema)
    return level_name


class HoldingWebhook:
    """A validating admission webhook on loopback that holds each call until released.

    A CREATE held here keeps its APF seat: the one request the jail level runs.
    """

    def __init__(self, real: RealApiServer) -> None:
        self.real = real
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _review(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.arrived.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), 25)
        answer = {"uid": review["request"]["uid"], "allowed": True}
        return web.json_response({**review, "response": answer})

    async def __aenter__(self) -> HoldingWebhook:
        app = web.Application()
        app.router.add_post("/hold", self._review)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # The apiserver's own serving certificate is valid for 127.0.0.1 and signed by the CA
        # the webhook configuration names.
        pki = self.real.pki_dir
        context.load_cert_chain(pki / "apiserver.crt", pki / "apiserver.key")
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._runner is not None
        # The apiserver keeps its webhook connection alive; closing it gracefully starts a TLS
        # shutdown that the Go side answers late, and nothing in aiohttp's cleanup waits for
        # it: the transport outlived the test's loop (a ResourceWarning at loop close, seen in
        # CI). This is our own test server going away, so its connections are aborted.
        server = self._runner.server
        for handler in server.connections if server is not None else []:
            if handler.transport is not None:
                handler.transport.abort()
        await self._runner.cleanup()

    def configuration(self, name: str, namespace: str) -> dict[str, Any]:
        ca = base64.b64encode(Path(self.real.ca_file).read_bytes()).decode()
        return {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "hold.watchproxy.test",
                    "clientConfig": {"url": f"https://127.0.0.1:{self.port}/hold", "caBundle": ca},
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 30,
                }
            ],
        }


async def test_apf_429_is_honoured(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """APF rejects the proxy's identity: the proxy passes the 429 on and sends nothing more
    upstream until Retry-After has passed, where a direct client hammers the apiserver."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    tokens = {}
    for account in ("holder", "proxied"):
        may = ("get", "list", "watch", "create")
        tokens[account] = await _service_account(
            direct, namespace, account, may_read=[namespace], verbs=may
        )
    level = await _jail(direct, namespace, list(tokens))
    schema = f"{level}-proxied"
    jailed = direct.with_token(tokens["proxied"])
    holder = direct.with_token(tokens["holder"])
    hooks = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"

    async def hold() -> None:
        # The webhook configuration reaches the admission plugin a moment after it is created:
        # create until one call is held (released when the test ends).
        for attempt in range(100):
            await holder.request("POST", cms, body=configmap(f"hold-{attempt}"), timeout=40)
            if webhook.arrived.is_set():
                return
            await asyncio.sleep(0.1)

    async def rejected() -> float:
        return _rejected((await direct.request("GET", "/metrics")).body.decode(), schema)

    async def hammer(api: Api, seconds: float) -> list[Answer]:
        """One request after another, for ``seconds``."""
        answers = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            answers.append(await api.request("GET", cms))
        return answers

    async with HoldingWebhook(real_apiserver) as webhook:
        await direct.ok("POST", hooks, body=webhook.configuration(level, namespace))
        holding = asyncio.create_task(hold())
        try:
            await asyncio.wait_for(webhook.arrived.wait(), 20)
            await _until_status(jailed, cms, 429)
            seconds = 3.0
            before = await rejected()
            async with proxy(tmp_path, real_apiserver, token=tokens["proxied"]) as (_r, via):
                through = await hammer(via, seconds)
            through_upstream = await rejected() - before
            before = await rejected()
            alone = await hammer(jailed, seconds)
            alone_upstream = await rejected() - before
        finally:
            webhook.release.set()
            await asyncio.wait_for(holding, 30)
            await direct.ok("DELETE", f"{hooks}/{level}")

    assert {a.status for a in through} == {a.status for a in alone} == {429}
    assert all("Retry-After" in a.headers for a in through)
    assert through[0].body == alone[0].body
    # Retry-After is at least 1 s: a proxy that honours it sends about one request a second
    # (its start-up probe included).
    assert through_upstream <= seconds + 2, (through_upstream, len(through))
    assert alone_upstream == len(alone)
    assert alone_upstream > 5 * through_upstream, (alone_upstream, through_upstream)
