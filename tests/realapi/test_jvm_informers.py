"""JVM informers (fabric8 kubernetes-client with its default config and with HTTP-only
watches, the official client-java's SharedInformerFactory) through watchproxy against the real
apiserver, each beside the same program direct.

Each client runs one program of ``INFORMERS`` informers on the configmaps of one fresh
namespace (tests/clients/java, built by ``python -m tests.clients.build_java``), twice: through
a watchproxy of its own in its default configuration, and direct. Each route reaches the
apiserver through a ``TcpRelay`` of its own, which counts the TCP connections made to it. All six
programs run at once, against one namespace and one writer (JVMs take seconds to start on a
busy machine: one scenario for all keeps the module near a minute):

1. every program syncs (READY: each of its informers listed);
2. configmaps are created, changed and deleted; every informer through watchproxy must get each
   change once, each object's in order, with the apiserver's resourceVersions (the record: the
   test's own direct watch; an informer's queue keeps no order across objects);
3. every relay is cut for ``OUTAGE_SECONDS`` while the changes go on (written directly), then
   restored; more changes; every informer through watchproxy must end with every change of the
   record, the ones during the outage included (where etcd had compacted the hub's resume
   point, as bridged by the hub's relist: each changed object once, each deleted one once). The
   relays' counts during the cut are the upstream connection attempts, watchproxy's beside the
   same program's direct;
4. the watchproxy of each program served its informers' watches from one shared upstream watch
   (its metrics, read before the outage).

fabric8's default config asks for every watch over WebSocket: its tests here need watchproxy to
serve WebSocket watches (without that, fabric8 gets a 400 and its informers stop).

The scenario runs once per test run (the ``outcome`` fixture, shared by pytest-xdist's
workers); each test judges one client on one guarantee, so that the compatibility page
(scripts/compatibility.py) has a verdict per client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.clientconnector import SerialConnector
from tests.clients.build_java import JavaPrograms, ToolchainMissing, build_java_clients, on_ci
from tests.clients.expect import Change, ChangeLog, per_object_problems
from tests.clients.process import LINE_CHARS, ClientProcess, Line, bounded
from tests.harness import RunningProxy, proxy_for_upstream, wait_for
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api, TcpRelay
from tests.realapi.test_real_clients import ApiRecord, hub_cursors

# The scenario runs in the module fixture (its own bound: SCENARIO_TIMEOUT); the tests only
# judge its outcome.
pytestmark = pytest.mark.timeout(60, func_only=True)

INFORMERS = 10
OUTAGE_SECONDS = 20.0
STEPS = 5  # writer steps per phase (before, during and after the outage)
# watchproxy's default prober schedule (0.8 s doubling, capped at 8 s) makes about 6 attempts
# in 20 s, plus the few shared watches' own retries: a bound well below any client's own.
MAX_PROXY_ATTEMPTS = 10
START_TIMEOUT = 90.0  # six JVMs starting at once on two busy cores
HUB_TIMEOUT = 30.0  # from READY (the lists done) to every informer's watch in the hub
SETTLE_TIMEOUT = 40.0  # after the outage: the prober's next attempt, then the hub's resume
SCENARIO_TIMEOUT = 300.0
# Six JVMs on two cores: C1 only and the serial collector spare the start-up CPU of the JIT's
# second tier and of the parallel collector's threads, and change nothing in how the client
# talks HTTP.
JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m")


@dataclass(frozen=True)
class Client:
    id: str
    program: str  # JavaPrograms attribute
    args: tuple[str, ...] = ()
    needs: str = ""  # what watchproxy must do for it, for the report


CLIENTS = (
    Client("fabric8-default", "fabric8", needs="WebSocket watches (fabric8's default)"),
    Client("fabric8-http-only", "fabric8", ("--http-only",)),
    Client("client-java", "client_java"),
)
ROUTES = ("watchproxy", "direct")


@dataclass
class Run:
    """One program on one route and what came of it."""

    client: Client
    route: str
    relay: TcpRelay
    process: ClientProcess
    proxy: RunningProxy | None = None
    failure: str | None = None  # why it was no longer followed, with its report
    ready_after: float | None = None
    attempts: int | None = None  # TCP connections to the relay during the cut
    shared: dict[str, float] = field(default_factory=dict)  # watchproxy's metrics, pre-outage

    @property
    def name(self) -> str:
        return f"{self.client.id}-{self.route}"

    def fail(self, why: str) -> None:
        self.failure = self.failure or why

    def result(self) -> Result:
        return Result(
            self.client.id,
            self.route,
            self.process.lines,
            self.failure,
            self.ready_after,
            self.attempts,
            self.shared,
            self.process.stderr_tail(),
        )


@dataclass
class Result:
    """What became of one program on one route, as plain data (JSON between xdist workers)."""

    client: str
    route: str
    lines: list[Line]
    failure: str | None
    ready_after: float | None
    attempts: int | None
    shared: dict[str, float]
    stderr: str

    @property
    def name(self) -> str:
        return f"{self.client}-{self.route}"

    def report(self, problems: list[str]) -> str:
        shown = "\n".join(json.dumps(line)[:LINE_CHARS] for line in self.lines[-15:])
        return (
            f"--- problems: {bounded(problems)}\n--- last 15 of {len(self.lines)} lines of"
            f" {self.name}:\n{shown}\n--- stderr of {self.name}:\n{self.stderr[-3000:]}"
        )


@dataclass
class Outcome:
    """The scenario's results and the apiserver's record of the changes."""

    results: dict[str, Result]  # by "client-route"
    changes: list[tuple[str, str, int]]  # the record: (type, name, resourceVersion)
    start_rv: int
    before_cut: int  # the record's last resourceVersion before the relays were cut

    def result(self, client: Client, route: str) -> Result:
        return self.results[f"{client.id}-{route}"]

    def log(self) -> ChangeLog:
        """The record as a ChangeLog again (the checkers' input)."""
        replay = Replay(self.start_rv)
        log = ChangeLog(replay)
        for kind, name, rv in self.changes:
            replay.feed(kind, name, rv)
        return log

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        data = json.loads(text)
        results = {key: Result(**value) for key, value in data.pop("results").items()}
        changes = [tuple(change) for change in data.pop("changes")]
        return cls(results=results, changes=changes, **data)


class Replay:
    """A StoreLike that hands recorded changes to a ChangeLog."""

    def __init__(self, start_rv: int) -> None:
        self.resource_version = start_rv
        self._listeners: list[Callable[[Any], None]] = []

    def subscribe(self, resource: str, fn: Callable[[Any], None]) -> Callable[[], None]:
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn)

    def feed(self, kind: str, name: str, rv: int) -> None:
        # The record holds one namespace's changes: ChangeLog's default namespace stands for it.
        obj = {"metadata": {"namespace": "default", "name": name}}
        for listener in self._listeners:
            listener(SimpleNamespace(type=kind, obj=obj, rv=rv))


