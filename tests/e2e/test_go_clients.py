"""Real client-go programs through watchproxy: every change arrives once, in order.

Each test runs ``tests/clients/go`` (a SharedIndexInformer with the real reflector and
DeltaFIFO, or a plain ``Watch`` loop) against watchproxy in front of the fake apiserver, makes
changes in the fake's store, and compares the client's JSON lines with the store's own record
of those changes (``ChangeLog``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kubefake import Churner, FakeApiServer, Stats
from kubefake.selectors import Filter, LabelSelector
from tests.clients.process import ClientProcess, bounded, running_client
from tests.clients.streams import (
    ChangeLog,
    Event,
    bookmark_problems,
    client_state,
    diff_report,
    events,
    markers,
    order_problems,
    relist_summary,
    store_state,
)
from tests.harness import Running, running_proxy, wait_for

# The build runs in the session fixture, outside this limit (a cold build downloads client-go).
pytestmark = pytest.mark.timeout(60, func_only=True)

NS = "default"
PODS = f"/api/v1/namespaces/{NS}/pods"
ALL = Filter(NS)
WEB = Filter(NS, LabelSelector.parse("app=web"))
PROTOBUF = "application/vnd.kubernetes.protobuf"

SCALE = 0.1  # watchproxy's reconnect schedule (0.8 s, x2, cap 30 s) scaled down for speed
OVERRIDES: dict[str, Any] = {
    "backoff.initial_seconds": 0.8 * SCALE,
    "backoff.max_seconds": 30 * SCALE,
    "hub.bookmark_interval_seconds": 1.0,
    # Short upstream watches: the hub resumes its own upstream watch during every test.
    "hub.upstream_watch_min_seconds": 2.0,
    "hub.upstream_watch_max_seconds": 3.0,
}
CHURN_RATE = 25.0  # changes per second and namespace


@dataclass
class Scenario:
    running: Running
    log: ChangeLog
    binary: Path
    tmp_path: Path
    churners: list[Churner]

    @property
    def fake(self) -> FakeApiServer:
        return self.running.fake

    def client(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> contextlib.AbstractAsyncContextManager[ClientProcess]:
        # --duration: a client orphaned by a killed test run still ends on its own.
        argv = [str(self.binary), "--duration=100s", *args]
        return running_client(
            name, argv, kubeconfig=self.running.kubeconfig, log_dir=self.tmp_path, extra_env=env
        )

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.running.proxy.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    async def hub_watching(self, clients: int) -> None:
        """Wait until ``clients`` watches served by the hub have their start point.

        An informer is READY after its LIST, and its WATCH follows a moment later; a change in
        between would meet test_informer_started_on_a_cold_key_resumes_without_a_relist's
        mechanism. The tests that are not about it let the watches settle first.
        """
        hub = self.running.proxy.hub
        assert hub is not None

        def planned() -> int:
            return sum(len(shared.cursors) for shared in hub.watches.values())

        await wait_for(lambda: planned() >= clients, what=f"{clients} hub-served watches")

    async def churn(self, steps: int) -> None:
        """``steps`` changes in each namespace, paced so that they spread over time."""
        for _ in range(steps):
            for churner in self.churners:
                churner.step()
            await asyncio.sleep(1 / CHURN_RATE)


@contextlib.asynccontextmanager
async def scenario(
    tmp_path: Path, binary: Path, overrides: dict[str, Any] | None = None
) -> AsyncIterator[Scenario]:
    async with running_proxy(tmp_path, overrides if overrides is not None else OVERRIDES) as run:
        log = ChangeLog(run.fake.store)
        try:
            # Pods in another namespace change too: no client may see them.
            churners = [
                Churner(run.fake.store, "pods", NS, population=12, seed=7),
                Churner(run.fake.store, "pods", "kube-system", population=4, seed=8),
            ]
            for churner in churners:
                churner.fill()
            yield Scenario(run, log, binary, tmp_path, churners)
        finally:
            log.close()


@dataclass(frozen=True)
class Start:
    """Where a client's comparison starts: its line index and the store's RV at that point."""

    index: int
    rv: int
    initial: dict[str, int]


async def synced(client: ClientProcess, s: Scenario, flt: Filter) -> Start:
    """Wait until the client is READY and holds exactly the current objects (nothing changes
    meanwhile), and check that it got each of them once."""
    want = store_state(s.fake.store, flt)
    await client.wait_until(
        lambda lines: bool(markers(lines, "READY")) and client_state(lines) == want,
        what="the initial sync",
    )
    initial = events(client.lines)
    assert sorted(initial) == sorted(Event("ADDED", n, rv) for n, rv in want.items()), (
        client.report()
    )
    return Start(len(client.lines), s.fake.store.resource_version, want)


async def converged(client: ClientProcess, s: Scenario, flt: Filter, after: int) -> None:
    """Wait until the client holds the store's current objects and has reached the last change
    it should see."""
    expected = s.log.seen_by(flt, after)
    last = expected[-1].rv if expected else 0
    want = store_state(s.fake.store, flt)

    def caught_up(lines: list[dict[str, Any]]) -> bool:
        got = events(lines)
        # max, not the last line's: a relist ends with SYNC lines at older resourceVersions.
        return client_state(lines) == want and max((e.rv for e in got), default=0) >= last

    await client.wait_until(caught_up, timeout=20, what="the client to catch up")


async def holds(client: ClientProcess, want: dict[str, int], *, what: str) -> None:
    """Wait until the client holds exactly ``want`` (name -> resourceVersion)."""

    def same(lines: list[dict[str, Any]]) -> bool:
        return client_state(lines) == want

    await client.wait_until(same, timeout=20, what=what)


def check_exact(client: ClientProcess, start: Start, expected: Sequence[Event]) -> None:
    """The client saw exactly ``expected`` after ``start``, in order, and nothing else."""
    received = events(client.lines[start.index :])
    assert received == list(expected), diff_report(expected, received) + "\n" + client.report()
    assert not (problems := order_problems(received)), client.report(problems)
    assert not (problems := bookmark_problems(client.lines)), client.report(problems)
    unexpected = markers(client.lines, "ERROR", "WATCH_ERROR", "RELIST")
    assert not unexpected, client.report(unexpected)


def proxy_requests(s: Scenario, verb: str) -> float:
    """Client requests of ``verb`` that watchproxy answered with 200."""
    return s.metric("watchproxy_requests_total", {"verb": verb, "code": "200"})


def upstream_pod_watches(fake: FakeApiServer) -> dict[str, int]:
    """Watch requests for the namespace's pods that reached the fake, by representation."""
    counts = {"json": 0, "protobuf": 0}
    for record in fake.stats.requests:
        if record.watch and record.path == PODS:
            accept = record.headers.get("Accept", "")
            counts["protobuf" if accept.startswith(PROTOBUF) else "json"] += 1
    return counts


