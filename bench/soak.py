"""Soak: many clients join and leave watches through a watchproxy subprocess while the upstream
churns and fails; every client's stream is checked against the store's own change log.

    .venv/bin/python -m bench.soak --duration 600 --clients 100 [--fault-interval 20] [--seed N]

The fake apiserver runs in this process; watchproxy runs as a subprocess, so its memory (RSS)
and open file descriptors are read from /proc/<pid> at start, every ``--report-interval``
seconds and at the end. Checks, per client watch session:

* order: resourceVersions strictly increase after the initial synthetic ADDEDs (relist DELETEs
  may share one RV);
* exact: a session with a known start point (a resume, or sendInitialEvents' end bookmark) saw
  exactly the store's changes for its selector up to the last RV it was given (events or
  bookmarks): nothing lost, repeated or reordered. Sessions whose range touches a forced relist
  (compaction) are checked for order and state only, since a relist sends a diff;
* clean end: every stream ends with a clean chunked EOF, never a broken connection;
* state: at the end, with the churn stopped, every client's objects equal the store's.

Exit status 1 on any violation (the first few are printed), 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import random
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kubefake import Change, FakeApiServer
from watchproxy.kube.selectors import LabelSelector, parse_label_selector

PODS = "/api/v1/namespaces/default/pods"
SELECTORS = ["", "app=a", "app!=b", "tier=x", "app in (a,c)", "app=b,tier=y"]
NO_UVLOOP = (
    "import sys; import watchproxy.cli as cli; cli._install_loop = lambda: None; "
    "sys.exit(cli.main())"
)
Key = tuple[str, str, int]  # (type, name, resourceVersion)


# --- the truth: the store's change log ---------------------------------------------------------


class Truth:
    """Every change of pods in "default", and what each selector's watch must see of it."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.rvs: list[int] = []
        self.suspect: list[tuple[int, int]] = []  # RV ranges a forced relist may rewrite
        self._selectors: dict[str, LabelSelector] = {s: parse_label_selector(s) for s in SELECTORS}

    def record(self, change: Change) -> None:
        if (change.obj.get("metadata") or {}).get("namespace") != "default":
            return
        self.changes.append(change)
        self.rvs.append(change.rv)

    def matches(self, selector: str, obj: dict[str, Any] | None) -> bool:
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        return obj is not None and self._selectors[selector].matches(labels)

    def expected(self, selector: str, after: int, upto: int) -> list[Key]:
        """The events a watch with ``selector`` gets for changes in (after, upto]."""
        out: list[Key] = []
        start = bisect.bisect_right(self.rvs, after)
        end = bisect.bisect_right(self.rvs, upto)
        for change in self.changes[start:end]:
            now = change.type != "DELETED" and self.matches(selector, change.obj)
            before = change.prev is not None and self.matches(selector, change.prev)
            name = change.obj["metadata"]["name"]
            if change.type == "ADDED" and now:
                out.append(("ADDED", name, change.rv))
            elif change.type == "DELETED" and before:
                out.append(("DELETED", name, change.rv))
            elif change.type == "MODIFIED":
                if now and before:
                    out.append(("MODIFIED", name, change.rv))
                elif now:
                    out.append(("ADDED", name, change.rv))
                elif before:
                    out.append(("DELETED", name, change.rv))
        return out

    def touches_relist(self, after: int, upto: int) -> bool:
        return any(lo <= upto and after <= hi for lo, hi in self.suspect)


# --- clients -----------------------------------------------------------------------------------


@dataclass
class Stats:
    sessions: int = 0
    exact_sessions: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0
    relists: int = 0
    retries: int = 0
    clients_started: int = 0
    violations: list[str] = field(default_factory=list)

    def violation(self, text: str) -> None:
        self.violations.append(text)
        if len(self.violations) <= 10:
            print(f"VIOLATION: {text}", flush=True)


