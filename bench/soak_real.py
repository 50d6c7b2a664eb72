"""Soak against a real kube-apiserver + etcd (kubetestenv) through a fault-injecting TCP relay.

    .venv/bin/python -m bench.soak_real --duration 1200 --clients 100 [--fault-interval 20]

The path: clients -> watchproxy (a subprocess) -> ``tests.faultproxy.FaultProxy`` (raw TCP, TLS
passes through it) -> kube-apiserver. One writer changes pods in "default" straight at the
apiserver (never through the relay). The record of what happened is the apiserver's own: an admin
watch straight at it (a DELETE of a pod is a MODIFIED and a DELETED there, which no write answer
shows). Writes pause over a restart until that watch is live again, so where its resume gets 410
a LIST must equal the record, and every write's answer (type, name, RV) must be in the record
once. Every client's stream is checked against the record as ``bench.soak`` checks it against the
fake's change log (order, exactness, clean ends, final state).

Faults, one at a time, in shuffled rounds so that every kind comes up:

* ``reset``: every relayed connection gets a RST;
* ``refuse``: new connections are reset at once for 2-5 s, open ones too;
* ``blackhole``: new connections are accepted and never answered, open ones freeze (half-open),
  for 5-20 s;
* ``halfopen``: open connections freeze (nothing flows, nothing is closed), new ones pass;
* ``truncate``: the next reply stops half-way (inside a TLS record, so inside a chunk), then FIN;
* ``cutrecord``: the same with a RST;
* ``restart``: the apiserver process ends (SIGTERM) and starts again on the same etcd data,
  certificates and ports (writes pause meanwhile);
* ``compact``: an outage (new and open connections reset) during which the writer goes on, etcd
  is compacted to its current revision and, half the time, the apiserver restarts (a fresh watch
  cache: watchproxy's resume then gets 410 and relists).

A relist answers with a difference, not the events: client sessions whose range overlaps a
``restart`` or ``compact`` fault get the order and final-state checks only (as ``bench.soak``
does for its ``relist`` fault).

Leaks: watchproxy's open file descriptors and asyncio tasks (a scrape-time figure the launcher
adds to /metrics) are read before the first client and again after the last one has gone and the
shared watches have ended; RSS after the first report and at the end. The run fails when fds or
tasks end more than ``--fd-slack``/``--task-slack`` above the start, or RSS grew more than
``--rss-slack-mib`` after warm-up.

Exit status 1 on any violation, 0 otherwise. Needs tests/realapi/bin/kubetestenv.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.soak import (
    PODS,
    Client,
    Key,
    Stats,
    Truth,
    final_check,
    free_port,
    metric,
    proc_figures,
    quiesce,
    wait_ready,
)
from kubefake.store import Change
from tests.faultproxy import FaultProxy
from tests.realapi.fixture import RealApiServer, start_kubetestenv

# watchproxy as ``python -m watchproxy`` (uvloop), plus one scrape-time figure: how many asyncio
# tasks the process holds (read on the loop's own thread, where /metrics is served).
LAUNCHER = """
import asyncio, sys
import watchproxy.cli as cli
import watchproxy.metrics as m
_render = m.Metrics.render
def render(self):
    tasks = asyncio.all_tasks()
    kinds = {}
    for task in tasks:
        name = getattr(task.get_coro(), "__qualname__", "?")
        kinds[name] = kinds.get(name, 0) + 1
    lines = [b"soak_asyncio_tasks %d\\n" % len(tasks)]
    lines += [b'soak_tasks_by_coro{coro="%s"} %d\\n' % (k.encode(), n) for k, n in kinds.items()]
    return _render(self) + b"".join(lines)