async def test_informer_json_gets_every_change_once_in_order(
    tmp_path: Path, watchclient: Path
) -> None:
    async with scenario(tmp_path, watchclient) as s:
        async with s.client("informer-json", "--mode=informer") as client:
            start = await synced(client, s, ALL)
            await s.hub_watching(1)
            await s.churn(80)
            await converged(client, s, ALL, start.rv)
        assert client.returncode == 0, client.report()
        check_exact(client, start, s.log.seen_by(ALL, start.rv))
        assert upstream_pod_watches(s.fake)["protobuf"] == 0
        assert proxy_requests(s, "list") == 1  # one LIST, then one watch: no relist


async def test_informer_started_on_a_cold_key_resumes_without_a_relist(
    tmp_path: Path, watchclient: Path
) -> None:
    """The first informer on a key LISTs (passed through: no shared watch yet), then WATCHes
    from that list's RV; the hub starts a shared watch with a LIST of its own. One pod is
    created between the two LISTs: the apiserver would serve the informer's watch from its
    older RV (it is in its history), so the informer should get that pod as one ADDED."""
    async with scenario(tmp_path, watchclient) as s:
        fake = s.fake
        created: list[int] = []

        def create_on_the_hubs_list(stats: Stats) -> bool:
            # Evaluated synchronously as each request arrives, before the fake answers it:
            # the pod exists for the hub's LIST and not for the informer's earlier one.
            if not created and any(
                r.path == PODS
                and not r.watch
                and "watchclient" not in r.headers.get("User-Agent", "")
                for r in stats.requests
            ):
                pod = fake.store.create("pods", NS, {"metadata": {"name": "between-lists"}})
                created.append(int(pod["metadata"]["resourceVersion"]))
            return bool(created)

        before = store_state(fake.store, ALL)
        async with s.client("informer-json", "--mode=informer") as client:
            await fake.stats.wait_until(create_on_the_hubs_list, 10)
            await holds(client, store_state(fake.store, ALL), what="the pod made between lists")
            await s.hub_watching(1)
        expected = sorted(Event("ADDED", name, rv) for name, rv in before.items())
        expected.append(Event("ADDED", "between-lists", created[0]))
        received = events(client.lines)
        assert sorted(received[:-1]) + received[-1:] == expected, client.report()
        assert proxy_requests(s, "list") == 1, "the informer relisted"


