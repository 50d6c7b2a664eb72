"""Real clients of every kind on shared watches, while the upstream churns.

kubectl get -w (Table), kubectl -o json watch events, the official Python client's
``watch.stream``, kubernetes_asyncio's watch and an informer-style LIST+WATCH loop subscribe
through the proxy; then the upstream churns at hundreds of events per second. The upstream must
see one watch per distinct key, and every client must receive every event for its selector
once, in order.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from collections import Counter
from typing import Any

import aiohttp
import pytest

from tests.harness import KUBECTL, Running, running_proxy, wait_for

PODS = "/api/v1/namespaces/default/pods"
APPS = ("web", "db")
POPULATION = 12  # pods per app


def _pod(name: str, app: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Pending"},
    }


Event = tuple[str, str, str]  # (type, name, resourceVersion)


def _event(kind: str, obj: dict[str, Any]) -> Event:
    meta = obj["metadata"]
    return (kind, meta["name"], meta["resourceVersion"])


async def _churn(running: Running, changes: int, rate: float) -> dict[str, list[Event]]:
    """Modify, delete and recreate pods at ``rate`` changes/s; return what each app saw."""
    store = running.fake.store
    expected: dict[str, list[Event]] = {app: [] for app in APPS}
    interval = 1.0 / rate
    started = time.monotonic()
    for i in range(changes):
        app = APPS[i % 2]
        name = f"{app}-{(i // 2) % POPULATION}"
        if i % 7 == 6:
            expected[app].append(_event("DELETED", store.delete("pods", "default", name)))
            expected[app].append(_event("ADDED", store.create("pods", "default", _pod(name, app))))
        else:

            def bump(obj: dict[str, Any], i: int = i) -> None:
                obj["status"]["phase"] = f"Phase{i}"

            expected[app].append(_event("MODIFIED", store.modify("pods", "default", name, bump)))
        # Pace in batches so that the loop also serves the clients.
        if i % 10 == 9:
            delay = started + (i + 1) * interval - time.monotonic()
            await asyncio.sleep(max(0.0, delay))
    return expected


class Tally:
    """One client's view: events after the initial snapshot, in arrival order."""

    def __init__(self, name: str, app: str) -> None:
        self.name = name
        self.app = app
        self.initial = 0
        self.events: list[Event] = []
        self.subscribed = False


def _selector(app: str) -> str:
    return f"app={app}"


async def _informer(running: Running, tally: Tally, stop: asyncio.Event) -> None:
    """client-go's reflector shape: LIST, then WATCH from the list's resourceVersion."""
    query = urllib.parse.urlencode({"labelSelector": _selector(tally.app)})
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{running.url}{PODS}?{query}") as response:
            listed = await response.json()
        tally.initial = len(listed["items"])
        rv = listed["metadata"]["resourceVersion"]
        url = (
            f"{running.url}{PODS}?{query}&watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
        )
        async with session.get(url) as response:
            tally.subscribed = True
            async for raw in response.content:
                event = json.loads(raw)
                if event["type"] != "BOOKMARK":
                    tally.events.append(_event(event["type"], event["object"]))
                if stop.is_set():
                    return


async def _raw_watch(running: Running, tally: Tally, stop: asyncio.Event) -> None:
    """A plain watch with no resourceVersion: synthetic ADDEDs, then changes."""
    query = urllib.parse.urlencode({"labelSelector": _selector(tally.app), "watch": "1"})
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{running.url}{PODS}?{query}") as response,
    ):
        tally.subscribed = True
        seen_initial = True
        async for raw in response.content:
            event = json.loads(raw)
            if (
                seen_initial
                and event["type"] == "ADDED"
                and tally.initial < POPULATION
                and not tally.events
            ):
                tally.initial += 1
                continue
            seen_initial = False
            tally.events.append(_event(event["type"], event["object"]))
            if stop.is_set():
                return


def _python_client_watch(running: Running, tally: Tally, stop: threading.Event) -> None:
    from kubernetes import client, watch

    configuration = client.Configuration()
    configuration.host = running.url
    api = client.CoreV1Api(client.ApiClient(configuration))
    listed = api.list_namespaced_pod("default", label_selector=_selector(tally.app))
    tally.initial = len(listed.items)
    stream = watch.Watch()
    tally.subscribed = True
    for event in stream.stream(
        api.list_namespaced_pod,
        "default",
        label_selector=_selector(tally.app),
        resource_version=listed.metadata.resource_version,
        timeout_seconds=60,
    ):
        obj = event["object"]
        tally.events.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
        if stop.is_set():
            stream.stop()
            return


async def _asyncio_client_watch(running: Running, tally: Tally, stop: asyncio.Event) -> None:
    from kubernetes_asyncio import client, watch

    configuration = client.Configuration()
    configuration.host = running.url
    async with client.ApiClient(configuration) as api_client:
        api = client.CoreV1Api(api_client)
        listed = await api.list_namespaced_pod("default", label_selector=_selector(tally.app))
        tally.initial = len(listed.items)
        async with watch.Watch() as stream:
            tally.subscribed = True
            async for event in stream.stream(
                api.list_namespaced_pod,
                "default",
                label_selector=_selector(tally.app),
                resource_version=listed.metadata.resource_version,
                timeout_seconds=60,
            ):
                obj = event["object"]
                tally.events.append(
                    (event["type"], obj.metadata.name, obj.metadata.resource_version)
                )
                if stop.is_set():
                    return


