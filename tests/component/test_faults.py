"""Upstream faults the proxy survives: cut, hung and garbled watches, outages, TLS and DNS
failures, token rotation, and SIGTERM under load.

In every case the proxy keeps serving what it can, clients get a clean end of stream or a clear
Status error, and once the upstream is back no event is lost or repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import yaml

from kubefake import FakeApiServer
from tests.harness import Running, make_config, running_proxy, wait_for
from watchproxy.app import Proxy
from watchproxy.upstream.credentials import from_kubeconfig

PODS = "/api/v1/namespaces/default/pods"
FAST_BACKOFF = {
    "backoff.initial_seconds": 0.05,
    "backoff.max_seconds": 0.3,
    "backoff.reset_after_seconds": 1.0,
}
NO_TIMEOUT = aiohttp.ClientTimeout(total=None)


def pod(name: str, app: str = "web") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


class Ledger:
    """Store writes as the watch of all pods in "default" must report them, in order."""

    def __init__(self, fake: FakeApiServer) -> None:
        self.store = fake.store
        self.events: list[tuple[str, str, str]] = []
        self._n = 0

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.events.append((kind, meta["name"], meta["resourceVersion"]))

    def create(self, name: str | None = None) -> None:
        self._n += 1
        self._record("ADDED", self.store.create("pods", "default", pod(name or f"p{self._n}")))

    def modify(self, name: str) -> None:
        self._n += 1
        n = self._n

        def apply(obj: dict[str, Any]) -> None:
            obj.setdefault("metadata", {}).setdefault("annotations", {})["n"] = str(n)

        self._record("MODIFIED", self.store.modify("pods", "default", name, apply))

    def delete(self, name: str) -> None:
        self._record("DELETED", self.store.delete("pods", "default", name))

    def churn(self, count: int) -> None:
        """A mix of creates, modifies and deletes."""
        for _ in range(count):
            self.create()
            if self._n % 3 == 0:
                self.modify(self.events[-1][1])
            if self._n % 5 == 0:
                self.delete(self.events[-1][1])


class Follower:
    """One client watch read in the background: its events and how its stream ended."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, *, raw: bool = False, **kwargs: Any
    ) -> None:
        self.url = url
        self.raw = raw  # lines as bytes (a log stream), not watch events
        self.events: list[Any] = []
        self.status: int | None = None
        self.ended: str | None = None  # "eof" (clean chunked end) or the error
        self._task = asyncio.create_task(self._run(session, kwargs))

    async def _run(self, session: aiohttp.ClientSession, kwargs: dict[str, Any]) -> None:
        try:
            async with session.get(self.url, timeout=NO_TIMEOUT, **kwargs) as response:
                self.status = response.status
                async for raw in response.content:
                    if raw.strip():
                        self.events.append(raw if self.raw else json.loads(raw))
            self.ended = "eof"
        except (aiohttp.ClientError, ValueError) as error:
            self.ended = f"{type(error).__name__}: {error}"

    def seen(self) -> list[tuple[str, str, str]]:
        return [
            (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])
            for e in self.events
            if e["type"] != "BOOKMARK"
        ]

    async def wait(
        self, predicate: Callable[[Follower], bool], what: str, timeout: float = 10.0
    ) -> None:
        await wait_for(
            lambda: predicate(self) or self.ended is not None, timeout=timeout, what=what
        )
        assert predicate(self), f"{what}: stream ended ({self.ended}) with {self.seen()}"

    async def done(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def assert_exact(follower: Follower, initial: int, ledger: Ledger) -> None:
    """After its ``initial`` synthetic ADDEDs the client saw exactly the ledger: nothing lost,
    repeated or reordered."""
    live = follower.seen()[initial:]
    assert live == ledger.events
    rvs = [int(rv) for _, _, rv in live]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)


@contextlib.asynccontextmanager
async def followed(
    running: Running, initial: int, query: str = "?watch=true"
) -> AsyncIterator[Follower]:
    async with aiohttp.ClientSession() as session:
        follower = Follower(session, running.url + PODS + query)
        try:
            await follower.wait(lambda f: len(f.events) >= initial, "initial events")
            yield follower
        finally:
            await follower.close()