async def test_informer_protobuf_gets_every_change_once_in_order(
    tmp_path: Path, watchclient: Path
) -> None:
    """client-go asks for protobuf (JSON as the fallback). watchproxy passes such watches
    through unshared; the fake answers JSON, which client-go decodes by the Content-Type."""
    async with scenario(tmp_path, watchclient) as s:
        async with s.client("informer-protobuf", "--mode=informer", "--protobuf") as client:
            start = await synced(client, s, ALL)
            await s.churn(80)
            await converged(client, s, ALL, start.rv)
        assert client.returncode == 0, client.report()
        check_exact(client, start, s.log.seen_by(ALL, start.rv))
        seen = upstream_pod_watches(s.fake)
        assert seen["protobuf"] >= 1 and seen["json"] == 0, seen


async def test_json_protobuf_and_default_informers_at_once(
    tmp_path: Path, watchclient: Path
) -> None:
    """Two JSON informers share one upstream watch. The protobuf one, and one left with
    client-go's default content type (which prefers protobuf for built-in types), are passed
    through: one upstream watch each. (The fake apiserver has no protobuf encoder and answers
    JSON, so the hub's protobuf LIST is taken as a 406; against the real apiserver protobuf
    watches are shared: realapi/test_protobuf.py.)"""
    overrides = {k: v for k, v in OVERRIDES.items() if not k.startswith("hub.upstream_watch")}
    async with scenario(tmp_path, watchclient, overrides) as s:
        configs = {
            "informer-json-1": "--content-type=json",
            "informer-json-2": "--content-type=json",
            "informer-protobuf": "--content-type=protobuf",
            "informer-default": "--content-type=default",
        }
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(s.client(name, "--mode=informer", flag))
                for name, flag in configs.items()
            ]
            starts = [await synced(client, s, ALL) for client in clients]
            await s.hub_watching(2)
            # An informer is synced after its LIST; its watch follows a moment later.
            await s.fake.stats.wait_until(lambda st: st.active_watches >= 3, 10)
            await s.churn(60)
            for client, start in zip(clients, starts, strict=True):
                await converged(client, s, ALL, start.rv)
            active = s.fake.stats.active_watches
        assert active == 3, (active, upstream_pod_watches(s.fake))
        assert upstream_pod_watches(s.fake) == {"json": 1, "protobuf": 2}
        for client, start in zip(clients, starts, strict=True):
            assert client.returncode == 0, client.report()
            check_exact(client, start, s.log.seen_by(ALL, start.rv))


async def test_watch_list_informer_gets_every_change_once_in_order(
    tmp_path: Path, watchclient: Path
) -> None:
    """client-go's streaming list (WatchListClient, on by default from client-go 1.35): one
    watch with sendInitialEvents=true instead of LIST + WATCH, ended by the
    initial-events-end bookmark."""
    async with scenario(tmp_path, watchclient) as s:
        async with s.client(
            "informer-watch-list", "--mode=informer", env={"KUBE_FEATURE_WatchListClient": "true"}
        ) as client:
            start = await synced(client, s, ALL)
            await s.hub_watching(1)
            await s.churn(60)
            await converged(client, s, ALL, start.rv)
        assert client.returncode == 0, client.report()
        check_exact(client, start, s.log.seen_by(ALL, start.rv))
        # The client streamed its list: it never fell back to LIST + WATCH.
        assert proxy_requests(s, "list") == 0