class Client:
    """One watching program: re-watches after each clean end, resuming or starting over."""

    def __init__(
        self, n: int, base: str, truth: Truth, stats: Stats, rng: random.Random, lifetime: float
    ) -> None:
        self.n = n
        self.base = base
        self.truth = truth
        self.stats = stats
        self.rng = rng
        self.selector = rng.choice(SELECTORS)
        self.bookmarks = rng.random() < 0.5
        self.resumes = rng.random() < 0.7
        self.leave_at = time.monotonic() + lifetime
        self.state: dict[str, int] = {}  # name -> resourceVersion
        self.rv: int | None = None  # where a resume starts (None: start over)
        self.task: asyncio.Task[None] | None = None

    def _query(self) -> tuple[str, bool]:
        params = ["watch=true"]
        if self.selector:
            params.append("labelSelector=" + self.selector.replace("=", "%3D").replace(" ", "%20"))
        sie = False
        if self.bookmarks:
            params.append("allowWatchBookmarks=true")
            if self.rv is None and self.rng.random() < 0.5:
                params += ["sendInitialEvents=true", "resourceVersionMatch=NotOlderThan"]
                sie = True
        if self.rv is not None:
            params.append(f"resourceVersion={self.rv}")
        if self.rng.random() < 0.6:
            params.append(f"timeoutSeconds={self.rng.randint(3, 40)}")
        return "?" + "&".join(params), sie

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set() and time.monotonic() < self.leave_at:
            try:
                await self._session(session, stop)
            except (aiohttp.ClientError, TimeoutError) as error:
                self.stats.violation(f"client {self.n}: stream broke: {type(error).__name__}")
                self.rv = None
            if not self.resumes:
                self.rv = None

    async def _session(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        query, sie = self._query()
        start = self.rv
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with session.get(self.base + PODS + query, timeout=timeout) as response:
            if response.status in (429, 503, 504):
                self.stats.retries += 1
                await response.read()
                await asyncio.sleep(self.rng.uniform(0.5, 1.5))
                return
            if response.status != 200:
                self.stats.violation(f"client {self.n}: {response.status} {await response.text()}")
                await asyncio.sleep(1)
                return
            self.stats.sessions += 1
            if start is None:
                self.state = {}
            live: list[Key] = []
            initial = start is None  # synthetic ADDEDs come first
            initial_names: set[str] = set()
            last = start or 0  # highest RV given (events and bookmarks)
            exact_from = start
            top = 0  # highest event RV (order check)
            deleted_at_top: set[str] = set()
            async for raw in response.content:
                if not raw.strip():
                    continue
                event = json.loads(raw)
                kind = event["type"]
                obj = event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        self.stats.expired += 1
                        await self._relist(session)
                        return
                    self.stats.violation(f"client {self.n}: ERROR event {obj}")
                    return
                meta = obj["metadata"]
                rv = int(meta["resourceVersion"])
                if kind == "BOOKMARK":
                    self.stats.bookmarks += 1
                    if (meta.get("annotations") or {}).get("k8s.io/initial-events-end"):
                        initial = False
                        exact_from = rv
                    elif initial:
                        initial = False  # a plain bookmark ends the initial ADDEDs too
                    if rv < last and exact_from is not None:
                        self.stats.violation(f"client {self.n}: bookmark {rv} after {last}")
                    last = max(last, rv)
                    self.rv = last
                    continue
                self.stats.events += 1
                name = meta["name"]
                if initial and kind == "ADDED" and name not in initial_names and not sie:
                    # still the initial state: any order, each object once
                    initial_names.add(name)
                    top = max(top, rv)
                elif initial and sie and kind == "ADDED" and name not in initial_names:
                    initial_names.add(name)
                else:
                    initial = False
                    # A relist's DELETEs carry the list's RV, which may equal the RV of the
                    # newest object it modified and of its other DELETEs; the same object
                    # deleted twice at one RV would still be a repeat.
                    same_rv_delete = rv == top and kind == "DELETED" and name not in deleted_at_top
                    if rv > top:
                        deleted_at_top = set()
                    if kind == "DELETED":
                        deleted_at_top.add(name)
                    if rv <= top and not same_rv_delete:
                        self.stats.violation(
                            f"client {self.n} {self.selector!r}: {kind} {name} rv {rv} after {top}"
                        )
                    top = max(top, rv)
                    if exact_from is not None:
                        live.append((kind, name, rv))
                if kind == "DELETED":
                    self.state.pop(name, None)
                else:
                    self.state[name] = rv
                last = max(last, rv)
                self.rv = last
                if stop.is_set():
                    break
            else:
                self.rv = last if last else self.rv
        if exact_from is not None and not stop.is_set() and last > exact_from:
            self._check_exact(exact_from, last, live)

    def _check_exact(self, after: int, upto: int, live: list[Key]) -> None:
        if self.truth.touches_relist(after, upto):
            return
        self.stats.exact_sessions += 1
        expected = self.truth.expected(self.selector, after, upto)
        if live != expected:
            missing = [e for e in expected if e not in live][:3]
            extra = [e for e in live if e not in expected][:3]
            self.stats.violation(
                f"client {self.n} {self.selector!r} ({after}, {upto}]: {len(live)} events, "
                f"expected {len(expected)}; missing {missing} extra {extra}"
            )

    async def _relist(self, session: aiohttp.ClientSession) -> None:
        """After an in-stream 410: LIST (through the proxy, as client-go does) and resume."""
        self.stats.relists += 1
        query = "?labelSelector=" + self.selector.replace("=", "%3D").replace(" ", "%20")
        for _ in range(20):
            async with session.get(self.base + PODS + query) as response:
                if response.status == 200:
                    body = await response.json()
                    self.state = {
                        i["metadata"]["name"]: int(i["metadata"]["resourceVersion"])
                        for i in body["items"]
                    }
                    self.rv = int(body["metadata"]["resourceVersion"])
                    return
                await response.read()
            self.stats.retries += 1
            await asyncio.sleep(0.5)
        self.rv = None


# --- load and faults ---------------------------------------------------------------------------


async def churn(fake: FakeApiServer, rng: random.Random, rate: float, stop: asyncio.Event) -> None:
    store = fake.store
    names = [f"pod-{i}" for i in range(150)]
    interval = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        name = rng.choice(names)
        labels = {"app": rng.choice("abc"), "tier": rng.choice("xy")}
        try:
            existing = store.get("pods", "default", name)
        except Exception:
            existing = None
        if existing is None:
            store.create(
                "pods",
                "default",
                {
                    "metadata": {"name": name, "labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            )
        elif rng.random() < 0.2:
            store.delete("pods", "default", name)
        else:
            store.patch_labels("pods", "default", name, labels)
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        else:
            next_at = time.monotonic()
            await asyncio.sleep(0)


async def inject_faults(
    fake: FakeApiServer,
    truth: Truth,
    rng: random.Random,
    every: float,
    stop: asyncio.Event,
    log: list[str],
) -> None:
    faults = fake.faults
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0.5 * every, 1.5 * every))
        if stop.is_set():
            return
        kind = rng.choice(["cut", "refuse", "reset", "503", "throttle", "relist", "garbage", "5xx"])
        log.append(kind)
        print(f"[{time.strftime('%H:%M:%S')}] fault: {kind}", flush=True)
        if kind == "cut":
            faults.cut_watches()
        elif kind in ("refuse", "reset", "503"):
            await faults.outage(kind)
            await asyncio.sleep(rng.uniform(2, 5))
            await faults.recover()
        elif kind == "throttle":
            faults.throttle(1.0)
            await asyncio.sleep(rng.uniform(1, 3))
            faults.throttle(None)
        elif kind == "relist":
            # The relist's diff rewrites history (DELETEs carry the list's RV): sessions that
            # overlap it get the order and state checks only. Open-ended until it has settled.
            before = fake.store.resource_version
            truth.suspect.append((before - 200, sys.maxsize))
            fake.store.compact()
            faults.cut_watches()
            await asyncio.sleep(5)
            truth.suspect[-1] = (before - 200, fake.store.resource_version)
        elif kind == "garbage":
            faults.garbage_next_watch_line(1)
        elif kind == "5xx":
            faults.fail_next(3, 503)


# --- the proxy subprocess ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def proc_figures(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of a process, from /proc."""
    rss_kib = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


async def metric(session: aiohttp.ClientSession, admin: str, name: str) -> float:
    async with session.get(admin + "/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def report(
    what: str, pid: int, stats: Stats, session: aiohttp.ClientSession, admin: str, started: float
) -> None:
    rss, fds = proc_figures(pid)
    try:
        shared = await metric(session, admin, "watchproxy_shared_watches")
        subs = await metric(session, admin, "watchproxy_watch_subscribers")
        history = await metric(session, admin, "watchproxy_watch_history_events")
    except aiohttp.ClientError:
        shared = subs = history = float("nan")
    print(
        f"[{time.monotonic() - started:7.1f}s] {what}: proxy RSS {rss:.1f} MiB, {fds} fds, "
        f"{shared:.0f} shared watches, {subs:.0f} subscribers, {history:.0f} history events; "
        f"sessions {stats.sessions} "
        f"(exact {stats.exact_sessions}), events {stats.events}, 410s {stats.expired}, "
        f"retries {stats.retries}, violations {len(stats.violations)}",
        flush=True,
    )


async def soak(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    truth = Truth()
    stats = Stats()
    faults_log: list[str] = []
    async with FakeApiServer(history_size=1_000_000, bookmark_interval=1.0) as fake:
        fake.store.subscribe("pods", truth.record)
        tmp = tempfile.mkdtemp(prefix="soak-")
        kubeconfig = fake.write_kubeconfig(os.path.join(tmp, "upstream.kubeconfig"))
        api_port, admin_port = free_port(), free_port()
        launcher = ["-c", NO_UVLOOP] if args.no_uvloop else ["-m", "watchproxy"]
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
            sys.executable, *launcher, "run", "--kubeconfig", kubeconfig,
            "--listen-port", str(api_port), "--admin-host", "127.0.0.1",
            "--admin-port", str(admin_port), "--log-level", "warning",
        ]  # fmt: skip
        for key, value in settings.items():
            command += ["--set", f"{key}={value}"]
        log_path = os.path.join(tmp, "watchproxy.log")
        with open(log_path, "wb") as proxy_log:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=proxy_log, stderr=proxy_log
            )
        base = f"http://127.0.0.1:{api_port}"
        admin = f"http://127.0.0.1:{admin_port}"
        started = time.monotonic()
        stop = asyncio.Event()  # clients
        stop_load = asyncio.Event()  # churn and faults
        connector = aiohttp.TCPConnector(limit=0)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                await wait_ready(session, admin, process)
                await report("start", process.pid, stats, session, admin, started)
                tasks = [
                    asyncio.create_task(churn(fake, rng, args.rate, stop_load)),
                    asyncio.create_task(
                        inject_faults(fake, truth, rng, args.fault_interval, stop_load, faults_log)
                    ),
                ]
                clients: set[asyncio.Task[None]] = set()
                all_clients: list[Client] = []

                def spawn() -> None:
                    stats.clients_started += 1
                    lifetime = rng.uniform(20, 240)
                    client = Client(stats.clients_started, base, truth, stats, rng, lifetime)
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
                        spawn()  # clients that left are replaced by new ones
                    if process.returncode is not None:
                        stats.violation(f"watchproxy exited with {process.returncode}")
                        break
                    if time.monotonic() >= next_report:
                        await report("running", process.pid, stats, session, admin, started)
                        next_report += args.report_interval
                # Quiesce: stop the churn and faults; every client still watching must then
                # reach exactly the store's objects for its selector.
                stop_load.set()
                await asyncio.gather(*tasks)
                await fake.faults.recover()
                fake.faults.throttle(None)
                await quiesce(
                    fake.store.list("pods", "default"), truth, stats, all_clients, clients
                )
                stop.set()
                for task in list(clients):
                    task.cancel()
                await asyncio.gather(*clients, return_exceptions=True)
                objects = fake.store.list("pods", "default")
                await final_check(session, base, objects, truth, stats, rng)
                await report("end", process.pid, stats, session, admin, started)
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
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            tracebacks = handle.read().count("Traceback")
    print(
        f"faults injected: {len(faults_log)} "
        f"({', '.join(f'{k}={faults_log.count(k)}' for k in sorted(set(faults_log)))}); "
        f"clients started {stats.clients_started}; relists by clients {stats.relists}; "
        f"bookmarks {stats.bookmarks}; tracebacks in proxy log {tracebacks} ({log_path})"
    )
    if stats.violations:
        print(f"FAIL: {len(stats.violations)} violations")
        return 1
    print("OK: no lost, duplicated or reordered event; every final state matched the store")
    return 0


async def quiesce(
    objects: list[dict[str, Any]],
    truth: Truth,
    stats: Stats,
    all_clients: list[Client],
    running: set[asyncio.Task[None]],
    within: float = 30.0,
) -> None:
    """Every running client must reach ``objects`` (the store's pods, churn stopped)."""
    wanted = {
        selector: {
            o["metadata"]["name"]: int(o["metadata"]["resourceVersion"])
            for o in objects
            if truth.matches(selector, o)
        }
        for selector in SELECTORS
    }

    def behind() -> list[Client]:
        return [c for c in all_clients if c.task in running and c.state != wanted[c.selector]]

    deadline = time.monotonic() + within
    # A cheap in-process predicate polled with a deadline: no event to await for "caught up".
    while behind() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    for client in behind():
        missing = len(set(wanted[client.selector].items()) - set(client.state.items()))
        extra = len(set(client.state.items()) - set(wanted[client.selector].items()))
        stats.violation(
            f"client {client.n} {client.selector!r}: final state differs from the store "
            f"({missing} missing or stale, {extra} extra; at rv {client.rv})"
        )
    checked = sum(1 for c in all_clients if c.task in running)
    print(f"final state checked for {checked} running clients", flush=True)


async def final_check(
    session: aiohttp.ClientSession,
    base: str,
    objects: list[dict[str, Any]],
    truth: Truth,
    stats: Stats,
    rng: random.Random,
) -> None:
    """Fresh watches of every selector (all at once) reach ``objects`` (the store's pods)."""

    async def one(selector: str) -> None:
        wanted = {
            o["metadata"]["name"]: int(o["metadata"]["resourceVersion"])
            for o in objects
            if truth.matches(selector, o)
        }
        query = "?watch=true&timeoutSeconds=2"
        if selector:
            query += "&labelSelector=" + selector.replace("=", "%3D").replace(" ", "%20")
        body = b""
        status = 0
        for _ in range(20):  # right after an outage the proxy may still answer 503 for a while
            async with session.get(base + PODS + query) as response:
                body = await response.read()
                status = response.status
            if status == 200:
                break
            await asyncio.sleep(1)
        else:
            stats.violation(f"final watch of {selector!r}: {status} {body[:200]!r}")
            return
        state: dict[str, int] = {}
        for line in body.splitlines():
            event = json.loads(line)
            meta = event["object"]["metadata"]
            if event["type"] == "DELETED":
                state.pop(meta["name"], None)
            elif event["type"] != "BOOKMARK":
                state[meta["name"]] = int(meta["resourceVersion"])
        if state != wanted:
            stats.violation(f"final state of {selector!r}: {len(state)} != {len(wanted)} objects")

    await asyncio.gather(*(one(selector) for selector in SELECTORS))


async def wait_ready(
    session: aiohttp.ClientSession, admin: str, process: asyncio.subprocess.Process
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise SystemExit(f"watchproxy exited at start with {process.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(admin + "/readyz") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise SystemExit("watchproxy did not become ready")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=600, help="seconds (default 600)")
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients")
    parser.add_argument(
        "--fault-interval", type=float, default=20, help="mean seconds between faults"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=20, help="store writes per second")
    parser.add_argument("--report-interval", type=float, default=60, help="seconds")
    parser.add_argument(
        "--no-uvloop",
        action="store_true",
        help="run the proxy on the default asyncio loop (default: `python -m watchproxy`, uvloop)",
    )
    args = parser.parse_args(argv)
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
