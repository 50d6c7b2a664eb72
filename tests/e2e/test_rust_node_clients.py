"""kube-rs and @kubernetes/client-node, unmodified, through watchproxy against the fake apiserver.

Each client is a real program (tests/clients/rust: ``kube_runtime::watcher`` on pods, without
and with ``default_backoff()``; tests/clients/node: ``makeInformer`` on pods) that prints one
JSON line per event. The fake's store records every change with its resourceVersion
(``ChangeLog``) and the client's lines must match that record exactly: every change once, in
order, with the apiserver's RVs; for kube-rs, per list (Init … InitDone) and the Apply/Delete
events after it, and the state a reflector would end with.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from kubefake import FakeApiServer
from tests.clients.build_rust_node import (
    NodeClient,
    ToolchainMissing,
    build_kubewatch,
    on_ci,
    prepare_informer,
)
from tests.clients.expect import (
    ChangeLog,
    check_informer,
    check_kubers,
    kubers_state,
    seen_rv,
)
from tests.clients.process import ClientProcess, Line
from tests.component.test_consistent_list import watching as watching_pods
from tests.component.test_consistent_list import writing
from tests.harness import Running, running_proxy, wait_for

CLIENTS = ("kube-rs", "kube-rs-backoff", "client-node")


def _built(build: Callable[[], Any]) -> Any:
    try:
        return build()
    except ToolchainMissing as exc:
        if on_ci():
            pytest.fail(f"{exc} (CI=true: a missing toolchain is a failure)")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def kubewatch() -> Path:
    """The kubewatch binary, built once per session (scripts/test.sh builds it before pytest)."""
    path: Path = _built(build_kubewatch)
    return path


@pytest.fixture(scope="session")
def informer() -> NodeClient:
    client: NodeClient = _built(prepare_informer)
    return client


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}


def node_kubeconfig(path: str) -> str:
    """client-node >= 1.0 refuses a plain-http server unless the cluster entry also says
    ``insecure-skip-tls-verify: true`` ("HTTP protocol is not allowed when skipTLSVerify is not
    set or false"); watchproxy's kubeconfig is plain http, so a client-node user adds it."""
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    for entry in config["clusters"]:
        if entry["cluster"]["server"].startswith("http://"):
            entry["cluster"]["insecure-skip-tls-verify"] = True
    out = path + ".client-node"
    with open(out, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return out


@pytest.fixture
def start_client(
    request: pytest.FixtureRequest, tmp_path: Path, running: tuple[Running, ChangeLog]
) -> Callable[[str, str], AsyncIterator[ClientProcess]]:
    """``async with start_client(kind, route) as client``: running, listed and watching."""

    @contextlib.asynccontextmanager
    async def start(kind: str, route: str = "watchproxy") -> AsyncIterator[ClientProcess]:
        run = running[0]
        kubeconfig = run.kubeconfig if route == "watchproxy" else run.upstream_kubeconfig
        if kind.startswith("kube-rs"):
            binary: Path = request.getfixturevalue("kubewatch")
            backoff = "default" if kind == "kube-rs-backoff" else "none"
            argv = [str(binary), "--backoff", backoff]
            ready: Callable[[list[Line]], bool] = lambda ls: any(  # noqa: E731
                line["type"] == "InitDone" for line in ls
            )
        else:
            node: NodeClient = request.getfixturevalue("informer")
            argv = [node.node, str(node.script)]
            kubeconfig = node_kubeconfig(kubeconfig)
            ready = lambda ls: any(line["type"] == "READY" for line in ls)  # noqa: E731
        env = {**os.environ, "KUBECONFIG": kubeconfig}
        client = ClientProcess(kind, argv, env=env, log_path=tmp_path / f"{kind}.stderr")
        await client.start()
        try:
            await client.wait_until(ready, what="first list", timeout=20)
            # The client's watch is open (at the proxy or at the fake) before the test changes
            # anything: a change between its LIST and its WATCH is another test's subject.
            await wait_for(lambda: watching(running[0], route), what="the client's watch")
            yield client
        finally:
            await client.stop()

    return start  # type: ignore[return-value]


def watching(run: Running, route: str) -> bool:
    """The one client's watch is open: subscribed to a synced shared watch, or at the fake."""
    if route == "direct":
        return run.fake.stats.active_watches >= 1
    shared = run.proxy.debug_watches()
    return any(w["subscribers"] >= 1 and w["state"] == "watching" for w in shared)


def check(kind: str, lines: list[Line], log: ChangeLog) -> list[str]:
    if kind.startswith("kube-rs"):
        problems = check_kubers(lines, log)
        final = log.state_at(log.last_rv)
        if kubers_state(lines) != final:
            problems.append(f"reflector state {kubers_state(lines)} != store {final}")
        return problems
    return check_informer(lines, log)


async def caught_up(client: ClientProcess, log: ChangeLog) -> None:
    target = log.last_rv
    await client.wait_until(lambda ls: seen_rv(ls) >= target, what=f"RV {target}")


def errors(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line["type"] == "ERROR"]


def inits(lines: list[Line]) -> int:
    return sum(1 for line in lines if line["type"] == "Init")


def some_changes(running: Running, prefix: str) -> None:
    """Creates, updates, a delete and a re-create under the same name."""
    store = running.fake.store
    for i in range(3):
        store.create("pods", "default", pod(f"{prefix}-{i}"))
    store.patch_labels("pods", "default", f"{prefix}-0", {"step": "1"})
    store.patch_labels("pods", "default", f"{prefix}-0", {"step": "2"})
    store.delete("pods", "default", f"{prefix}-1")
    store.create("pods", "default", pod(f"{prefix}-1"))


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Running, ChangeLog]]:
    async with running_proxy(tmp_path) as run:
        log = ChangeLog(run.fake.store)
        try:
            for i in range(3):
                run.fake.store.create("pods", "default", pod(f"seed-{i}"))
            yield run, log
        finally:
            log.close()