# --- broken upstream watches -------------------------------------------------------------------


async def test_upstream_reset_mid_stream_keeps_client_streams_whole(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running:
        fake = running.fake
        for i in range(3):
            fake.store.create("pods", "default", pod(f"seed-{i}"))
        ledger = Ledger(fake)
        async with followed(running, 3) as first, followed(running, 3) as second:
            for round_ in range(3):
                ledger.churn(4)
                opens = fake.stats.watch_opens(PODS)
                assert fake.faults.cut_watches() >= 1
                ledger.churn(4)  # while the shared watch is down
                await fake.stats.wait_until(lambda s, n=opens: s.watch_opens(PODS) > n)
                ledger.churn(2)
                assert first.ended is None and second.ended is None, round_
            total = 3 + len(ledger.events)
            for follower in (first, second):
                await follower.wait(lambda f: len(f.seen()) >= total, "every event")
                assert_exact(follower, 3, ledger)
                assert follower.ended is None  # the stream never broke
        assert running.proxy.metrics.relists._value.get() == 0  # type: ignore[attr-defined]


async def test_hung_upstream_watch_is_abandoned_after_the_read_timeout(tmp_path: Any) -> None:
    overrides = {**FAST_BACKOFF, "upstream.watch_read_timeout_seconds": 0.6}
    async with (
        FakeApiServer(bookmark_interval=0.1) as fake,
        running_proxy(tmp_path, overrides, fake=fake) as running,
    ):
        fake.store.create("pods", "default", pod("seed"))
        ledger = Ledger(fake)
        async with followed(running, 1) as follower:
            fake.faults.hang_watches(True)
            opens = fake.stats.watch_opens(PODS)
            fake.faults.cut_watches()
            ledger.churn(3)
            # The hung watch sends headers and then nothing: the proxy gives up on it and
            # tries again, on its backoff schedule, at least twice.
            await fake.stats.wait_until(lambda s: s.watch_opens(PODS) >= opens + 2, within=10)
            ledger.churn(3)
            fake.faults.hang_watches(False)
            await follower.wait(lambda f: len(f.seen()) >= 1 + len(ledger.events), "resume", 15)
            assert_exact(follower, 1, ledger)
            assert follower.ended is None


@pytest.mark.parametrize(("lines", "rounds"), [(1, 1), (1, 3), (3, 1)])
async def test_garbled_event_lines_make_the_shared_watch_resume(
    tmp_path: Any, lines: int, rounds: int
) -> None:
    async with (
        FakeApiServer(bookmark_interval=30) as fake,
        running_proxy(tmp_path, FAST_BACKOFF, fake=fake) as running,
    ):
        fake.store.create("pods", "default", pod("seed"))
        ledger = Ledger(fake)
        async with followed(running, 1) as follower:
            ledger.churn(2)
            await follower.wait(lambda f: len(f.seen()) >= 1 + len(ledger.events), "before")
            for _ in range(rounds):
                opens = fake.stats.watch_opens(PODS)
                # The next line the upstream writes is cut in half: the shared watch must
                # drop that connection and resume from the last event it decoded.
                fake.faults.garbage_next_watch_line(lines)
                ledger.churn(3)
                await fake.stats.wait_until(lambda s, n=opens: s.watch_opens(PODS) > n)
            ledger.churn(2)
            await follower.wait(lambda f: len(f.seen()) >= 1 + len(ledger.events), "after")
            assert_exact(follower, 1, ledger)
            assert follower.ended is None


@pytest.mark.parametrize("mode", ["refuse", "reset", "503"])
async def test_outage_keeps_streams_open_and_serves_what_it_can(tmp_path: Any, mode: str) -> None:
    async with running_proxy(tmp_path, FAST_BACKOFF) as running, aiohttp.ClientSession() as s:
        fake = running.fake
        fake.store.create("pods", "default", pod("seed"))
        ledger = Ledger(fake)
        async with followed(running, 1) as follower:
            await fake.faults.outage(mode)  # type: ignore[arg-type]
            ledger.churn(3)
            # Pass-through has nothing to serve from: a clear 503 Status, quickly.
            started = time.monotonic()
            async with s.get(running.url + PODS) as response:
                assert response.status == 503, await response.text()
                status = await response.json()
            assert status["kind"] == "Status" and status["reason"] == "ServiceUnavailable"
            assert time.monotonic() - started < 5
            # A second client of the same watch is served from the shared state meanwhile.
            async with s.get(running.url + PODS + "?watch=true&timeoutSeconds=1") as response:
                assert response.status == 200
                body = await asyncio.wait_for(response.read(), 5)
            assert [json.loads(line)["type"] for line in body.splitlines()] == ["ADDED"]
            assert follower.ended is None
            await fake.faults.recover()
            ledger.churn(2)
            await follower.wait(lambda f: len(f.seen()) >= 1 + len(ledger.events), "resume", 15)
            assert_exact(follower, 1, ledger)
            assert follower.ended is None


# --- unreachable upstreams ---------------------------------------------------------------------


def write_kubeconfig(
    path: str,
    server: str,
    *,
    ca: str | None = None,
    token: str | None = None,
    token_file: str | None = None,
) -> str:
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = ca
    user: dict[str, Any] = {}
    if token is not None:
        user["token"] = token
    if token_file is not None:
        user["tokenFile"] = token_file
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    return path


@contextlib.asynccontextmanager
async def proxy_for(
    kubeconfig: str, overrides: dict[str, Any] | None = None, *, reload_seconds: float = 60.0
) -> AsyncIterator[Proxy]:
    proxy = Proxy(
        make_config({**FAST_BACKOFF, **(overrides or {})}),
        from_kubeconfig(kubeconfig, reload_seconds=reload_seconds),
    )
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def assert_unavailable(proxy: Proxy, path: str, *words: str) -> dict[str, Any]:
    """``path`` through the proxy gets a quick 503 Status whose message says why."""
    url = f"http://127.0.0.1:{proxy.api_port}{path}"
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
            assert response.status == 503, await response.text()
            # At most 1 s: client-go retries a 503 with Retry-After 10 times (upstream/client.py).
            assert float(response.headers.get("Retry-After", "0")) <= 1
            status = await response.json()
        assert time.monotonic() - started < 3
    assert status["kind"] == "Status" and status["reason"] == "ServiceUnavailable"
    assert any(word in status["message"] for word in words), status["message"]
    return status


def other_ca(tmp_path: Any) -> str:
    import trustme

    path = os.path.join(tmp_path, "other-ca.pem")
    trustme.CA(organization_name="not the apiserver's CA").cert_pem.write_to_path(path)
    return path


async def test_tls_error_while_known_down_still_names_the_cause(
    tmp_path: Any, fake_api: FakeApiServer
) -> None:
    kubeconfig = write_kubeconfig(
        os.path.join(tmp_path, "kc"), fake_api.url, ca=other_ca(tmp_path), token=fake_api.token
    )
    async with proxy_for(kubeconfig) as proxy:
        await wait_for(lambda: proxy.connectivity.down, what="the prober to fail")
        await assert_unavailable(proxy, PODS, "TLS", "certificate")


async def test_tls_error_no_crash_for_watches_and_lists(
    tmp_path: Any, fake_api: FakeApiServer
) -> None:
    kubeconfig = write_kubeconfig(
        os.path.join(tmp_path, "kc"), fake_api.url, ca=other_ca(tmp_path), token=fake_api.token
    )
    async with proxy_for(kubeconfig) as proxy:
        await wait_for(lambda: proxy.connectivity.down, what="the prober to fail")
        for path in (PODS, PODS + "?watch=true", PODS + "?watch=true&labelSelector=a%3Db"):
            await assert_unavailable(proxy, path, "unreachable", "TLS")
        assert proxy.hub is not None and proxy.hub.active_clients == 0
        assert fake_api.stats.requests == []  # nothing got through the handshake


async def test_dns_failure_is_a_quick_503(tmp_path: Any) -> None:
    kubeconfig = write_kubeconfig(
        os.path.join(tmp_path, "kc"), "https://nonexistent.invalid:6443", token="t"
    )
    async with proxy_for(kubeconfig) as proxy:
        await assert_unavailable(proxy, PODS, "unreachable", "DNS", "resolve")
        await assert_unavailable(proxy, PODS + "?watch=true", "unreachable")
        await wait_for(lambda: proxy.connectivity.down, what="the prober to fail")
        await assert_unavailable(proxy, "/api/v1/namespaces", "unreachable")


# --- credentials -------------------------------------------------------------------------------


async def test_rotated_token_file_is_reread_on_401(tmp_path: Any) -> None:
    token_file = os.path.join(tmp_path, "token")
    with open(token_file, "w", encoding="utf-8") as handle:
        handle.write("token-1\n")
    async with FakeApiServer(token="token-1") as fake:
        kubeconfig = write_kubeconfig(
            os.path.join(tmp_path, "kc"), fake.url, ca=fake.ca_path, token_file=token_file
        )
        # No periodic re-read within the test: only the 401 can make the proxy notice.
        async with proxy_for(kubeconfig, reload_seconds=3600) as proxy:
            url = f"http://127.0.0.1:{proxy.api_port}{PODS}"
            async with aiohttp.ClientSession() as session:
                async with session.get(url) as response:
                    assert response.status == 200
                with open(token_file, "w", encoding="utf-8") as handle:
                    handle.write("token-2\n")
                fake.token = "token-2"
                fake.stats.reset()
                async with session.get(url) as response:
                    assert response.status == 200, await response.text()
                sent = [r.headers.get("Authorization") for r in fake.stats.requests]
                assert sent[-1] == "Bearer token-2"
                assert "Bearer token-1" in sent  # the 401 that triggered the re-read


async def test_vanished_or_empty_token_file_keeps_the_last_good_token(tmp_path: Any) -> None:
    token_file = os.path.join(tmp_path, "token")
    with open(token_file, "w", encoding="utf-8") as handle:
        handle.write("token-1\n")
    async with FakeApiServer(token="token-1") as fake:
        kubeconfig = write_kubeconfig(
            os.path.join(tmp_path, "kc"), fake.url, ca=fake.ca_path, token_file=token_file
        )
        async with proxy_for(kubeconfig, reload_seconds=0.01) as proxy:
            url = f"http://127.0.0.1:{proxy.api_port}{PODS}"
            target = proxy.upstream.target
            assert target.token is not None
            async with aiohttp.ClientSession() as session:
                os.unlink(token_file)
                for _ in range(3):
                    failures = target.token.read_failures
                    await asyncio.sleep(0.02)  # past reload_seconds: the next request re-reads
                    async with session.get(url) as response:
                        assert response.status == 200, await response.text()
                    assert target.token.read_failures > failures
                with open(token_file, "w", encoding="utf-8") as handle:
                    handle.write("")  # caught half-way through a rotation
                await asyncio.sleep(0.02)
                async with session.get(url) as response:
                    assert response.status == 200, await response.text()
                with open(token_file, "w", encoding="utf-8") as handle:
                    handle.write("token-2")
                fake.token = "token-2"
                await asyncio.sleep(0.02)
                async with session.get(url) as response:
                    assert response.status == 200, await response.text()


# --- SIGTERM under load ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# The CLI as shipped (uvloop), and the same CLI on the default asyncio loop.
NO_UVLOOP = (
    "import sys; import watchproxy.cli as cli; "
    "assert callable(cli.install_loop); cli.install_loop = lambda: None; "
    "sys.exit(cli.main())"
)
LAUNCHERS = [
    pytest.param(["-m", "watchproxy"], id="uvloop"),
    pytest.param(["-c", NO_UVLOOP], id="asyncio"),
]


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_sigterm_under_load_exits_0_with_clean_stream_ends(
    tmp_path: Any, launcher: list[str]
) -> None:
    async with FakeApiServer(bookmark_interval=0.2) as fake:
        for i in range(20):
            fake.store.create("pods", "default", pod(f"p{i}", app=f"a{i % 4}"))
        kubeconfig = fake.write_kubeconfig(os.path.join(tmp_path, "upstream.kubeconfig"))
        api_port, admin_port = free_port(), free_port()
        process = await asyncio.create_subprocess_exec(
            sys.executable, *launcher, "run",
            "--kubeconfig", kubeconfig,
            "--listen-port", str(api_port),
            "--admin-host", "127.0.0.1", "--admin-port", str(admin_port),
            "--log-level", "warning",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{api_port}"
            async with aiohttp.ClientSession() as session:
                await wait_ready(session, f"http://127.0.0.1:{admin_port}/readyz", process)
                hub_watches = [
                    Follower(session, f"{base}{PODS}?watch=true&labelSelector=app%3Da{i % 4}")
                    for i in range(12)
                ]
                passthrough_watch = Follower(
                    session,
                    f"{base}{PODS}?watch=true&someUnknownParameter=1",  # not shareable
                )
                fake.store.create("pods", "default", pod("logger"))
                log_stream = Follower(session, f"{base}{PODS}/logger/log?follow=true", raw=True)
                streams = [*hub_watches, passthrough_watch]
                await wait_for(
                    lambda: (
                        all(len(f.events) >= 5 for f in hub_watches)
                        and len(passthrough_watch.events) >= 20
                        and fake.stats.active_watches >= 5
                    ),
                    what="every stream to be flowing",
                )
                stop_churn = asyncio.Event()
                outcomes: list[str] = []
                churn = asyncio.create_task(load(session, base, fake, stop_churn, outcomes))
                await wait_for(lambda: len(outcomes) >= 20, what="load")
                process.send_signal(signal.SIGTERM)
                started = time.monotonic()
                code = await asyncio.wait_for(process.wait(), 10)
                elapsed = time.monotonic() - started
                stop_churn.set()
                await asyncio.wait_for(churn, 10)
                for follower in (*streams, log_stream):
                    await follower.done(5)
            stderr = (await process.stderr.read()).decode() if process.stderr else ""
            assert code == 0, stderr
            assert elapsed < 6, elapsed
            for follower in streams:
                assert follower.status == 200
                assert follower.ended == "eof", (follower.url, follower.ended)
            assert log_stream.ended == "eof", log_stream.ended
            assert "Traceback" not in stderr, stderr
            # Requests during shutdown were answered or refused, never answered 5xx.
            assert "200" in outcomes
            assert not [o for o in outcomes if o.startswith("5")], outcomes
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def wait_ready(
    session: aiohttp.ClientSession, url: str, process: asyncio.subprocess.Process
) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.returncode is not None:
            err = await process.stderr.read() if process.stderr else b""
            raise AssertionError(f"watchproxy exited at start: {err.decode()}")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url) as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise AssertionError("watchproxy did not become ready")


async def load(
    session: aiohttp.ClientSession,
    base: str,
    fake: FakeApiServer,
    stop: asyncio.Event,
    outcomes: list[str],
) -> None:
    """Lists, gets and writes in a loop until ``stop`` (or 20 s): each outcome recorded."""
    deadline = time.monotonic() + 20
    n = 0
    while not stop.is_set() and time.monotonic() < deadline:
        n += 1
        fake.store.create("pods", "default", pod(f"load-{n}", app=f"a{n % 4}"))
        requests = [
            session.get(f"{base}{PODS}"),
            session.get(f"{base}{PODS}/p{n % 20}"),
            session.get(f"{base}/api/v1/namespaces"),
        ]
        for pending in requests:
            try:
                async with pending as response:
                    await response.read()
                    outcomes.append(str(response.status))
            except aiohttp.ClientError as error:
                outcomes.append(type(error).__name__)
        await asyncio.sleep(0)


async def test_client_leaving_a_relayed_stream_is_not_an_error(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_proxy(tmp_path) as running:
        running.fake.store.create("pods", "default", pod("logger"))
        url = running.url + PODS + "/logger/log?follow=true"
        for _ in range(3):
            async with aiohttp.ClientSession() as session, session.get(url) as response:
                assert response.status == 200
                assert await response.content.readline()
            # The client is gone; the proxy notices at its next write to it.
        in_flight = running.proxy.metrics.in_flight.labels("stream")
        await wait_for(lambda: in_flight._value.get() == 0, what="relays to end")  # type: ignore[attr-defined]
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors]
