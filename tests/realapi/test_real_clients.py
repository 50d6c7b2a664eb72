"""Real clients (client-go, kube-rs, client-node) through watchproxy against the real apiserver,
across a TCP-level outage between watchproxy and the apiserver.

Every client program runs at once in one fresh namespace: the client-go informer with JSON and
with protobuf, a client-go ``Watch`` with a label selector, kube-rs's ``watcher`` without and
with back-off, client-node's ``makeInformer``. The test's own direct watch on the namespace is
the apiserver's record of what happened (``ApiRecord``, fed into the same ``ChangeLog`` the
fake-apiserver tests use). Pods change, the relay in front of the apiserver cuts every
connection and refuses new ones while pods keep changing (directly), then lets watchproxy back
in; every client must end with every change the apiserver recorded, once, in order, with the
apiserver's resourceVersions.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from tests.clients.build import ToolchainMissing, build_watchclient
from tests.clients.build_rust_node import ToolchainMissing as RustNodeMissing
from tests.clients.build_rust_node import build_kubewatch, on_ci, prepare_informer
from tests.clients.expect import ChangeLog, check_informer, check_kubers, kubers_state
from tests.clients.process import ClientProcess, Line, bounded
from tests.clients.streams import Event, client_state, diff_report, events, markers
from tests.e2e.test_rust_node_clients import node_kubeconfig
from tests.harness import RunningProxy, proxy_for_upstream, wait_for
from tests.realapi.fixture import RealApiServer, start_or_skip
from tests.realapi.kubeapi import Api, TcpRelay

pytestmark = pytest.mark.timeout(120, func_only=True)

# Fast reconnects (an outage here lasts seconds) and short upstream watches, so that the hub
# also resumes its own watch during the test.
OVERRIDES: dict[str, Any] = {
    "backoff.initial_seconds": 0.2,
    "backoff.max_seconds": 1.0,
    "backoff.probe_max_seconds": 1.0,
    "backoff.jitter": "none",
    "hub.bookmark_interval_seconds": 1.0,
}
STEPS = 15  # changes per phase (before, during and after the outage)


class ApiRecord:
    """The apiserver's own record of the namespace's pod changes (or of another ``collection``
    of core/v1), from a direct watch, shaped as the ``StoreLike`` that ``ChangeLog`` subscribes
    to (which names it "pods" whatever it holds)."""

    def __init__(self, api: Api, namespace: str, start_rv: int, collection: str = "pods") -> None:
        self.api = api
        self.namespace = namespace
        self.collection = collection
        self.resource_version = start_rv
        self._listeners: list[Callable[[Any], None]] = []

    def subscribe(self, resource: str, fn: Callable[[Any], None]) -> Callable[[], None]:
        assert resource == "pods"
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn)

    @contextlib.asynccontextmanager
    async def recording(self) -> AsyncIterator[Callable[[int], Any]]:
        """Yields ``until(rv)``: a wait until the record has reached ``rv``."""
        path = (
            f"/api/v1/namespaces/{self.namespace}/{self.collection}?watch=1"
            f"&resourceVersion={self.resource_version}"
        )
        async with self.api.watch(path) as stream:
            fed = 0

            def feed() -> int:
                nonlocal fed
                for event in stream.events[fed:]:
                    obj = event["object"]
                    rv = int(obj["metadata"]["resourceVersion"])
                    assert event["type"] in ("ADDED", "MODIFIED", "DELETED"), event
                    for listener in self._listeners:
                        listener(SimpleNamespace(type=event["type"], obj=obj, rv=rv))
                fed = len(stream.events)
                return max(
                    (int(e["object"]["metadata"]["resourceVersion"]) for e in stream.events),
                    default=0,
                )

            async def until(rv: int) -> None:
                await stream.wait_for(
                    lambda evs: any(
                        int(e["object"]["metadata"]["resourceVersion"]) >= rv for e in evs
                    ),
                    what=f"the direct watch to reach RV {rv}",
                )
                feed()

            yield until


def pod(name: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]},
    }


class Writer:
    """Pod changes made directly at the apiserver; remembers the last resourceVersion."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.live: list[str] = []
        self.made = 0
        self.last_rv = 0

    async def step(self) -> None:
        """Create two pods (one app=web), delete the oldest, then touch one: the touch is the
        step's last change (a DELETE answers with the object before its deletion's RV)."""
        self.made += 1
        for app in ("web", "db"):
            name = f"{app}-{self.made}"
            body = await self.api.ok("POST", self.path, body=pod(name, app))
            self.live.append(name)
            self._saw(body)
        if len(self.live) > 6:
            gone = self.live.pop(0)
            await self.api.ok("DELETE", f"{self.path}/{gone}", body={"gracePeriodSeconds": 0})
        touched = self.live[len(self.live) // 2]
        patch = {"metadata": {"annotations": {"step": str(self.made)}}}
        body = await self.api.ok(
            "PATCH",
            f"{self.path}/{touched}",
            body=patch,
            content_type="application/merge-patch+json",
        )
        self._saw(body)

    def _saw(self, body: dict[str, Any]) -> None:
        self.last_rv = max(self.last_rv, int(body["metadata"]["resourceVersion"]))


async def recorded_pods(direct: Api, namespace: str) -> tuple[ApiRecord, ChangeLog, Writer]:
    """The namespace's pod changes from now on: the apiserver's record of them (a direct watch
    from the namespace's current resourceVersion, opened by ``record.recording()``), the change
    log it feeds, and a writer that makes them."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    start_rv = int((await direct.ok("GET", pods))["metadata"]["resourceVersion"])
    record = ApiRecord(direct, namespace, start_rv)
    return record, ChangeLog(record, namespace), Writer(direct, namespace)


def built(build: Callable[[], Path | Any]) -> Any:
    try:
        return build()
    except (ToolchainMissing, RustNodeMissing) as exc:
        if on_ci():
            pytest.fail(f"{exc} (CI=true: a missing toolchain is a failure)")
        pytest.skip(str(exc))


def hub_cursors(running: RunningProxy) -> int:
    hub = running.proxy.hub
    assert hub is not None
    return sum(len(shared.cursors) for shared in hub.watches.values())


def opened(running: RunningProxy) -> float:
    """Upstream lists and watches the hub has opened so far."""
    registry = running.proxy.metrics.registry
    return registry.get_sample_value("watchproxy_watch_upstream_opens_total") or 0.0


def go_ready(lines: list[Line]) -> bool:
    return bool(markers(lines, "READY"))


@contextlib.asynccontextmanager
async def clients(
    tmp_path: Path, running: RunningProxy, namespace: str
) -> AsyncIterator[dict[str, ClientProcess]]:
    """Every client program, started through ``running`` and READY (listed, watching)."""
    go = str(built(build_watchclient))
    rust = str(built(build_kubewatch))
    node = built(prepare_informer)
    ns = f"--namespace={namespace}"
    plans: dict[str, tuple[list[str], str, Callable[[list[Line]], bool]]] = {
        "go-informer-json": ([go, "--mode=informer", ns], running.kubeconfig, go_ready),
        "go-informer-protobuf": (
            [go, "--mode=informer", "--protobuf", ns],
            running.kubeconfig,
            go_ready,
        ),
        "go-watch-web": (
            [go, "--mode=watch", "--selector=app=web", "--watch-timeout=3s", ns],
            running.kubeconfig,
            go_ready,
        ),
        "kube-rs": (
            [rust, "--backoff", "none", "--namespace", namespace],
            running.kubeconfig,
            lambda ls: any(line["type"] == "InitDone" for line in ls),
        ),
        "kube-rs-backoff": (
            [rust, "--backoff", "default", "--namespace", namespace],
            running.kubeconfig,
            lambda ls: any(line["type"] == "InitDone" for line in ls),
        ),
        "client-node": (
            [node.node, str(node.script), "--namespace", namespace],
            node_kubeconfig(running.kubeconfig),
            lambda ls: any(line["type"] == "READY" for line in ls),
        ),
    }
    started: dict[str, ClientProcess] = {}
    try:
        for name, (argv, kubeconfig, _) in plans.items():
            env = {**os.environ, "KUBECONFIG": kubeconfig}
            client = ClientProcess(name, argv, env=env, log_path=tmp_path / f"{name}.stderr")
            await client.start()
            started[name] = client
        for name, client in started.items():
            await client.wait_until(plans[name][2], what="its first list", timeout=30)
        # All six watch through the hub (the protobuf informer on a shared watch of its own
        # encoding): their watches are open before anything changes.
        await wait_for(lambda: hub_cursors(running) >= 6, what="six hub-served watches")
        hub = running.proxy.hub
        assert hub is not None
        assert {key.representation for key in hub.watches} == {"json", "protobuf"}
        yield started
    finally:
        for client in started.values():
            await client.stop()


@pytest.fixture(scope="module")
def uncached_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    """A real apiserver of its own whose pod watches read etcd (no watch cache), so that a
    compaction makes an old resourceVersion answer 410 Expired, as on a busy cluster whose
    watch cache has moved past it."""
    server = start_or_skip(
        tmp_path_factory.mktemp("uncached"),
        extra=("-apiserver-args", "--watch-cache-sizes=pods#0,configmaps#0"),
    )
    try:
        yield server
    finally:
        server.stop()


async def test_every_client_gets_every_change_once_across_an_outage(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    # The watch cache still holds the hub's resume point: no relist.
    await across_an_outage(tmp_path, real_apiserver, direct, namespace)


async def test_every_client_gets_every_change_once_across_a_compaction(
    tmp_path: Path, uncached_apiserver: RealApiServer, session: aiohttp.ClientSession
) -> None:
    """The outage lasts until etcd has compacted the hub's resume point: the hub's resume
    gets 410 Expired and it relists; the clients, whose streams stayed open, must still get
    every change once, in order (the relist shows them only what changed)."""
    real = uncached_apiserver
    direct = Api(session, real.url, token=real.token, ssl_context=real.ssl_context())
    namespace = f"t-{secrets.token_hex(4)}"
    await direct.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    await across_an_outage(tmp_path, real, direct, namespace, until_compacted=True)


async def compacted(direct: Api, pods: str, rv: int) -> None:
    """Until a watch from ``rv`` is answered with 410 Expired (etcd compacted past it).
    Compaction runs on its own clock (every 4 s, to the revision of the previous run): there
    is no event to await, so a bounded poll, one short watch at a time."""
    for _ in range(40):
        answer = await direct.request(
            "GET", f"{pods}?watch=1&resourceVersion={rv}&timeoutSeconds=1"
        )
        if answer.status == 410 or b'"code":410' in answer.body:
            return
    raise AssertionError(f"resourceVersion {rv} was not compacted within 40 tries")


def relists_of(running: RunningProxy) -> float:
    registry = running.proxy.metrics.registry
    return registry.get_sample_value("watchproxy_watch_relists_total") or 0.0


async def across_an_outage(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    *,
    until_compacted: bool = False,
) -> None:
    """Run every client through one outage and check what each saw."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    record, log, writer = await recorded_pods(direct, namespace)
    async with TcpRelay(real_apiserver.port) as relay:
        upstream = real_apiserver.write_kubeconfig(
            tmp_path / "upstream.kubeconfig", token=real_apiserver.token, server=relay.url
        )
        async with (
            record.recording() as recorded_up_to,
            proxy_for_upstream(tmp_path, upstream, OVERRIDES) as running,
            clients(tmp_path, running, namespace) as started,
        ):
            for _ in range(STEPS):
                await writer.step()
            opens = opened(running)
            relay.set_cut(True)
            await wait_for(lambda: not running.proxy.connectivity.up, what="watchproxy to see it")
            for _ in range(STEPS):
                await writer.step()
            if until_compacted:
                await compacted(direct, pods, writer.last_rv)
                for _ in range(STEPS):
                    await writer.step()
            relay.set_cut(False)
            for _ in range(STEPS):
                await writer.step()
            await recorded_up_to(writer.last_rv)
            final = log.state_at(writer.last_rv)
            web = {name: rv for name, rv in final.items() if name.startswith("web-")}
            for name, client in started.items():
                if name.startswith("kube-rs"):
                    await client.wait_until(
                        lambda ls: kubers_state(ls) == final, what="the final state", timeout=30
                    )
                else:
                    want = web if name == "go-watch-web" else final
                    await client.wait_until(
                        lambda ls, want=want: _holds(ls, want), what="the final state", timeout=30
                    )
            # The shared watches broke with the relay and the hub reopened them.
            assert opened(running) > opens
            relists = relists_of(running)
        log.close()
    expected = [Event(c.type, c.name, c.rv) for c in log.changes]
    assert expected, "the record is empty"
    problems: dict[str, list[str]] = {}
    for name, client in started.items():
        keep = (lambda n: n.startswith("web-")) if name == "go-watch-web" else (lambda n: True)
        if until_compacted:
            problems[name] = bridged_problems(watch_events(name, client.lines), log, keep)
        elif name.startswith("kube-rs"):
            problems[name] = check_kubers(client.lines, log)
        elif name == "client-node":
            problems[name] = check_informer(client.lines, log)
        else:
            wanted = [e for e in expected if keep(e.name)]
            received = events(client.lines)
            problems[name] = [] if received == wanted else [diff_report(wanted, received)]
        problems[name] += [str(m) for m in markers(client.lines, "ERROR", "RELIST")]
    report = "\n".join(f"{k}: {bounded(v, limit=10)}" for k, v in problems.items() if v)
    assert not report, report
    assert relists >= 1 if until_compacted else relists == 0


def watch_events(name: str, lines: list[Line]) -> list[Event]:
    """The events a client got after its initial (empty) list, in any client's vocabulary."""
    if name.startswith("kube-rs"):
        kinds = {"Apply": "SET", "Delete": "DELETED"}
    elif name == "client-node":
        kinds = {"add": "SET", "update": "SET", "delete": "DELETED"}
    else:
        kinds = {"ADDED": "SET", "MODIFIED": "SET", "DELETED": "DELETED"}
    return [
        Event(kinds[line["type"]], line["name"], int(line["resourceVersion"]))
        for line in lines
        if line["type"] in kinds
    ]


def bridged_problems(got: list[Event], log: ChangeLog, keep: Callable[[str], bool]) -> list[str]:
    """The record's changes exactly, except where a relist bridged a gap that the apiserver
    no longer had: there, each object that changed in the gap once at its RV at the relist
    (ascending) and one DELETED for each object gone, stamped inside the gap; then the record's
    changes after the relist exactly. Events are SET or DELETED (kube-rs says Apply for both
    ADDED and MODIFIED). Empty when ``got`` is such a stream."""
    record = [
        Event("DELETED" if c.type == "DELETED" else "SET", c.name, c.rv)
        for c in log.changes
        if keep(c.name)
    ]
    head = 0
    while head < min(len(got), len(record)) and got[head] == record[head]:
        head += 1
    if head == len(got) == len(record):
        return []
    gap_from = record[head - 1].rv if head else log.start_rv

    def state(rv: int) -> dict[str, int]:
        return {n: v for n, v in log.state_at(rv).items() if keep(n)}

    for relist_rv in sorted({c.rv for c in record if c.rv >= gap_from}):
        tail = [c for c in record if c.rv > relist_rv]
        if len(tail) > len(got) - head or got[len(got) - len(tail) :] != tail:
            continue
        middle = got[head : len(got) - len(tail)]
        before, after = state(gap_from), state(relist_rv)
        changed = sorted(
            (Event("SET", n, v) for n, v in after.items() if before.get(n) != v),
            key=lambda e: e.rv,
        )
        deleted = [e for e in middle if e.type == "DELETED"]
        bound = tail[0].rv if tail else float("inf")
        if (
            [e for e in middle if e.type == "SET"] == changed
            and sorted(e.name for e in deleted) == sorted(set(before) - set(after))
            and all(gap_from < e.rv < bound for e in deleted)
        ):
            return []
    return [
        f"not the record, nor the record bridged by a relist: {diff_report(record, got)}"
        f"\n  after the common head (to RV {gap_from}): {[str(e) for e in got[head:]]}"
    ]


def _holds(lines: list[Line], want: dict[str, int]) -> bool:
    return client_state(lines) == want or _node_state(lines) == want


def _node_state(lines: list[Line]) -> dict[str, int]:
    """client-node prints add/update/delete rather than the watch's event types."""
    state: dict[str, int] = {}
    for line in lines:
        if line["type"] in ("add", "update"):
            state[line["name"]] = int(line["resourceVersion"])
        elif line["type"] == "delete":
            state.pop(line["name"], None)
    return state