@pytest.mark.parametrize("route", ["watchproxy", "direct"])
@pytest.mark.parametrize("kind", CLIENTS)
async def test_client_sees_every_change_once_in_order(
    kind: str, route: str, running: tuple[Running, ChangeLog], start_client: Any
) -> None:
    run, log = running
    async with start_client(kind, route) as client:
        some_changes(run, "a")
        await caught_up(client, log)
    assert not errors(client.lines), client.report()
    assert not (problems := check(kind, client.lines, log)), client.report(problems)


@pytest.mark.parametrize("kind", CLIENTS)
async def test_client_sees_every_change_across_an_outage(
    kind: str, running: tuple[Running, ChangeLog], start_client: Any
) -> None:
    run, log = running
    async with start_client(kind) as client:
        some_changes(run, "before")
        await caught_up(client, log)
        await run.fake.faults.outage("reset")
        some_changes(run, "during")
        # The proxy has met the outage (a reset connection) before the apiserver comes back.
        await run.fake.stats.wait_until(lambda s: s.outage_connection_attempts >= 1, within=10)
        await run.fake.faults.recover()
        some_changes(run, "after")
        await caught_up(client, log)
    # watchproxy held the client's stream open: the client never saw the outage.
    assert not errors(client.lines), client.report()
    assert inits(client.lines) <= 1, client.report()
    assert not (problems := check(kind, client.lines, log)), client.report(problems)


@pytest.mark.parametrize("kind", CLIENTS)
async def test_client_sees_every_change_across_a_compaction(
    kind: str, running: tuple[Running, ChangeLog], start_client: Any
) -> None:
    run, log = running
    store = run.fake.store
    async with start_client(kind) as client:
        some_changes(run, "before")
        await caught_up(client, log)
        # In one step, with no await in between, so the proxy can see none of it: its watch is
        # cut, each object changes once, and history is compacted past the proxy's RV. The
        # proxy's resume gets 410 and it relists. The delete comes last: a relist DELETE
        # carries the list's RV, which is then the deletion's own RV.
        run.fake.faults.cut_watches()
        store.create("pods", "default", pod("gap-new"))
        store.patch_labels("pods", "default", "before-0", {"gap": "yes"})
        store.delete("pods", "default", "seed-2")
        store.compact()
        await caught_up(client, log)
        some_changes(run, "after")
        await caught_up(client, log)
    relists = sum(watch["relists"] for watch in run.proxy.debug_watches())
    assert relists >= 1, run.proxy.debug_watches()
    assert not errors(client.lines), client.report()
    assert inits(client.lines) <= 1, client.report()
    assert not (problems := check(kind, client.lines, log)), client.report(problems)


async def test_kubers_direct_without_backoff_relists_nothing_after_a_cut(
    running: tuple[Running, ChangeLog], start_client: Any
) -> None:
    """Control for the checker: kube-rs straight to the apiserver resumes by RV after a cut
    watch (no second Init), so its lines match the record as they do through the proxy."""
    run, log = running
    async with start_client("kube-rs", "direct") as client:
        some_changes(run, "before")
        await caught_up(client, log)
        run.fake.faults.cut_watches()
        some_changes(run, "after")
        await caught_up(client, log)
    assert not (problems := check("kube-rs", client.lines, log)), client.report(problems)
    assert inits(client.lines) == 1, client.report()