async def test_label_selector_watch_resumes_from_its_last_resource_version(
    tmp_path: Path, watchclient: Path
) -> None:
    """A plain Watch with a selector, re-watching from its last RV every 2 s (timeoutSeconds):
    objects entering and leaving the selector arrive as ADDED and DELETED, nothing twice."""
    async with scenario(tmp_path, watchclient) as s:
        async with s.client(
            "watch-web", "--mode=watch", "--selector=app=web", "--watch-timeout=2s"
        ) as client:
            start = await synced(client, s, WEB)
            await s.hub_watching(1)
            await s.churn(120)
            await converged(client, s, WEB, start.rv)
        assert client.returncode == 0, client.report()
        check_exact(client, start, s.log.seen_by(WEB, start.rv))
        assert markers(client.lines, "BOOKMARK"), "allowWatchBookmarks=true got no bookmark"
        # Its re-watches were served from the hub's history.
        assert s.metric("watchproxy_watch_replays_total") >= 1


async def test_outage_loses_and_repeats_nothing(tmp_path: Path, watchclient: Path) -> None:
    """The apiserver resets every connection while pods keep changing; after it recovers the
    clients get every change they missed, once, on the streams they already had open."""
    async with scenario(tmp_path, watchclient) as s:
        async with (
            s.client("informer-json", "--mode=informer") as informer,
            s.client("watch-web", "--mode=watch", "--selector=app=web") as watcher,
        ):
            starts = [await synced(informer, s, ALL), await synced(watcher, s, WEB)]
            await s.hub_watching(2)
            await s.churn(20)
            await s.fake.faults.outage("reset")
            await s.churn(20)
            # The proxy has been refused at least twice before the apiserver comes back.
            await s.fake.stats.wait_until(lambda st: st.outage_connection_attempts >= 2, 10)
            await s.fake.faults.recover()
            await s.churn(20)
            await converged(informer, s, ALL, starts[0].rv)
            await converged(watcher, s, WEB, starts[1].rv)
        for client, start, flt in ((informer, starts[0], ALL), (watcher, starts[1], WEB)):
            assert client.returncode == 0, client.report()
            check_exact(client, start, s.log.seen_by(flt, start.rv))


@dataclass(frozen=True)
class Gap:
    """Changes the proxy's upstream watches missed and the history no longer holds."""

    first: int  # the store's RV when the watches were wedged
    last: int  # the store's RV when they were cut loose (nothing changed until the relist)
    before: list[dict[str, int]]  # per filter: the selected objects at ``first``
    after: list[dict[str, int]]  # ... and at ``last``


async def compacted_gap(s: Scenario, filters: Sequence[Filter], watches: int) -> Gap:
    """Wedge the ``watches`` upstream pod watches (re-opened, they send nothing at all),
    change pods, compact the history, then cut the wedged watches: whoever resumes them from
    their last resourceVersion gets 410 Expired and must relist."""
    fake = s.fake
    # Upstream watches end and re-open all the time here: cut them while all are open.
    await fake.stats.wait_until(lambda st: st.active_watches == watches, 10)
    fake.faults.hang_watches(True)
    opens = fake.stats.watch_opens(PODS)
    assert fake.faults.cut_watches() == watches
    await fake.stats.wait_until(lambda st: st.watch_opens(PODS) >= opens + watches, 10)
    first = fake.store.resource_version
    before = [store_state(fake.store, flt) for flt in filters]
    await s.churn(30)
    fake.store.compact()
    fake.faults.hang_watches(False)
    assert fake.faults.cut_watches() >= watches
    after = [store_state(fake.store, flt) for flt in filters]
    return Gap(first, fake.store.resource_version, before, after)


