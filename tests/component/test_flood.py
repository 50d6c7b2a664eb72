"""A flood of idle connections, slow heads or slow bodies cannot lock clients out of the API port.

At the connection cap the proxy sheds the connections that cost least to lose — idle keep-alive
connections first, then connections that have not sent a whole request head, oldest first, then
requests whose body has been silent longest — instead of refusing the new one; requests being
served (watch streams, exec relays) are never shed. A connection that has not sent a complete
head within the header timeout is closed, and one whose body stops arriving gets a 408.

The floods at the default cap (1,024) hold docs/security.md's promise; the silent flood also runs
at the issue's scale (10,000 connections) with ``-m slow``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from tests.harness import Running, running_proxy, wait_for

PODS = "/api/v1/namespaces/default/pods"


def _counter(running: Running, state: str) -> float:
    value: float = running.proxy.metrics.connections_shed.labels(state)._value.get()  # type: ignore[attr-defined]
    return value


def _open(running: Running, state: str | None = None) -> float:
    """Open API connections (in ``state``: head, idle or active; all states if None)."""
    states = ("head", "idle", "active") if state is None else (state,)
    registry = running.proxy.metrics.registry
    name = "watchproxy_client_connections_by_state"
    return sum(registry.get_sample_value(name, {"state": s}) or 0.0 for s in states)


async def _connect(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def _closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the proxy has closed ``sock`` (EOF or reset) within ``timeout``."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            while True:
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def _still_open(sock: socket.socket) -> bool:
    return not await _closed_by_peer(sock, timeout=0.2)


def _at_least(count: Callable[[], float], wanted: int) -> Callable[[], bool]:
    return lambda: count() >= wanted


@contextlib.asynccontextmanager
async def _idle_connections(
    port: int, count: int, accepted: Callable[[], float] | None = None, *, batch: int = 400
) -> AsyncIterator[list[socket.socket]]:
    """``count`` connections that never send a byte, opened in batches smaller than the listen
    backlog. With ``accepted`` (how many the proxy has accepted), each batch waits for the
    proxy to take it: past the backlog the kernel drops connections the client believes open
    (SYN cookies), and those would never reach the proxy at all."""
    socks: list[socket.socket] = []
    try:
        for start in range(0, count, batch):
            size = min(batch, count - start)
            async with asyncio.timeout(60):
                socks += await asyncio.gather(*(_connect(port) for _ in range(size)))
            if accepted is not None:
                await wait_for(_at_least(accepted, len(socks)), what="the proxy to accept")
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, float]:
    started = time.monotonic()
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
        await response.read()
        return response.status, time.monotonic() - started


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path, {"limits.header_timeout_seconds": 0.3}) as running:
        sock = await _connect(running.proxy.api_port)
        try:
            started = time.monotonic()
            assert await _closed_by_peer(sock, timeout=5)
            assert 0.2 < time.monotonic() - started < 3
        finally:
            sock.close()
        counted = running.proxy.metrics.rejected.labels("header-timeout")
        assert counted._value.get() == 1  # type: ignore[attr-defined]


async def test_at_the_cap_the_oldest_idle_connection_makes_room(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, {"limits.max_connections": 3}) as running:
        port = running.proxy.api_port
        async with _idle_connections(port, 3, batch=1) as (oldest, middle, newest):
            async with aiohttp.ClientSession() as session:
                status, _ = await _get(session, running.url + PODS)
            assert status == 200
            assert await _closed_by_peer(oldest)
            assert await _still_open(middle) and await _still_open(newest)
            assert _counter(running, "head") == 1
            assert running.proxy.metrics.rejected.labels("connections")._value.get() == 0  # type: ignore[attr-defined]


async def test_idle_keep_alive_connections_go_before_unfinished_heads(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, {"limits.max_connections": 3}) as running:
        port = running.proxy.api_port
        async with _idle_connections(port, 2, batch=1) as (head_a, head_b):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(f"GET {PODS} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200")
                # The keep-alive connection is now idle, and younger than both heads.
                await wait_for(lambda: _open(running, "idle") == 1, what="an idle connection")
                async with aiohttp.ClientSession() as session:
                    status, _ = await _get(session, running.url + PODS)
                assert status == 200
                assert await asyncio.wait_for(reader.read(), 5) is not None
                assert reader.at_eof()
                assert await _still_open(head_a) and await _still_open(head_b)
                assert _counter(running, "idle") == 1
            finally:
                writer.close()


async def test_watch_streams_are_never_shed(tmp_path: Any) -> None:
    async with (
        running_proxy(
            tmp_path, {"limits.max_connections": 2, "hub.bookmark_interval_seconds": 0.3}
        ) as running,
        aiohttp.ClientSession() as first,
        aiohttp.ClientSession() as second,
    ):
        url = running.url + PODS + "?watch=1&allowWatchBookmarks=true"
        watches = [await first.get(url), await second.get(url)]
        try:
            assert [w.status for w in watches] == [200, 200]
            sock = await _connect(running.proxy.api_port)
            try:
                sock.sendall(f"GET {PODS} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                reply = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 4096), 5)
                assert reply.startswith(b"HTTP/1.1 503"), reply[:100]
            finally:
                sock.close()
            # Both streams still deliver: a bookmark arrives on each.
            for watch in watches:
                line = await asyncio.wait_for(watch.content.readline(), 10)
                assert b'"BOOKMARK"' in line
            assert _counter(running, "idle") == 0 and _counter(running, "head") == 0
        finally:
            for watch in watches:
                watch.close()


async def test_a_burst_of_connections_fits_the_listen_backlog(tmp_path: Any) -> None:
    """Past the backlog the kernel drops SYNs and clients wait a second to retry: a burst of
    400 connections must be taken at once (asyncio's create_server listens with 100 unless
    told otherwise)."""
    async with running_proxy(tmp_path, {"limits.max_connections": 1000}) as running:
        started = time.monotonic()
        async with _idle_connections(running.proxy.api_port, 400, batch=400):
            elapsed = time.monotonic() - started
        assert elapsed < 0.8, elapsed


async def _flood(tmp_path: Any, *, idle: int, max_connections: int) -> None:
    _raise_fd_limit(idle + max_connections + 1024)
    overrides = {"limits.max_connections": max_connections}
    async with running_proxy(tmp_path, overrides) as running:
        gc.collect()
        rss_before = _rss_bytes()

        def accepted() -> float:
            return _open(running) + _counter(running, "head") + _counter(running, "idle")

        async with _idle_connections(running.proxy.api_port, idle, accepted):
            assert _counter(running, "head") == idle - max_connections
            assert _open(running) <= max_connections
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                answers = [await _get(session, running.url + PODS) for _ in range(10)]
            rss_after = _rss_bytes()
            assert [status for status, _ in answers] == [200] * 10, answers
            assert max(seconds for _, seconds in answers) < 1.0, answers
            assert _open(running) <= max_connections
        # What the flood costs is bounded by the cap, not by the number of connections.
        per_connection = (rss_after - rss_before) / idle
        # The figure for the record (shown with -s): the issue quotes it.
        print(
            f"flood: {idle} idle connections, cap {max_connections}: "
            f"{sum(status == 200 for status, _ in answers)}/10 answered, slowest "
            f"{max(seconds for _, seconds in answers):.3f} s, RSS +{per_connection:.0f} B/conn"
        )
        assert per_connection < 8 * 1024, (rss_before, rss_after)


DEFAULT_CAP = 1024
# What a flooding connection sends once connected (then a byte now and then for a body).
BODY = b'{"metadata": {"name": "slow"}, "data": {"k": "' + b"v" * 900 + b'"}}'
PARTIAL_HEAD = f"GET {PODS} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow".encode()
STALLED_BODY = (
    f"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
).encode() + BODY[:100]
# A body over 64 KiB streams upstream as it arrives (server.passthrough), on aiohttp's path.
BIG_BODY = (
    f"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    f"Content-Type: application/json\r\nContent-Length: {200_000}\r\n\r\n"
).encode() + b'{"metadata": {"name": "big"}, "data": {"k": "'
WHOLE_REQUEST = f"GET {PODS} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


async def _keep_alive_idle(sock: socket.socket) -> None:
    """One request answered on ``sock``, which then stays open, idle (unless the proxy shed
    it already, as one of the oldest unfinished heads)."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionError):
        await loop.sock_sendall(sock, WHOLE_REQUEST)
    reply = b""
    async with asyncio.timeout(30):
        while b"\r\n\r\n" not in reply:
            try:
                data = await loop.sock_recv(sock, 65536)
            except ConnectionError:
                data = b""
            if not data:
                return
            reply += data
    assert reply.startswith(b"HTTP/1.1 200"), reply[:100]