async def _kubectl_watch(
    running: Running, tally: Tally, stop: asyncio.Event, as_json: bool
) -> None:
    args = ["--kubeconfig", running.kubeconfig, "get", "pods", "-w", "-l", _selector(tally.app)]
    if as_json:
        args += ["-o", "json", "--output-watch-events"]
    process = await asyncio.create_subprocess_exec(
        KUBECTL, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        if as_json:
            decoder = json.JSONDecoder()
            buffer = ""
            while not stop.is_set():
                chunk = await process.stdout.read(65536)
                if not chunk:
                    break
                buffer += chunk.decode()
                while buffer.strip():
                    buffer = buffer.lstrip()
                    try:
                        event, end = decoder.raw_decode(buffer)
                    except json.JSONDecodeError:
                        break
                    buffer = buffer[end:]
                    obj = event["object"]
                    if event["type"] == "ADDED" and not tally.events and tally.initial < POPULATION:
                        tally.initial += 1
                        tally.subscribed = tally.initial == POPULATION
                        continue
                    tally.events.append(_event(event["type"], obj))
        else:
            header = await process.stdout.readline()
            assert header.split()[:2] == [b"NAME", b"READY"], header
            while not stop.is_set():
                line = await process.stdout.readline()
                if not line:
                    break
                if tally.initial < POPULATION and not tally.events:
                    tally.initial += 1
                    tally.subscribed = tally.initial == POPULATION
                    continue
                # Table rows carry no resourceVersion: record the row's name only.
                tally.events.append(("ROW", line.split()[0].decode(), ""))
    finally:
        process.kill()
        await process.wait()


def _in_thread(fn: Any, *args: Any) -> asyncio.Future[Any]:
    """Run a blocking client in its own thread (the default executor has too few)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as error:
            loop.call_soon_threadsafe(_settle, future, None, error)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=target, daemon=True).start()
    return future


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@pytest.mark.long(25)
async def test_fifty_mixed_clients_share_watches_and_miss_nothing(tmp_path: Any) -> None:
    overrides = {"ratelimit.qps": 0, "hub.max_subscriber_lag": 100000}
    async with running_proxy(tmp_path, overrides) as running:
        for app in APPS:
            for i in range(POPULATION):
                running.fake.store.create("pods", "default", _pod(f"{app}-{i}", app))
        stop = asyncio.Event()
        thread_stop = threading.Event()
        tallies: list[Tally] = []
        tasks: list[asyncio.Future[Any]] = []

        def add(kind: str, app: str, make: Any) -> None:
            tally = Tally(f"{kind}-{len(tallies)}", app)
            tallies.append(tally)
            tasks.append(asyncio.ensure_future(make(tally)))

        for n in range(50):
            app = "web" if n < 40 else "db"  # 40 clients on one selector, 10 on another
            kind = n % 10
            if kind in (0, 1, 2):
                add("informer", app, lambda t: _informer(running, t, stop))
            elif kind in (3, 4):
                add("raw", app, lambda t: _raw_watch(running, t, stop))
            elif kind in (5, 6):
                add(
                    "python",
                    app,
                    lambda t: _in_thread(_python_client_watch, running, t, thread_stop),
                )
            elif kind == 7:
                add("asyncio", app, lambda t: _asyncio_client_watch(running, t, stop))
            elif kind == 8:
                add("kubectl-table", app, lambda t: _kubectl_watch(running, t, stop, False))
            else:
                add("kubectl-json", app, lambda t: _kubectl_watch(running, t, stop, True))

        try:
            try:
                await wait_for(
                    lambda: all(t.subscribed for t in tallies) or any(t.done() for t in tasks),
                    timeout=60,
                    what="every client to subscribe",
                )
            except AssertionError:
                raise AssertionError(
                    f"not subscribed: {[t.name for t in tallies if not t.subscribed]}"
                ) from None
            assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            hub = running.proxy.hub
            assert hub is not None
            await wait_for(lambda: hub.active_clients == 50, timeout=20, what="hub subscribers")
            expected = await _churn(running, changes=600, rate=300)

            def complete() -> bool:
                return all(len(t.events) >= len(expected[t.app]) for t in tallies)

            await wait_for(complete, timeout=60, what="every client to receive every event")
        finally:
            stop.set()
            thread_stop.set()
            # Wake blocked readers with one more event, then collect.
            running.fake.store.modify("pods", "default", "web-0", lambda o: None)
            _done, pending = await asyncio.wait(tasks, timeout=20)
            for task in pending:
                task.cancel()

        for tally in tallies:
            want = expected[tally.app]
            got = tally.events[: len(want)]
            assert tally.initial == POPULATION, tally.name
            if tally.name.startswith("kubectl-table"):
                assert [name for _, name, _ in got] == [name for _, name, _ in want], tally.name
            else:
                assert got == want, tally.name

        # One upstream watch per distinct key: selector x representation.
        watches = Counter(
            (
                urllib.parse.parse_qs(r.query_string).get("labelSelector", [""])[0],
                "Table" in r.headers.get("Accept", ""),
            )
            for r in running.fake.stats.requests
            if r.watch
        )
        assert watches == Counter(
            {("app=web", False): 1, ("app=web", True): 1, ("app=db", False): 1, ("app=db", True): 1}
        ), watches