async def test_compaction_during_a_wedged_watch_is_bridged_without_loss_or_repeat(
    tmp_path: Path, watchclient: Path
) -> None:
    """The proxy's resume after a compaction gets 410 and it relists, hidden from the clients:
    they keep their streams and get, once each, every object that changed in the gap at its
    current resourceVersion and a DELETED for every object gone, then the later changes."""
    async with scenario(tmp_path, watchclient) as s:
        async with (
            s.client("informer-json", "--mode=informer") as informer,
            # Re-watching every second, it also resumes across the gap from the hub's history.
            s.client(
                "watch-web", "--mode=watch", "--selector=app=web", "--watch-timeout=1s"
            ) as watcher,
        ):
            clients = ((informer, ALL), (watcher, WEB))
            starts = [await synced(client, s, flt) for client, flt in clients]
            await s.hub_watching(2)
            await s.churn(20)
            for (client, flt), start in zip(clients, starts, strict=True):
                await converged(client, s, flt, start.rv)
            # One shared upstream watch per key: all pods, and app=web.
            gap = await compacted_gap(s, [ALL, WEB], watches=2)
            for (client, _), want in zip(clients, gap.after, strict=True):
                await holds(client, want, what="the relisted state to reach the client")
            await s.churn(20)
            for (client, flt), start in zip(clients, starts, strict=True):
                await converged(client, s, flt, start.rv)

        assert s.metric("watchproxy_watch_relists_total") >= 2  # the proxy did relist
        for i, ((client, flt), start) in enumerate(zip(clients, starts, strict=True)):
            assert client.returncode == 0, client.report()
            summary = relist_summary(gap.before[i], gap.after[i])
            assert summary[0] or summary[1], "the gap changed nothing this client can see"
            check_bridged(
                client,
                start,
                head=s.log.seen_by(flt, start.rv, gap.first),
                gap=summary,
                gap_rvs=(gap.first, gap.last),
                tail=s.log.seen_by(flt, gap.last),
            )


async def test_protobuf_informer_relists_by_itself_across_a_compaction(
    tmp_path: Path, watchclient: Path
) -> None:
    """Pinned as it is today: a protobuf watch passes through unshared, so the informer meets
    the 410 itself and relists (its handler sees SYNC updates and tombstone deletes, as it would
    against the apiserver directly). It loses nothing and ends with the store's state."""
    async with scenario(tmp_path, watchclient) as s:
        async with s.client("informer-protobuf", "--mode=informer", "--protobuf") as client:
            start = await synced(client, s, ALL)
            await s.churn(20)
            await converged(client, s, ALL, start.rv)
            gap = await compacted_gap(s, [ALL], watches=1)
            await holds(client, gap.after[0], what="the informer's own relist")
            await s.churn(20)
            await converged(client, s, ALL, start.rv)
        assert client.returncode == 0, client.report()
        received = events(client.lines[start.index :])
        head = s.log.seen_by(ALL, start.rv, gap.first)
        assert received[: len(head)] == head, diff_report(head, received[: len(head)])
        tail = s.log.seen_by(ALL, gap.last)
        after_gap = [e for e in received[len(head) :] if e.rv > gap.last]
        assert after_gap == tail, diff_report(tail, after_gap) + "\n" + client.report()
        assert markers(client.lines, "SYNC"), "no relist by the informer itself"
        assert s.metric("watchproxy_watch_relists_total") == 0  # nothing shared to relist


def check_bridged(
    client: ClientProcess,
    start: Start,
    *,
    head: list[Event],
    gap: tuple[list[Event], set[str]],
    gap_rvs: tuple[int, int],
    tail: list[Event],
) -> None:
    """Exact events before and after a gap; across it, each changed object once at its
    current RV (ascending) and one DELETED per vanished object, stamped inside the gap."""
    received = events(client.lines[start.index :])
    report = "\n" + client.report(last=40)
    changed, gone = gap
    assert received[: len(head)] == head, diff_report(head, received[: len(head)]) + report
    middle = received[len(head) : len(received) - len(tail)]
    assert received[len(received) - len(tail) :] == tail, (
        diff_report(tail, received[len(received) - len(tail) :]) + report
    )
    assert [e for e in middle if e.type != "DELETED"] == changed, (
        diff_report(changed, [e for e in middle if e.type != "DELETED"]) + report
    )
    deleted = [e for e in middle if e.type == "DELETED"]
    assert sorted(e.name for e in deleted) == sorted(gone), (bounded(deleted), gone, report)
    assert all(gap_rvs[0] < e.rv <= gap_rvs[1] for e in deleted), (deleted, gap_rvs)
    assert not (problems := order_problems(received)), client.report(problems)
    assert not (problems := bookmark_problems(client.lines)), client.report(problems)
    unexpected = markers(client.lines, "ERROR", "WATCH_ERROR", "RELIST", "SYNC")
    assert not unexpected, client.report(unexpected, last=40)