m.Metrics.render = render
sys.exit(cli.main())
"""
KINDS = ("reset", "refuse", "blackhole", "halfopen", "truncate", "cutrecord", "restart", "compact")
APISERVER_EXTRA = (
    "-max-requests-inflight", "400", "-max-mutating-requests-inflight", "200",
    "-compaction-interval", "60s",
)  # fmt: skip


# --- the apiserver and its record ----------------------------------------------------------------


class Apiserver:
    """kubetestenv, restartable on the same state directory and ports."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.server: RealApiServer | None = None
        self.restarts = 0

    @property
    def current(self) -> RealApiServer:
        assert self.server is not None
        return self.server

    async def start(self) -> RealApiServer:
        port = self.server.port if self.server else 0
        etcd_port = self.server.etcd_port if self.server else 0
        self.server = await asyncio.to_thread(
            start_kubetestenv,
            self.state_dir,
            port=port,
            etcd_port=etcd_port,
            extra=APISERVER_EXTRA,
        )
        return self.server

    async def restart(self) -> None:
        await asyncio.to_thread(self.current.stop)
        await self.start()
        self.restarts += 1

    async def stop(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


class Writer:
    """The only writer of pods in "default"; keeps each write's answer (type, name, RV)."""

    def __init__(self, api: Apiserver, session: aiohttp.ClientSession, rng: random.Random) -> None:
        server = api.current
        self.url = server.url + PODS
        self.ssl = server.ssl_context()
        self.headers = server.auth()
        self.session = session
        self.rng = rng
        self.objects: dict[str, dict[str, Any]] = {}
        self.names = [f"pod-{i}" for i in range(150)]
        self.writable = asyncio.Event()
        self.writable.set()
        self.busy = asyncio.Lock()
        self.answers: list[Key] = []
        self.last_rv = 0

    async def _call(self, method: str, url: str, body: Any, content_type: str) -> Any:
        timeout = aiohttp.ClientTimeout(total=30)
        async with self.session.request(
            method,
            url,
            data=json.dumps(body),
            headers={**self.headers, "Content-Type": content_type},
            ssl=self.ssl,
            timeout=timeout,
        ) as response:
            text = await response.text()
            if response.status >= 300:
                raise RuntimeError(f"{method} {url}: {response.status} {text[:200]}")
            return json.loads(text)

    async def write_one(self) -> None:
        name = self.rng.choice(self.names)
        labels = {"app": self.rng.choice("abc"), "tier": self.rng.choice("xy")}
        prev = self.objects.get(name)
        if prev is None:
            body = {
                "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
            obj = await self._call("POST", self.url, body, "application/json")
            kind = "ADDED"
        elif self.rng.random() < 0.2:
            # An unscheduled pod still goes through a MODIFIED (deletionTimestamp set) before
            # its DELETED; the answer carries the DELETED's RV only. That is why the record is
            # the admin watch, and the answers are checked against it.
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
            obj = await self._call("DELETE", f"{self.url}/{name}", body, "application/json")
            kind = "DELETED"
        else:
            patch = {"metadata": {"labels": labels}}
            obj = await self._call(
                "PATCH", f"{self.url}/{name}", patch, "application/merge-patch+json"
            )
            kind = "MODIFIED"
        rv = int(obj["metadata"]["resourceVersion"])
        if (
            kind == "MODIFIED"
            and prev is not None
            and rv == int(prev["metadata"]["resourceVersion"])
        ):
            return  # the same labels again: a no-op the apiserver does not record
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        self.last_rv = rv
        self.answers.append((kind, name, rv))

    async def run(self, rate: float, stop: asyncio.Event, stats: Stats) -> None:
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            await self.writable.wait()
            async with self.busy:
                try:
                    await self.write_one()
                except (aiohttp.ClientError, TimeoutError, RuntimeError) as error:
                    # Writes go straight to the apiserver and pause over its restarts: none
                    # should fail.
                    stats.violation(f"writer: {type(error).__name__}: {str(error)[:200]}")
                    await self.resync()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            else:
                next_at = time.monotonic()

    async def resync(self) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError):
            _, items = await self.list_pods()
            self.objects = {o["metadata"]["name"]: o for o in items}

    async def list_pods(self) -> tuple[int, list[dict[str, Any]]]:
        async with self.session.get(
            self.url, headers=self.headers, ssl=self.ssl, timeout=aiohttp.ClientTimeout(total=30)
        ) as response:
            if response.status != 200:
                raise RuntimeError(f"LIST pods: {response.status}")
            body = await response.json()
        return int(body["metadata"]["resourceVersion"]), list(body["items"])

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        self.writable.clear()
        async with self.busy:
            try:
                yield
            finally:
                self.writable.set()


@dataclass
class AdminWatch:
    """The record: a watch of pods straight at the apiserver (never through the relay).

    Every event goes into ``truth``. After an apiserver restart its resume may get 410; writes
    are paused until it is watching again (``live``), so a LIST then must equal the record's
    state, which is checked. The writer's answers are checked against the record at the end.
    """

    writer: Writer
    truth: Truth
    stats: Stats
    live: asyncio.Event = field(default_factory=asyncio.Event)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    rv: int = 0
    events: int = 0
    lists: int = 0
    reconnects: int = 0
    pending: list[tuple[int, Callable[[], None]]] = field(default_factory=list)

    def defer(self, upto: int, check: Callable[[], None]) -> None:
        """Run ``check`` once the record holds every change up to ``upto``.

        The record is a second watch: watchproxy may hand a client an event before the admin
        watch has it, and a check against the record then would miss it.
        """
        if upto <= self.rv:
            check()
        else:
            self.pending.append((upto, check))

    def _run_due(self, everything: bool = False) -> None:
        due = [c for upto, c in self.pending if everything or upto <= self.rv]
        self.pending = [(u, c) for u, c in self.pending if not (everything or u <= self.rv)]
        for check in due:
            check()

    async def run(self, start_rv: int, items: list[dict[str, Any]], stop: asyncio.Event) -> None:
        self.rv = start_rv
        self.state = {o["metadata"]["name"]: o for o in items}
        writer = self.writer
        while not stop.is_set():
            query = (
                f"?watch=true&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion={self.rv}"
            )
            expired = False
            try:
                async with writer.session.get(
                    writer.url + query,
                    headers=writer.headers,
                    ssl=writer.ssl,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                ) as response:
                    if response.status == 410:
                        expired = True
                    elif response.status != 200:
                        await response.read()
                        raise aiohttp.ClientError(f"admin watch: {response.status}")
                    else:
                        self.live.set()
                        async for raw in response.content:
                            if not raw.strip():
                                continue
                            event = json.loads(raw)
                            if event["type"] == "ERROR":
                                expired = event["object"].get("code") == 410
                                break
                            self._take(event["type"], event["object"])
            except (aiohttp.ClientError, TimeoutError):
                self.reconnects += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                continue
            if expired:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError):
                    await self._relist()

    def _take(self, kind: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        if kind != "BOOKMARK":
            name = obj["metadata"]["name"]
            prev = self.state.get(name)
            if kind == "DELETED":
                self.state.pop(name, None)
            else:
                self.state[name] = obj
            self.events += 1
            self.truth.record(Change(kind, rv, obj, prev))
        self.rv = max(self.rv, rv)
        if self.pending:
            self._run_due()

    async def _relist(self) -> None:
        rv, items = await self.writer.list_pods()
        self.lists += 1
        listed = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}
        known = {n: o["metadata"]["resourceVersion"] for n, o in self.state.items()}
        if listed != known:
            self.stats.violation(
                f"admin LIST at {rv} differs from the record ({len(listed)} vs {len(known)} pods)"
            )
        self.state = {o["metadata"]["name"]: o for o in items}
        self.rv = rv
        self._run_due()

    def check_answers(self) -> None:
        """Every write the apiserver answered is in the record, once, at the answer's RV.

        Call once the record has caught up with the last write: the checks still deferred run
        too (nothing was written after it).
        """
        self._run_due(everything=True)
        recorded = [(c.type, c.obj["metadata"]["name"], c.rv) for c in self.truth.changes]
        seen = set(recorded)
        if len(seen) != len(recorded):
            self.stats.violation("the admin watch saw an event twice")
        missing = [a for a in self.writer.answers if a[2] <= self.rv and a not in seen]
        if missing:
            self.stats.violation(
                f"{len(missing)} answered writes not in the admin watch: {missing[:3]}"
            )


