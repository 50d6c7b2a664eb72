"""Outage and recovery with real clients, checked against the fake apiserver's ground truth.

    .venv/bin/python -m tests.outage_scenario --outage 30 --runs 20     (scripts/faults.sh)

watchproxy talks to the fake apiserver through tests/faultproxy.py. About 50 clients watch pods
through watchproxy: informer-style (list, then watch from the list's resourceVersion, resume
from the last one, relist on 410), tight-loop re-watchers with no backoff, the official
``kubernetes`` client's ``watch.stream``, ``kubernetes_asyncio``'s, and a few ``kubectl get -w``.
Pods keep changing all along. Then the apiserver goes away (every connection reset, every new
one accepted and reset) while the changes go on, and comes back.

Every client's events are checked against every change the fake recorded: no foreign bytes
(each line is a whole event of the client's own selection), no event repeated, none lost,
resourceVersions in order, and its final state equal to the apiserver's. Measured: upstream
connection attempts during the outage, and how soon after recovery each client got its first
new event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kubefake import Change
from tests.faultproxy import Faulty, faulty_upstream

PODS = "/api/v1/namespaces/default/pods"
APPS = ("a", "b")


@dataclass
class Session:
    """One unbroken view of a client: from a fresh start (or a list) through every resume."""

    start_rv: int  # the store's resourceVersion when the session began
    events: list[tuple[str, str, int]] = field(default_factory=list)  # (type, name, rv)


class Recorder:
    """What one client saw, and every way it differs from what the apiserver did."""

    def __init__(self, name: str, app: str, store_rv: Any) -> None:
        self.name = name
        self.app = app
        self._store_rv = store_rv
        self.sessions: list[Session] = []
        self.state: dict[str, int] = {}
        self.problems: list[str] = []
        self.last_rv = 0
        self.recovered_at: float | None = None
        self.recovery_rv = 0
        self.first_after_recovery: float | None = None
        self.lock = threading.Lock()  # the official client records from a thread

    def fresh(self, items: list[dict[str, Any]] | None = None, rv: int | None = None) -> None:
        """A new session: from nothing (a watch without resourceVersion) or from a list."""
        with self.lock:
            self.sessions.append(Session(start_rv=rv if rv is not None else self._store_rv()))
            self.state = {}
            for item in items or []:
                if self._check(item):
                    meta = item["metadata"]
                    self.state[meta["name"]] = int(meta["resourceVersion"])
            if rv is not None:
                self.last_rv = rv

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            if kind == "BOOKMARK":
                rv = obj.get("metadata", {}).get("resourceVersion")
                if rv:
                    self.last_rv = max(self.last_rv, int(rv))
                return
            if kind == "ERROR":
                return
            if not self._check(obj):
                return
            if not self.sessions:
                self.problems.append("event before any session")
                return
            meta = obj["metadata"]
            name, rv = meta["name"], int(meta["resourceVersion"])
            self.sessions[-1].events.append((kind, name, rv))
            if kind == "DELETED":
                self.state.pop(name, None)
            else:
                self.state[name] = rv
            self.last_rv = max(self.last_rv, rv)
            if (
                self.recovered_at is not None
                and self.first_after_recovery is None
                and rv > self.recovery_rv
            ):
                self.first_after_recovery = time.monotonic() - self.recovered_at

    def garbage(self, what: str) -> None:
        with self.lock:
            self.problems.append(f"foreign or broken bytes: {what[:120]!r}")

    def _check(self, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if (
            obj.get("kind") not in (None, "Pod")
            or meta.get("namespace") != "default"
            or (meta.get("labels") or {}).get("app") != self.app
        ):
            self.problems.append(f"an object outside its selection: {json.dumps(obj)[:120]}")
            return False
        return True

    def verify(self, truth: list[Change], final: dict[str, int]) -> list[str]:
        problems = list(self.problems)
        mine = [c for c in truth if (c.obj["metadata"].get("labels") or {}).get("app") == self.app]
        for index, session in enumerate(self.sessions):
            seen: set[tuple[str, str, int]] = set()
            newest = 0
            snapshot = _leading_snapshot(session.events)
            for position, (kind, name, rv) in enumerate(session.events):
                if (kind, name, rv) in seen:
                    problems.append(f"session {index}: {kind} {name}@{rv} twice")
                seen.add((kind, name, rv))
                if rv > session.start_rv and position >= snapshot:
                    if rv <= newest:
                        problems.append(f"session {index}: {name}@{rv} after {newest}")
                    newest = max(newest, rv)
            last = max((rv for _, _, rv in session.events), default=0)
            got = {(name, rv) for _, name, rv in session.events}
            first: dict[str, tuple[str, int]] = {}
            for kind, name, rv in session.events:
                first.setdefault(name, (kind, rv))

            lost = [
                c
                for c in mine
                if session.start_rv < c.rv <= last
                and _key(c) not in got
                and not _in_snapshot(c, first)
            ]
            if lost:
                problems.append(
                    f"session {index}: lost {len(lost)} events, first "
                    f"{lost[0].type} {_key(lost[0])}"
                )
        if self.state != final:
            extra = sorted(set(self.state.items()) - set(final.items()))[:3]
            missing = sorted(set(final.items()) - set(self.state.items()))[:3]
            problems.append(f"final state differs: extra {extra}, missing {missing}")
        return [f"{self.name}: {p}" for p in problems]


def _leading_snapshot(events: list[tuple[str, str, int]]) -> int:
    """How many events open the session as a snapshot (ADDEDs of distinct objects, in the
    list's name order, not resourceVersion order): kubectl's list, a watch without RV."""
    names: set[str] = set()
    for position, (kind, name, _rv) in enumerate(events):
        if kind != "ADDED" or name in names:
            return position
        names.add(name)
    return len(events)


def _in_snapshot(change: Change, first: dict[str, tuple[str, int]]) -> bool:
    """A session without a known start (a watch with no resourceVersion, kubectl's own list)
    begins with a snapshot taken a little after its ``start_rv``: a change already folded into
    that snapshot has no event of its own. ``first`` is each object's first event there."""
    name = change.obj["metadata"]["name"]
    if name not in first:
        return change.type == "DELETED"
    kind, rv = first[name]
    return kind == "ADDED" and rv > change.rv


def _key(change: Change) -> tuple[str, int]:
    return change.obj["metadata"]["name"], change.rv


# ---- the clients -----------------------------------------------------------------------------


async def informer(
    session: aiohttp.ClientSession, base: str, rec: Recorder, stop: asyncio.Event
) -> None:
    """LIST, then WATCH from the list's resourceVersion; resume from the last; relist on 410."""
    selector = f"labelSelector=app%3D{rec.app}"
    delay = 0.1
    listed = False
    while not stop.is_set():
        try:
            if not listed:
                async with session.get(f"{base}{PODS}?{selector}") as response:
                    if response.status != 200:
                        await response.read()
                        raise aiohttp.ClientError(f"list {response.status}")
                    body = await response.json()
                rec.fresh(body["items"], int(body["metadata"]["resourceVersion"]))
                listed = True
            url = (
                f"{base}{PODS}?watch=1&{selector}&allowWatchBookmarks=true"
                f"&resourceVersion={rec.last_rv}&timeoutSeconds={random.randint(5, 15)}"
            )
            async with session.get(url) as response:
                if response.status == 410:
                    listed = False
                    continue
                if response.status != 200:
                    await response.read()
                    raise aiohttp.ClientError(f"watch {response.status}")
                async for line in response.content:
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        rec.garbage(line.decode(errors="replace"))
                        continue
                    if event.get("type") == "ERROR":
                        listed = event["object"].get("code") != 410
                        break
                    rec.event(event["type"], event["object"])
            delay = 0.1
        except (aiohttp.ClientError, OSError, TimeoutError):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def tight_loop(
    session: aiohttp.ClientSession, base: str, rec: Recorder, stop: asyncio.Event
) -> None:
    """Re-watches the moment a stream ends, from the last resourceVersion, with no backoff."""
    fresh = True
    count = 0
    while not stop.is_set() and count < 100_000:
        count += 1
        url = f"{base}{PODS}?watch=1&labelSelector=app%3D{rec.app}&timeoutSeconds=10"
        if fresh:
            rec.fresh()
        else:
            url += f"&resourceVersion={rec.last_rv}"
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    fresh = False
                    async for line in response.content:
                        if not line.strip():
                            continue
                        try:
                            event = json.loads(line)
                        except ValueError:
                            rec.garbage(line.decode(errors="replace"))
                            continue
                        if event.get("type") == "ERROR":
                            fresh = True
                            break
                        rec.event(event["type"], event["object"])
                else:
                    await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        await asyncio.sleep(0)


def official_client(kubeconfig: str, rec: Recorder, stop: threading.Event) -> None:
    """The official client's watch.stream in a loop, resuming from its last resourceVersion."""
    import kubernetes
    from kubernetes.client.exceptions import ApiException

    api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(kubeconfig))
    try:
        rv: str | None = None
        while not stop.is_set():
            if rv is None:
                rec.fresh()
            watcher = kubernetes.watch.Watch()
            try:
                for event in watcher.stream(
                    api.list_namespaced_pod,
                    "default",
                    label_selector=f"app={rec.app}",
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=3,
                    _request_timeout=10,
                ):
                    raw = event["raw_object"]
                    rec.event(event["type"], raw)
                    rv = (raw.get("metadata") or {}).get("resourceVersion") or rv
                    if stop.is_set():
                        break
            except ApiException as error:
                if error.status == 410:
                    rv = None
                else:
                    stop.wait(0.2)
            except Exception:  # urllib3's view of the outage: try again, as a script would
                stop.wait(0.2)
            finally:
                watcher.stop()
    finally:
        api.api_client.close()


async def asyncio_client(kubeconfig: str, rec: Recorder, stop: asyncio.Event) -> None:
    """kubernetes_asyncio's watch, resuming from its last resourceVersion."""
    from kubernetes_asyncio import client, config, watch
    from kubernetes_asyncio.client.exceptions import ApiException

    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        api = client.CoreV1Api(api_client)
        rv: str | None = None
        while not stop.is_set():
            if rv is None:
                rec.fresh()
            watcher = watch.Watch()
            try:
                async with watcher.stream(
                    api.list_namespaced_pod,
                    "default",
                    label_selector=f"app={rec.app}",
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=3,
                ) as stream:
                    async for event in stream:
                        raw = event["raw_object"]
                        rec.event(event["type"], raw)
                        rv = (raw.get("metadata") or {}).get("resourceVersion") or rv
                        if stop.is_set():
                            break
            except ApiException as error:
                rv = None if error.status == 410 else rv
                await asyncio.sleep(0.2)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                await asyncio.sleep(0.2)


async def kubectl_watch(kubeconfig: str, rec: Recorder, stop: asyncio.Event) -> None:
    """``kubectl get pods -w`` (it lists, then watches from the list); restarted if it exits."""
    decoder = json.JSONDecoder()
    while not stop.is_set():
        rec.fresh()
        process = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            kubeconfig,
            "get",
            "pods",
            "-l",
            f"app={rec.app}",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert process.stdout is not None
        buffer = ""
        try:
            while not stop.is_set():
                try:
                    async with asyncio.timeout(0.5):
                        chunk = await process.stdout.read(65536)
                except TimeoutError:
                    continue  # a quiet stream: look at the stop flag, read on
                if not chunk:
                    break
                buffer += chunk.decode()
                while True:
                    stripped = buffer.lstrip()
                    try:
                        event, end = decoder.raw_decode(stripped)
                    except ValueError:
                        break
                    buffer = stripped[end:]
                    rec.event(event["type"], event["object"])
        finally:
            if process.returncode is None:
                process.terminate()
            await process.wait()
        if buffer.strip() and not stop.is_set():
            rec.garbage(buffer)


# ---- the scenario ----------------------------------------------------------------------------


@dataclass
class Outcome:
    problems: list[str]
    attempts: int
    latencies: list[float]
    clients: int
    changes: int
    took: float

    def line(self, run: int) -> str:
        p50 = statistics.median(self.latencies) if self.latencies else float("nan")
        p90 = (
            statistics.quantiles(self.latencies, n=10)[-1]
            if len(self.latencies) > 1
            else float("nan")
        )
        verdict = "PASS" if not self.problems else f"FAIL ({len(self.problems)} problems)"
        return (
            f"run {run}: {verdict}; clients {self.clients}, changes {self.changes}, "
            f"upstream connection attempts during outage {self.attempts}, first event after "
            f"recovery p50 {p50:.2f}s p90 {p90:.2f}s, {self.took:.0f}s"
        )


async def churn(faulty: Faulty, stop: asyncio.Event, rate: float, rng: random.Random) -> None:
    store = faulty.fake.store
    serial = 0
    while not stop.is_set():
        names = [p["metadata"]["name"] for p in store.list("pods", "default")]
        roll = rng.random()
        if roll < 0.35 or len(names) < 6:
            serial += 1
            store.create(
                "pods",
                "default",
                {
                    "metadata": {"name": f"p-{serial}", "labels": {"app": rng.choice(APPS)}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            )
        elif roll < 0.8:

            def touch(obj: dict[str, Any]) -> None:
                obj["metadata"].setdefault("annotations", {})["n"] = str(rng.random())

            store.modify("pods", "default", rng.choice(names), touch)
        else:
            store.delete("pods", "default", rng.choice(names))
        await asyncio.sleep(rng.expovariate(rate))


async def run_once(
    tmp_path: str,
    *,
    outage: float,
    clients: int = 50,
    kubectls: int = 3,
    seed: int = 1,
    settle: float = 60.0,
) -> Outcome:
    rng = random.Random(seed)
    started = time.monotonic()
    overrides = {"hub.max_subscriber_lag": 100000, "logging.level": "error"}
    async with faulty_upstream(tmp_path, overrides, seed=seed) as faulty:
        store = faulty.fake.store
        truth: list[Change] = []
        unsubscribe = store.subscribe("pods", truth.append)
        for i in range(8):
            store.create(
                "pods",
                "default",
                {
                    "metadata": {"name": f"seed-{i}", "labels": {"app": APPS[i % 2]}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            )

        def store_rv() -> int:
            return store.resource_version

        kinds = (
            ["kubectl"] * kubectls
            + ["official"] * 5
            + ["asyncio"] * 5
            + ["informer"] * ((clients - kubectls - 10) // 2)
        )
        kinds += ["tight"] * (clients - len(kinds))
        recorders = [Recorder(f"{kind}-{n}", APPS[n % 2], store_rv) for n, kind in enumerate(kinds)]
        base = faulty.running.url
        kubeconfig = faulty.running.kubeconfig
        stop = asyncio.Event()
        thread_stop = threading.Event()
        churn_stop = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            try:
                for kind, rec in zip(kinds, recorders, strict=True):
                    if kind == "informer":
                        coro: Any = informer(session, base, rec, stop)
                    elif kind == "tight":
                        coro = tight_loop(session, base, rec, stop)
                    elif kind == "official":
                        coro = asyncio.to_thread(official_client, kubeconfig, rec, thread_stop)
                    elif kind == "asyncio":
                        coro = asyncio_client(kubeconfig, rec, stop)
                    else:
                        coro = kubectl_watch(kubeconfig, rec, stop)
                    tasks.append(asyncio.create_task(coro, name=f"client-{rec.name}"))
                tasks.append(asyncio.create_task(churn(faulty, churn_stop, 5.0, rng)))
                await _until(lambda: all(r.sessions and r.state for r in recorders), 60)
                await asyncio.sleep(1.0)

                # The apiserver goes away: open connections reset, new ones accepted and reset.
                faulty.faults.mode = "reset"
                before = faulty.faults.counts.by_mode["reset"]
                faulty.faults.reset_all()
                await asyncio.sleep(outage)
                attempts = faulty.faults.counts.by_mode["reset"] - before
                recovered = time.monotonic()
                for rec in recorders:
                    with rec.lock:
                        rec.recovered_at, rec.recovery_rv = recovered, store.resource_version
                faulty.faults.mode = "pass"

                await asyncio.sleep(min(5.0, outage))
                churn_stop.set()
                await asyncio.sleep(0.2)
                final = _final(store)
                settled = await _until(
                    lambda: all(r.state == final[r.app] for r in recorders), settle
                )
            finally:
                stop.set()
                thread_stop.set()
                churn_stop.set()
                await _stop(tasks)
        unsubscribe()
        problems: list[str] = []
        if not settled:
            problems.append(f"not every client reached the final state within {settle:.0f}s")
        for rec in recorders:
            problems.extend(rec.verify(truth, final[rec.app]))
        latencies = [r.first_after_recovery for r in recorders if r.first_after_recovery]
        if len(latencies) < len(recorders):
            problems.append(f"{len(recorders) - len(latencies)} clients got nothing new after")
        return Outcome(
            problems, attempts, latencies, len(recorders), len(truth), time.monotonic() - started
        )


def _final(store: Any) -> dict[str, dict[str, int]]:
    final: dict[str, dict[str, int]] = {app: {} for app in APPS}
    for obj in store.list("pods", "default"):
        meta = obj["metadata"]
        final[meta["labels"]["app"]][meta["name"]] = int(meta["resourceVersion"])
    return final


async def _until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _stop(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel the asyncio clients; the thread ones end on their own within a stream timeout.
    Any failure of a client task itself (not a cancellation) is reported, not swallowed."""
    for task in tasks:
        if not task.get_name().startswith("client-official"):
            task.cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    for task, result in zip(tasks, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise RuntimeError(f"{task.get_name()} failed: {result!r}") from result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--outage", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args(argv)
    failed = 0
    latencies: list[float] = []
    attempts: list[int] = []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            coro = run_once(tmp, outage=args.outage, clients=args.clients, seed=run)
            if args.loop == "uvloop":
                import uvloop

                outcome = uvloop.run(coro)
            else:
                outcome = asyncio.run(coro)
        print(outcome.line(run), flush=True)
        for problem in outcome.problems[:10]:
            print(f"    {problem}", flush=True)
        failed += bool(outcome.problems)
        latencies.extend(outcome.latencies)
        attempts.append(outcome.attempts)
    p50 = statistics.median(latencies) if latencies else float("nan")
    print(
        f"{args.runs - failed} passed, {failed} failed; loop {args.loop}; outage {args.outage:g}s; "
        f"attempts during outage max {max(attempts)}; first event after recovery p50 {p50:.2f}s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