class ConfigMaps:
    """Configmap changes made directly at the apiserver; remembers the last resourceVersion."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.path = f"/api/v1/namespaces/{namespace}/configmaps"
        self.live: list[str] = []
        self.made = 0
        self.last_rv = 0

    async def step(self) -> None:
        """Create two, delete the oldest beyond five, change one: the change is the step's last
        write (a DELETE answers with the object before its deletion's resourceVersion)."""
        for _ in range(2):
            self.made += 1
            name = f"cm-{self.made}"
            body = {"metadata": {"name": name}, "data": {"n": "0"}}
            self._saw(await self.api.ok("POST", self.path, body=body))
            self.live.append(name)
        if len(self.live) > 5:
            gone = self.live.pop(0)
            await self.api.ok("DELETE", f"{self.path}/{gone}")
        changed = self.live[len(self.live) // 2]
        body = await self.api.ok(
            "PATCH",
            f"{self.path}/{changed}",
            body={"data": {"n": str(self.made)}},
            content_type="application/merge-patch+json",
        )
        self._saw(body)

    def _saw(self, body: dict[str, Any]) -> None:
        self.last_rv = max(self.last_rv, int(body["metadata"]["resourceVersion"]))


def informer_lines(lines: list[Line], informer: int) -> list[Line]:
    return [line for line in lines if line.get("informer") == informer]


def informer_state(lines: list[Line]) -> dict[str, int]:
    """name -> resourceVersion an informer's store holds after these handler calls."""
    state: dict[str, int] = {}
    for line in lines:
        if line["type"] in ("ADDED", "MODIFIED", "SYNC"):
            state[line["name"]] = int(line["resourceVersion"])
        elif line["type"] == "DELETED":
            state.pop(line["name"], None)
    return state


def every_informer_holds(want: dict[str, int]) -> Any:
    def holds(lines: list[Line]) -> bool:
        return all(informer_state(informer_lines(lines, i)) == want for i in range(INFORMERS))

    return holds


def ready(lines: list[Line]) -> bool:
    return any(line["type"] == "READY" for line in lines)


def sample(running: RunningProxy, name: str, labels: dict[str, str] | None = None) -> float:
    registry = running.proxy.metrics.registry
    return registry.get_sample_value(name, labels or {}) or 0.0


def upstream_watch_requests(running: RunningProxy) -> float:
    """Watches watchproxy sent upstream, whatever their answer."""
    registry = running.proxy.metrics.registry
    return sum(
        s.value
        for metric in registry.collect()
        if metric.name == "watchproxy_upstream_requests"
        for s in metric.samples
        if s.name.endswith("_total") and s.labels.get("verb") == "watch"
    )


async def wait_each(runs: list[Run], check: Any, *, what: str, timeout: float) -> None:
    """``check`` on every run still followed, at once; a run that fails it is marked failed
    with its report (the others go on)."""

    async def one(run: Run) -> None:
        try:
            await run.process.wait_until(check(run), what=what, timeout=timeout)
        except AssertionError as error:
            run.fail(f"{what}: {error}")

    await asyncio.gather(*(one(run) for run in runs if run.failure is None))


async def wait_ready(run: Run) -> None:
    started = time.monotonic()
    try:
        await run.process.wait_until(ready, what="READY", timeout=START_TIMEOUT)
    except AssertionError as error:
        run.fail(f"READY: {error}")
    else:
        run.ready_after = time.monotonic() - started


async def hub_serves_every_informer(run: Run) -> None:
    """Until the hub serves every informer's watch (no line to wake on: a bounded poll)."""
    if run.failure is not None:
        return
    proxy = run.proxy
    assert proxy is not None
    try:
        await wait_for(
            lambda: hub_cursors(proxy) >= INFORMERS,
            timeout=HUB_TIMEOUT,
            what=f"{INFORMERS} hub-served watches",
        )
    except AssertionError as error:
        run.fail(f"{error} ({hub_cursors(proxy)} served)\n{run.process.report()}")


@pytest.fixture(scope="module")
def programs(real_apiserver: RealApiServer) -> JavaPrograms:
    try:
        return build_java_clients()
    except ToolchainMissing as exc:
        if on_ci():
            pytest.fail(f"{exc} (CI=true: a missing toolchain is a failure)")
        pytest.skip(str(exc))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def outcome(
    real_apiserver: RealApiServer,
    programs: JavaPrograms,
    tmp_path_factory: pytest.TempPathFactory,
    worker_id: str,
) -> Outcome:
    """The scenario's outcome, run once per test run: pytest-xdist hands this module's tests
    to several workers, and the first to get here runs it (six JVMs) while the others wait
    for its results (the directory above each worker's base temp is the run's own)."""
    tmp = tmp_path_factory.mktemp("jvm")
    if worker_id == "master":
        return await run_scenario(real_apiserver, programs, tmp)
    shared = tmp_path_factory.getbasetemp().parent
    results = shared / "jvm-informers.json"
    with open(shared / "jvm-informers.lock", "w", encoding="utf-8") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        if results.exists():
            return Outcome.from_json(results.read_text(encoding="utf-8"))
        outcome = await run_scenario(real_apiserver, programs, tmp)
        results.write_text(outcome.to_json(), encoding="utf-8")
        return outcome


async def run_scenario(real: RealApiServer, programs: JavaPrograms, tmp: Path) -> Outcome:
    connector = SerialConnector(is_down=lambda: False, on_failure=lambda _error: None)
    async with aiohttp.ClientSession(connector=connector) as session:
        direct = Api(session, real.url, token=real.token, ssl_context=real.ssl_context())
        async with asyncio.timeout(SCENARIO_TIMEOUT):
            result = await scenario(real, direct, programs, tmp)
    await connector.wait_closed(5.0)
    return result


async def scenario(real: RealApiServer, direct: Api, programs: JavaPrograms, tmp: Path) -> Outcome:
    namespace = f"t-{secrets.token_hex(4)}"
    await direct.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    listed = await direct.ok("GET", f"/api/v1/namespaces/{namespace}/configmaps")
    # The informers' first lists are empty, so that every ADDED they print is a change of the
    # record (an informer may hand over its initial adds after it reports synced).
    assert listed["items"] == [], "a fresh namespace with configmaps in it"
    record = ApiRecord(direct, namespace, int(listed["metadata"]["resourceVersion"]), "configmaps")
    log = ChangeLog(record, namespace)
    writer = ConfigMaps(direct, namespace)
    runs: dict[tuple[str, str], Run] = {}
    async with contextlib.AsyncExitStack() as stack:
        recorded_up_to = await stack.enter_async_context(record.recording())
        for client in CLIENTS:
            for route in ROUTES:
                run = await stack.enter_async_context(
                    start(client, route, real, programs, namespace, tmp)
                )
                runs[client.id, route] = run
        every = list(runs.values())
        await asyncio.gather(*(wait_ready(run) for run in every))
        proxied = [run for run in every if run.proxy is not None]
        await asyncio.gather(*(hub_serves_every_informer(run) for run in proxied))

        for _ in range(STEPS):
            await writer.step()
        await recorded_up_to(writer.last_rv)
        before_cut = writer.last_rv
        want = log.state_at(before_cut)
        await wait_each(
            every, lambda _run: every_informer_holds(want), what="the changes", timeout=30
        )
        for run in proxied:
            assert run.proxy is not None
            run.shared = {
                "shared_watches": sample(run.proxy, "watchproxy_shared_watches"),
                "subscribers": sample(
                    run.proxy, "watchproxy_watch_subscribers", {"resource": "v1/configmaps"}
                ),
                "upstream_watches": upstream_watch_requests(run.proxy),
            }

        accepted = {key: run.relay.accepted for key, run in runs.items()}
        for run in every:
            run.relay.set_cut(True)
        for _ in range(STEPS):
            await writer.step()
            await asyncio.sleep(OUTAGE_SECONDS / STEPS)
        for key, run in runs.items():
            run.attempts = run.relay.accepted - accepted[key]
            run.relay.set_cut(False)

        for _ in range(STEPS):
            await writer.step()
        await recorded_up_to(writer.last_rv)
        final = log.state_at(writer.last_rv)
        # Direct programs recover on their own schedules (fabric8 backs off up to 32 s): they
        # are here for their attempts, not waited for.
        await wait_each(
            proxied,
            lambda _run: every_informer_holds(final),
            what="the final state",
            timeout=SETTLE_TIMEOUT,
        )
    log.close()
    return Outcome(
        {run.name: run.result() for run in runs.values()},
        [(c.type, c.name, c.rv) for c in log.changes],
        log.start_rv,
        before_cut,
    )


@contextlib.asynccontextmanager
async def start(
    client: Client,
    route: str,
    real: RealApiServer,
    programs: JavaPrograms,
    namespace: str,
    tmp: Path,
) -> AsyncIterator[Run]:
    """The client's program on ``route``, behind a relay of its own, started (not yet READY)."""
    name = f"{client.id}-{route}"
    async with TcpRelay(real.port) as relay:
        upstream = real.write_kubeconfig(
            tmp / f"{name}.upstream.kubeconfig", token=real.token, server=relay.url
        )
        async with contextlib.AsyncExitStack() as stack:
            proxy = None
            kubeconfig = upstream
            if route == "watchproxy":
                workdir = tmp / name
                workdir.mkdir()
                proxy = await stack.enter_async_context(proxy_for_upstream(workdir, upstream))
                kubeconfig = proxy.kubeconfig
            jar = getattr(programs, client.program)
            argv = [
                programs.java,
                *JVM_FLAGS,
                "-jar",
                str(jar),
                "--namespace",
                namespace,
                "--informers",
                str(INFORMERS),
                *client.args,
            ]
            env = {**os.environ, "KUBECONFIG": kubeconfig}
            process = ClientProcess(name, argv, env=env, log_path=tmp / f"{name}.stderr")
            await process.start()
            try:
                yield Run(client, route, relay, process, proxy)
            finally:
                await process.stop()


def proxied(outcome: Outcome, client: Client) -> Result:
    run = outcome.result(client, "watchproxy")
    if run.failure is not None:
        needs = f" (it needs {client.needs})" if client.needs else ""
        pytest.fail(f"{run.name}{needs}: {run.failure}", pytrace=False)
    return run


@pytest.mark.parametrize("client", CLIENTS, ids=[c.id for c in CLIENTS])
def test_jvm_informers_sync_through_watchproxy(outcome: Outcome, client: Client) -> None:
    run = proxied(outcome, client)
    direct = outcome.result(client, "direct")
    # For the record (pytest -rP shows it): start-up to READY of the ten informers.
    print(f"{client.id}: READY after {run.ready_after:.1f} s through watchproxy", end="")
    print(f", {direct.ready_after:.1f} s direct" if direct.ready_after is not None else "")
    assert ready(run.lines)
    # The same program direct syncs too: the client itself works against this apiserver.
    assert direct.ready_after is not None, direct.failure


@pytest.mark.parametrize("client", CLIENTS, ids=[c.id for c in CLIENTS])
def test_jvm_informers_get_every_change_once_in_order(outcome: Outcome, client: Client) -> None:
    """Each object's changes once, in the record's order, with its resourceVersions; across the
    outage as the hub's relist bridges a gap etcd compacted (see ``per_object_problems``: an
    informer's queue keeps the order per object only); never a relist of the informer's own
    (no SYNC, no tombstone), never an error."""
    run = proxied(outcome, client)
    log = outcome.log()
    problems: list[str] = []
    for i in range(INFORMERS):
        lines = informer_lines(run.lines, i)
        got = [
            Change("DELETED" if line["type"] == "DELETED" else "SET", line["name"], rv(line))
            for line in lines
            if line["type"] in ("ADDED", "MODIFIED", "DELETED")
        ]
        found = per_object_problems(got, log, outcome.before_cut)
        problems += [f"informer {i}: {p}" for p in found]
        odd = [line for line in lines if line["type"] == "SYNC" or line.get("tombstone")]
        problems += [f"informer {i}: a relist of its own: {line}" for line in odd]
    problems += [str(line) for line in run.lines if "ERROR" in line["type"]]
    assert not problems, run.report(problems)


def rv(line: Line) -> int:
    return int(line["resourceVersion"])


@pytest.mark.parametrize("client", CLIENTS, ids=[c.id for c in CLIENTS])
def test_jvm_informers_outage_costs_few_upstream_attempts(outcome: Outcome, client: Client) -> None:
    """Through watchproxy the apiserver sees its prober's few attempts during a 20 s outage,
    whatever the informers do; the same program direct makes its own, one series per
    informer."""
    direct = outcome.result(client, "direct")
    # For the record (pytest -rA shows it), before a failure on watchproxy's side.
    print(f"{client.id}: upstream connection attempts in the outage: direct {direct.attempts}")
    run = proxied(outcome, client)
    said = f"{OUTAGE_SECONDS:.0f} s outage: watchproxy {run.attempts}, direct {direct.attempts}"
    print(said)
    assert run.attempts is not None and direct.attempts is not None, said
    assert 1 <= run.attempts <= MAX_PROXY_ATTEMPTS, said
    assert run.attempts < direct.attempts, said
    # ... and nothing was lost meanwhile (every informer reached the final state).
    log = outcome.log()
    assert every_informer_holds(log.state_at(log.last_rv))(run.lines)


@pytest.mark.parametrize("client", CLIENTS, ids=[c.id for c in CLIENTS])
def test_jvm_informers_of_one_program_share_one_upstream_watch(
    outcome: Outcome, client: Client
) -> None:
    run = proxied(outcome, client)
    assert run.shared == {
        "shared_watches": 1,
        "subscribers": INFORMERS,
        "upstream_watches": 1,
    }, bounded([run.shared])