class RealClient(Client):
    """``bench.soak``'s client, whose exact checks wait for the record to hold their range."""

    oracle: AdminWatch

    def _check_exact(self, after: int, upto: int, live: list[Key]) -> None:
        self.oracle.defer(upto, lambda: Client._check_exact(self, after, upto, live))


# --- faults ------------------------------------------------------------------------------------


async def compact_etcd(api: Apiserver, session: aiohttp.ClientSession, revision: int) -> None:
    """Compact etcd (its JSON gateway on the client port) to ``revision``."""
    url = f"http://127.0.0.1:{api.current.etcd_port}/v3/kv/compaction"
    body = {"revision": str(revision), "physical": True}
    async with session.post(url, json=body) as response:
        text = await response.text()
        if response.status != 200 and "compacted" not in text:
            raise RuntimeError(f"etcd compaction: {response.status} {text[:200]}")


async def restart(api: Apiserver, oracle: AdminWatch) -> None:
    """Restart the apiserver (writes paused by the caller); return once the record is live."""
    oracle.live.clear()
    await api.restart()
    await asyncio.wait_for(oracle.live.wait(), 60)


async def inject_faults(
    api: Apiserver,
    relay: FaultProxy,
    writer: Writer,
    oracle: AdminWatch,
    truth: Truth,
    session: aiohttp.ClientSession,
    rng: random.Random,
    every: float,
    stop: asyncio.Event,
    log: list[str],
    stats: Stats,
) -> None:
    queue: list[str] = []
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0.5 * every, 1.5 * every))
        if stop.is_set():
            return
        if not queue:
            queue = list(KINDS)
            rng.shuffle(queue)
        kind = queue.pop()
        log.append(kind)
        print(f"[{time.strftime('%H:%M:%S')}] fault: {kind}", flush=True)
        try:
            await fault(kind, api, relay, writer, oracle, truth, session, rng, stop)
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as error:
            stats.violation(f"fault {kind} could not be made: {type(error).__name__}: {error}")