@pytest.mark.parametrize(
    "kind",
    [
        "partial-head",
        "stalled-body",
        "stalled-big-body",
        "idle-keep-alive",
    ],
)
async def test_a_flood_at_the_default_cap_does_not_lock_clients_out(
    tmp_path: Any, kind: str
) -> None:
    """The promise of docs/security.md, at the default connection cap: with more connections
    than the cap holding heads, bodies or keep-alive idleness, a new client is served at once.
    (The deadlines are long here: this is the cap's test, not the deadlines'.)"""
    count = DEFAULT_CAP + 100
    _raise_fd_limit(2 * count + 1024)
    overrides = {"limits.header_timeout_seconds": 600, "limits.body_timeout_seconds": 600}
    async with running_proxy(tmp_path, overrides) as running:
        assert running.proxy.config.limits.max_connections == DEFAULT_CAP
        state = {"partial-head": "head", "idle-keep-alive": "idle"}.get(kind, "body")
        loop = asyncio.get_running_loop()

        def accepted() -> float:
            return _open(running) + sum(_counter(running, s) for s in ("head", "body", "idle"))

        async with _idle_connections(running.proxy.api_port, count, accepted) as socks:
            for start in range(0, count, 200):
                batch = socks[start : start + 200]
                if kind == "idle-keep-alive":
                    await asyncio.gather(*(_keep_alive_idle(sock) for sock in batch))
                else:
                    payload = {"partial-head": PARTIAL_HEAD, "stalled-body": STALLED_BODY}.get(
                        kind, BIG_BODY
                    )
                    await asyncio.gather(
                        *(loop.sock_sendall(sock, payload) for sock in batch),
                        return_exceptions=True,  # one shed already, as an unfinished head
                    )
            await wait_for(
                lambda: _open(running, state) == DEFAULT_CAP, what=f"{DEFAULT_CAP} in {state}"
            )
            trickling = asyncio.ensure_future(_trickle(socks, kind))
            try:
                connector = aiohttp.TCPConnector(force_close=True)
                async with aiohttp.ClientSession(connector=connector) as session:
                    answers = [await _get(session, running.url + PODS) for _ in range(10)]
            finally:
                trickling.cancel()
            assert [status for status, _ in answers] == [200] * 10, answers
            assert max(seconds for _, seconds in answers) < 1.0, answers
            assert _open(running) <= DEFAULT_CAP
            # The first new client made room (a client's connection closed makes room for
            # the next).
            assert _counter(running, state) >= 1
            print(
                f"{kind} flood: {count} connections, cap {DEFAULT_CAP}: slowest answer "
                f"{max(seconds for _, seconds in answers):.3f} s"
            )


async def _trickle(socks: list[socket.socket], kind: str) -> None:
    """The flood keeps going: a byte more of each head or body every half second."""
    if kind == "idle-keep-alive":
        return
    for index in range(100, len(BODY) - 1):
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(b"x" if kind == "partial-head" else BODY[index : index + 1])
        await asyncio.sleep(0.5)


async def test_an_idle_flood_does_not_lock_clients_out(tmp_path: Any) -> None:
    await _flood(tmp_path, idle=1500, max_connections=128)


@pytest.mark.slow
async def test_an_idle_flood_of_ten_thousand_does_not_lock_clients_out(tmp_path: Any) -> None:
    await _flood(tmp_path, idle=10_000, max_connections=1024)