async def test_kubers_lists_in_pages_from_the_hub(kubewatch: Path, tmp_path: Path) -> None:
    """kube-rs's watcher listing consistently (``ListSemantic::MostRecent``) in pages of 10
    through watchproxy while pods keep coming: page 1 from the hub once it is current, every
    later page from its snapshot (no continued LIST reaches the apiserver), and the watcher's
    lines are the store's record."""
    async with running_proxy(tmp_path, {"hub.consistent_list_wait_seconds": 2.0}) as run:
        log = ChangeLog(run.fake.store)
        try:
            for i in range(25):
                run.fake.store.create("pods", "default", pod(f"seed-{i:02}"))
            argv = [str(kubewatch), "--backoff", "default", "--page-size", "10"]
            argv += ["--list-semantic", "most-recent"]
            env = {**os.environ, "KUBECONFIG": run.kubeconfig}
            client = ClientProcess("kube-rs", argv, env=env, log_path=tmp_path / "kubers.stderr")
            # A client watch holds the pods' shared watch open and a pod is created every 10 ms,
            # so a consistent LIST of them is the hub's to answer (docs/lists.md).
            async with (
                aiohttp.ClientSession() as session,
                watching_pods(run, session),
                writing(run),
            ):
                await client.start()
                try:
                    await client.wait_until(
                        lambda ls: any(line["type"] == "InitDone" for line in ls),
                        what="the paged list",
                        timeout=20,
                    )
                except BaseException:
                    await client.stop()
                    raise
            try:
                await caught_up(client, log)
            finally:
                await client.stop()
        finally:
            log.close()
    registry = run.proxy.metrics.registry
    pages = registry.get_sample_value("watchproxy_consistent_lists_total", {"outcome": "page"})
    continued = [r for r in run.fake.stats.requests if "continue=" in r.query_string]
    init_applies = sum(1 for line in client.lines if line["type"] == "InitApply")
    assert not errors(client.lines), client.report()
    assert inits(client.lines) == 1, client.report()
    assert not (problems := check("kube-rs", client.lines, log)), client.report(problems)
    assert init_applies >= 25 and pages == (init_applies + 9) // 10 - 1, (init_applies, pages)
    assert continued == []


async def test_kubers_stopped_in_the_middle_of_a_burst_exits_at_once_and_cleanly(
    kubewatch: Path, tmp_path: Path
) -> None:
    """SIGTERM while eight kube-rs watchers print a burst of events: kubewatch exits 0 at once,
    its EXIT line last and no ERROR line. It used to return from main while a watcher task was
    still in the middle of a poll, so the runtime's shutdown dropped that watcher's connection
    ("connection closed before message completed") and kube's Buffer worker under it, and the
    watcher looped on "buffer's worker closed unexpectedly" without ever waiting: the aborted
    task never ended and the process never exited (this test failed 3 runs of 3)."""
    watchers, burst = 8, 300
    for _round in range(4):
        async with FakeApiServer(bookmark_interval=0.5) as fake:
            fake.store.create("pods", "default", pod("busy"))
            kubeconfig = fake.write_kubeconfig(str(tmp_path / "direct.kubeconfig"))
            argv = [str(kubewatch), "--backoff", "none", "--watchers", str(watchers)]
            env = {**os.environ, "KUBECONFIG": kubeconfig}
            client = ClientProcess("kube-rs", argv, env=env, log_path=tmp_path / "kubers.stderr")
            await client.start()
            try:
                await client.wait_until(
                    lambda ls: sum(line["type"] == "InitDone" for line in ls) == watchers,
                    what="every watcher's list",
                    timeout=20,
                )
                await fake.stats.wait_until(lambda s: s.active_watches == watchers, within=10)
                for i in range(burst):
                    fake.store.patch_labels("pods", "default", "busy", {"i": str(i)})
                # Stopped while the burst is being printed.
                await client.wait_until(
                    lambda ls: any(line["type"] == "Apply" for line in ls), what="the burst"
                )
            finally:
                code = await client.stop(timeout=5)
        assert code == 0, client.report()
        assert not errors(client.lines), client.report()
        assert client.lines[-1]["type"] == "EXIT", client.report()