async def fault(
    kind: str,
    api: Apiserver,
    relay: FaultProxy,
    writer: Writer,
    oracle: AdminWatch,
    truth: Truth,
    session: aiohttp.ClientSession,
    rng: random.Random,
    stop: asyncio.Event,
) -> None:
    """Make one fault of ``kind``; one with a duration is undone after it (or at ``stop``)."""

    async def hold(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    if kind == "reset":
        relay.reset_all()
    elif kind == "halfopen":
        relay.freeze()
    elif kind == "truncate":
        relay.truncate_next(1)
    elif kind == "cutrecord":
        relay.reset_mid_record(1)
    elif kind in ("refuse", "blackhole"):
        try:
            if kind == "refuse":
                relay.mode = "reset"
                relay.reset_all()
                await hold(rng.uniform(2, 5))
            else:
                relay.mode = "blackhole"
                relay.freeze()
                await hold(rng.uniform(5, 20))
        finally:
            relay.mode = "pass"
    elif kind in ("restart", "compact"):
        # A relist's difference may rewrite this stretch: order and final-state checks only.
        truth.suspect.append((writer.last_rv, sys.maxsize))
        try:
            if kind == "restart":
                async with writer.paused():
                    await restart(api, oracle)
            else:
                relay.mode = "reset"
                relay.reset_all()
                await hold(rng.uniform(3, 6))  # the writer goes on meanwhile
                async with writer.paused():
                    revision, _ = await writer.list_pods()
                    await compact_etcd(api, session, revision)
                    if rng.random() < 0.5:
                        await restart(api, oracle)
        finally:
            relay.mode = "pass"
            await hold(10)  # watchproxy resumes (or relists) within this
            truth.suspect[-1] = (truth.suspect[-1][0], writer.last_rv)


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Figures:
    rss: float
    fds: int
    tasks: float


async def figures(pid: int, session: aiohttp.ClientSession, admin: str) -> Figures:
    rss, fds = proc_figures(pid)
    tasks = await metric(session, admin, "soak_asyncio_tasks")
    return Figures(rss, fds, tasks)


async def wait_metric_zero(session: aiohttp.ClientSession, admin: str, names: list[str]) -> None:
    """Poll (bounded) until every named gauge reads 0: the shared watches have ended."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        values = [await metric(session, admin, name) for name in names]
        if not any(values):
            return
        await asyncio.sleep(0.5)


async def soak_real(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    truth = Truth()
    stats = Stats()
    faults_log: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="soak-real-"))
    api = Apiserver(tmp / "kubetestenv")
    server = await api.start()
    relay = FaultProxy("127.0.0.1", server.port)
    await relay.start()
    kubeconfig = server.write_kubeconfig(
        tmp / "upstream.kubeconfig", token=server.token, server=f"https://127.0.0.1:{relay.port}"
    )
    api_port, admin_port = free_port(), free_port()
    settings = {
        "hub.linger_seconds": "2",
        "hub.bookmark_interval_seconds": "5",
        "hub.client_watch_min_seconds": "10",
        "hub.client_watch_max_seconds": "60",
        "backoff.initial_seconds": "0.2",
        "backoff.max_seconds": "3",
        "upstream.watch_read_timeout_seconds": "15",
        "limits.max_watches": str(max(1000, args.clients * 3)),
    }
    command = [
        sys.executable, "-c", LAUNCHER, "run", "--kubeconfig", kubeconfig,
        "--listen-port", str(api_port), "--admin-host", "127.0.0.1",
        "--admin-port", str(admin_port), "--log-level", "warning",
    ]  # fmt: skip
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    log_path = tmp / "watchproxy.log"
    with open(log_path, "wb") as proxy_log:
        process = await asyncio.create_subprocess_exec(*command, stdout=proxy_log, stderr=proxy_log)
    base = f"http://127.0.0.1:{api_port}"
    admin = f"http://127.0.0.1:{admin_port}"
    started = time.monotonic()
    stop = asyncio.Event()
    stop_load = asyncio.Event()
    stop_admin = asyncio.Event()
    before = after = warm = Figures(0, 0, 0)
    writer: Writer | None = None
    oracle: AdminWatch | None = None
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await wait_ready(session, admin, process)
            before = await figures(process.pid, session, admin)
            writer = Writer(api, session, rng)
            start_rv, items = await writer.list_pods()
            oracle = AdminWatch(writer, truth, stats)
            admin_task = asyncio.create_task(oracle.run(start_rv, items, stop_admin))
            await asyncio.wait_for(oracle.live.wait(), 30)
            tasks = [
                asyncio.create_task(writer.run(args.rate, stop_load, stats)),
                asyncio.create_task(
                    inject_faults(
                        api,
                        relay,
                        writer,
                        oracle,
                        truth,
                        session,
                        rng,
                        args.fault_interval,
                        stop_load,
                        faults_log,
                        stats,
                    )
                ),
            ]
            clients: set[asyncio.Task[None]] = set()
            all_clients: list[Client] = []

            def spawn() -> None:
                stats.clients_started += 1
                lifetime = rng.uniform(args.duration / 10, args.duration / 2.5)
                client = RealClient(stats.clients_started, base, truth, stats, rng, lifetime)
                client.oracle = oracle
                all_clients.append(client)
                task = asyncio.create_task(client.run(session, stop))
                client.task = task
                clients.add(task)
                task.add_done_callback(clients.discard)

            for _ in range(args.clients):
                spawn()
                await asyncio.sleep(0.01)
            deadline = started + args.duration
            next_report = started + args.report_interval
            while time.monotonic() < deadline:
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                while len(clients) < args.clients:
                    spawn()
                if process.returncode is not None:
                    stats.violation(f"watchproxy exited with {process.returncode}")
                    break
                if time.monotonic() >= next_report:
                    now = await figures(process.pid, session, admin)
                    if warm.rss == 0:
                        warm = now
                    await report_line("running", now, stats, relay, started)
                    next_report += args.report_interval
            stop_load.set()
            await asyncio.gather(*tasks)
            relay.mode = "pass"
            if warm.rss == 0:
                warm = await figures(process.pid, session, admin)
            _, objects = await writer.list_pods()
            await quiesce(objects, truth, stats, all_clients, clients, within=60)
            stop.set()
            for task in list(clients):
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            await final_check(session, base, objects, truth, stats, rng)
            # The admin watch has seen everything once its RV reaches the last write's.
            catch_up = time.monotonic() + 30
            while oracle.rv < writer.last_rv and time.monotonic() < catch_up:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            stop_admin.set()
            admin_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await admin_task
            oracle.check_answers()
            await wait_metric_zero(
                session, admin, ["watchproxy_shared_watches", "watchproxy_watch_subscribers"]
            )
            # Connections and their tasks end on their own timeouts (a frozen one on the read
            # timeout): bounded wait for the figures to settle, and say how long it took.
            settle_from = time.monotonic()
            after = await figures(process.pid, session, admin)
            while time.monotonic() < settle_from + args.settle and (
                after.fds > before.fds + args.fd_slack
                or after.tasks > before.tasks + args.task_slack
            ):
                await asyncio.sleep(1)
                after = await figures(process.pid, session, admin)
            print(
                f"figures settled {time.monotonic() - settle_from:.1f}s after the last watch ended"
            )
            await report_line("end", after, stats, relay, started)
            if (
                after.fds > before.fds + args.fd_slack
                or after.tasks > before.tasks + args.task_slack
            ):
                async with session.get(admin + "/metrics") as response:
                    text = await response.text()
                print("\n".join(line for line in text.splitlines() if line.startswith("soak_")))
    finally:
        stop.set()
        stop_load.set()
        if process.returncode is None:
            process.terminate()
            try:
                code = await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                code = await process.wait()
            if code != 0:
                stats.violation(f"watchproxy exited with {code} after SIGTERM")
        await relay.stop()
        await api.stop()
    tracebacks = log_path.read_text(encoding="utf-8", errors="replace").count("Traceback")
    leaks = []
    if after.fds > before.fds + args.fd_slack:
        leaks.append(f"fds {before.fds} -> {after.fds}")
    if after.tasks > before.tasks + args.task_slack:
        leaks.append(f"tasks {before.tasks:.0f} -> {after.tasks:.0f}")
    if after.rss > warm.rss + args.rss_slack_mib:
        leaks.append(f"RSS {warm.rss:.1f} -> {after.rss:.1f} MiB")
    for leak in leaks:
        stats.violation(f"leak: {leak}")
    kinds = ", ".join(f"{k}={faults_log.count(k)}" for k in KINDS)
    print(
        f"events checked {stats.events} in {stats.sessions} sessions "
        f"(exact {stats.exact_sessions}); writes answered {len(writer.answers) if writer else 0}, "
        f"events in the admin watch's record {oracle.events if oracle else 0} "
        f"(its LISTs after a 410: {oracle.lists if oracle else 0}); "
        f"apiserver restarts {api.restarts}\n"
        f"faults injected: {len(faults_log)} ({kinds}); relay connections by mode "
        f"{relay.counts.by_mode}; clients started {stats.clients_started}; 410s {stats.expired}; "
        f"relists by clients {stats.relists}; retries {stats.retries}\n"
        f"watchproxy before -> after: fds {before.fds} -> {after.fds} (slack {args.fd_slack}), "
        f"asyncio tasks {before.tasks:.0f} -> {after.tasks:.0f} (slack {args.task_slack}), "
        f"RSS {before.rss:.1f} start, {warm.rss:.1f} warm -> {after.rss:.1f} MiB "
        f"(slack {args.rss_slack_mib:.0f}); tracebacks in proxy log {tracebacks} ({log_path})"
    )
    if stats.violations:
        print(f"FAIL: {len(stats.violations)} violations")
        return 1
    print("OK: no lost, duplicated or reordered event; every final state matched the apiserver")
    return 0


async def report_line(
    what: str, now: Figures, stats: Stats, relay: FaultProxy, started: float
) -> None:
    print(
        f"[{time.monotonic() - started:7.1f}s] {what}: proxy RSS {now.rss:.1f} MiB, "
        f"{now.fds} fds, {now.tasks:.0f} tasks; relay links {relay.open_links}; "
        f"sessions {stats.sessions} (exact {stats.exact_sessions}), events {stats.events}, "
        f"410s {stats.expired}, retries {stats.retries}, violations {len(stats.violations)}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak_real", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=1200, help="seconds (default 1200)")
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients")
    parser.add_argument("--fault-interval", type=float, default=20, help="mean seconds apart")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=20, help="pod writes per second")
    parser.add_argument("--report-interval", type=float, default=60, help="seconds")
    parser.add_argument("--fd-slack", type=int, default=8, help="fds allowed above the start")
    parser.add_argument("--task-slack", type=int, default=4, help="tasks allowed above the start")
    parser.add_argument(
        "--settle",
        type=float,
        default=60,
        help="seconds allowed for fds/tasks to settle at the end",
    )
    parser.add_argument(
        "--rss-slack-mib", type=float, default=64, help="RSS growth allowed after warm-up"
    )
    args = parser.parse_args(argv)
    return asyncio.run(soak_real(args))


if __name__ == "__main__":
    sys.exit(main())
