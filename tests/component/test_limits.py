"""Limits of the API port: a deadline for request headers, a cap on connections and watches."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tests.harness import running_proxy

PODS = "/api/v1/namespaces/default/pods"


async def _read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    status_line = await asyncio.wait_for(reader.readline(), 10)
    headers: dict[str, str] = {}
    while (line := await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), json.loads(body)


async def test_slowloris_headers_get_408_and_are_closed(tmp_path: Any) -> None:
    overrides = {"limits.header_timeout_seconds": 0.5}
    async with running_proxy(tmp_path, overrides) as running:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        writer.write(b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        await writer.drain()  # ... and the blank line never comes
        code, status = await _read_reply(reader)
        assert code == 408
        assert status["kind"] == "Status" and status["reason"] == "Timeout"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
        writer.close()
        metrics = running.proxy.metrics.rejected.labels("header-timeout")
        assert metrics._value.get() == 1  # type: ignore[attr-defined]


# Long enough that a loaded machine's stalls do not make a prompt head look slow.
HEAD_DEADLINE = 1.0


async def test_a_keep_alive_connection_idles_past_head_deadlines_then_gets_its_own(
    tmp_path: Any,
) -> None:
    """One timer serves the connection's deadlines (server.protocol): idle for several head
    deadlines after an answer, it stays open; a partial head then gets its 408 no sooner than
    a whole head deadline after it began."""
    overrides = {"limits.header_timeout_seconds": HEAD_DEADLINE}
    async with running_proxy(tmp_path, overrides) as running:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        try:
            writer.write(f"GET {PODS} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            code, _ = await _read_reply(reader)
            assert code == 200
            # Idle: the armed timer fires (at the old head deadline and after) and finds
            # nothing due. A closed connection would read b"" here.
            idle = asyncio.ensure_future(reader.read(1))
            done, _ = await asyncio.wait({idle}, timeout=2.5 * HEAD_DEADLINE)
            assert not done, "an idle keep-alive connection was closed"
            idle.cancel()
            # On the loop's clock, which the proxy's deadlines use (the proxy runs in this
            # loop): the head's deadline is set no earlier than this write.
            loop = asyncio.get_running_loop()
            began = loop.time()
            writer.write(f"GET {PODS} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
            code, status = await _read_reply(reader)
            waited = loop.time() - began
            assert code == 408 and status["reason"] == "Timeout"
            assert HEAD_DEADLINE <= waited < 10, waited
        finally:
            writer.close()


async def test_open_watch_is_not_a_slow_client(tmp_path: Any) -> None:
    overrides = {"limits.header_timeout_seconds": 0.3}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        async with session.get(running.url + PODS + "?watch=1&timeoutSeconds=1") as response:
            assert response.status == 200
            assert await response.read() == b""  # ended by its timeout, not by the guard
        # Keep-alive: a second request on the same connection is served too.
        async with session.get(running.url + PODS) as response:
            assert response.status == 200


# The connection cap sheds idle connections first: see test_flood.py.


async def test_watches_beyond_the_cap_get_429(tmp_path: Any) -> None:
    overrides = {"limits.max_watches": 2}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        first = await session.get(running.url + PODS + "?watch=1")
        second = await session.get(running.url + PODS + "?watch=1")
        async with session.get(running.url + PODS + "?watch=1") as third:
            assert third.status == 429
            assert third.headers["Retry-After"] == "5"
            assert (await third.json())["reason"] == "TooManyRequests"
        first.close()
        second.close()


async def test_oversized_body_gets_413(tmp_path: Any) -> None:
    overrides = {"limits.max_body_bytes": 1024}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        body = json.dumps({"metadata": {"name": "x"}, "data": {"k": "v" * 4096}})
        async with session.post(
            running.url + "/api/v1/namespaces/default/configmaps",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as response:
            assert response.status == 413
            assert (await response.json())["reason"] == "RequestEntityTooLarge"
        assert not [r for r in running.fake.stats.requests if r.method == "POST"]


async def test_token_bucket_answers_429_instead_of_queueing_past_max_wait(tmp_path: Any) -> None:
    overrides = {"ratelimit.qps": 1, "ratelimit.burst": 1, "ratelimit.max_wait_seconds": 0.1}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        await asyncio.sleep(1.1)  # the readiness probe took the first token; let it refill
        running.fake.stats.reset()
        answers = []
        for _ in range(3):
            async with session.get(running.url + PODS) as response:
                answers.append((response.status, response.headers.get("Retry-After")))
                if response.status == 429:
                    status = await response.json()
        assert answers[0] == (200, None)
        assert [code for code, _ in answers[1:]] == [429, 429]
        assert all(retry and int(retry) >= 1 for _, retry in answers[1:])
        assert status["reason"] == "TooManyRequests"
        assert len([r for r in running.fake.stats.requests if r.path == PODS]) == 1
        throttled = running.proxy.metrics.throttled.labels("upstream")._value.get()  # type: ignore[attr-defined]
        assert throttled == 2


async def test_smuggling_and_traversal_attempts_are_refused_and_logged(
    tmp_path: Any, caplog: Any
) -> None:
    import logging

    caplog.set_level(logging.WARNING)
    async with running_proxy(tmp_path) as running:
        attempts = [
            b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"GET /api/v1/namespaces/default/%2e%2e/kube-system/secrets HTTP/1.1\r\n"
            b"Host: 127.0.0.1\r\n\r\n",
        ]
        for raw in attempts:
            reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
            writer.write(raw)
            await writer.drain()
            code, status = await _read_reply(reader)
            assert code == 400 and status["kind"] == "Status"
            writer.close()
        assert not [r for r in running.fake.stats.requests if r.method == "POST"]
        assert not [r for r in running.fake.stats.requests if "secrets" in r.path]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("refused a malformed request from 127.0.0.1") for m in messages)
    assert any(m.startswith("refused non-canonical path") for m in messages)
    assert all("\n" not in m for m in messages)  # one line each


def test_aiohttp_runs_its_c_http_parser() -> None:
    """The pure-Python fallback parser has had request-smuggling bugs the C parser has not."""
    import aiohttp.http_parser

    assert aiohttp.http_parser.HttpRequestParser.__module__ == "aiohttp._http_parser"


async def test_a_quiet_passed_through_watch_ends_cleanly_at_the_read_timeout(
    tmp_path: Any,
) -> None:
    """A watch the hub passes through (a legacy /watch/ path) whose upstream goes silent (a
    half-open connection looks the same) ends with a clean end of stream at
    ``upstream.stream_idle_timeout_seconds``: the client re-watches, as after a watch timeout."""
    overrides = {"upstream.stream_idle_timeout_seconds": 0.5}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("configmaps", "default", {"metadata": {"name": "quiet"}})
        url = running.url + "/api/v1/watch/namespaces/default/configmaps/quiet"
        async with session.get(url) as response:
            assert response.status == 200
            first = await asyncio.wait_for(response.content.readline(), 5)
            assert b'"ADDED"' in first
            # Then nothing comes upstream; the proxy ends the stream, cleanly (chunked EOF).
            assert await asyncio.wait_for(response.content.read(), 5) == b""


# A body's deadlines, short for the tests; long enough that a loaded machine keeps a prompt
# body in time.
BODY_DEADLINE = 0.6
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def _configmap(name: str, size: int) -> bytes:
    """A ConfigMap's JSON, ``size`` bytes long or a little more."""
    return json.dumps({"metadata": {"name": name}, "data": {"k": "v" * size}}).encode()


def _post_head(length: int | None) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (
        f"POST {CONFIGMAPS} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{framing}\r\n\r\n"
    ).encode()


# Each framing takes a different way through the protocol (server.protocol): a small body with
# a length is read at once, a big one only once the body budget holds it (the socket is not
# read meanwhile), a chunked one by llhttp's chunk parser.
FRAMINGS = {"small-length": 1000, "streamed-length": 200_000, "chunked": None}


@pytest.mark.parametrize("framing", list(FRAMINGS))
async def test_a_body_that_stops_arriving_gets_408_and_is_closed(
    tmp_path: Any, framing: str
) -> None:
    body = _configmap("stalled", 300_000 if framing == "streamed-length" else 1000)
    size = FRAMINGS[framing]
    length = None if size is None else len(body)
    overrides = {
        "limits.body_timeout_seconds": BODY_DEADLINE,
        "limits.body_min_bytes_per_second": 0,
    }
    async with running_proxy(tmp_path, overrides) as running:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        try:
            part = body[: len(body) // 2]
            if length is None:
                part = f"{len(part):x}\r\n".encode() + part + b"\r\n"
            writer.write(_post_head(length) + part)
            await writer.drain()  # ... and the rest never comes
            loop = asyncio.get_running_loop()
            began = loop.time()
            code, status = await _read_reply(reader)
            waited = loop.time() - began
            assert code == 408, status
            assert status["kind"] == "Status" and status["reason"] == "Timeout"
            assert "request body not received" in status["message"]
            assert BODY_DEADLINE * 0.9 <= waited < 10, waited
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
        finally:
            writer.close()
        counted = running.proxy.metrics.rejected.labels("body-timeout")
        assert counted._value.get() == 1  # type: ignore[attr-defined]
        # Nothing was created from the half a body.
        assert not running.fake.store.list("configmaps", "default")


async def test_a_body_that_keeps_arriving_slowly_is_served(tmp_path: Any) -> None:
    """The idle deadline runs between reads, not over the whole body: a body that takes
    several deadlines, a piece at a time, is served."""
    overrides = {
        "limits.body_timeout_seconds": BODY_DEADLINE,
        "limits.body_min_bytes_per_second": 0,
    }
    body = _configmap("slow", 1000)
    async with running_proxy(tmp_path, overrides) as running:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        try:
            writer.write(_post_head(len(body)))
            pieces = 5
            step = -(-len(body) // pieces)
            for start in range(0, len(body), step):
                await asyncio.sleep(BODY_DEADLINE / 2)
                writer.write(body[start : start + step])
                await writer.drain()
            code, created = await _read_reply(reader)
            assert code == 201, created
            assert created["metadata"]["name"] == "slow"
        finally:
            writer.close()


async def test_a_body_trickling_under_the_minimum_rate_gets_408(tmp_path: Any) -> None:
    """A byte now and then never trips the idle deadline; the minimum average rate ends it."""
    overrides = {
        "limits.body_timeout_seconds": BODY_DEADLINE,
        "limits.body_min_bytes_per_second": 1000,
    }
    body = _configmap("trickle", 1000)
    async with running_proxy(tmp_path, overrides) as running:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        try:
            writer.write(_post_head(len(body)))
            loop = asyncio.get_running_loop()
            began = loop.time()

            async def trickle() -> None:
                for byte in body:
                    writer.write(bytes([byte]))
                    await asyncio.sleep(BODY_DEADLINE / 4)

            trickling = asyncio.ensure_future(trickle())
            try:
                code, status = await _read_reply(reader)
            finally:
                trickling.cancel()
            waited = loop.time() - began
            assert code == 408 and status["reason"] == "Timeout", status
            assert "bytes/s" in status["message"]
            # Due at the deadline plus a few bytes' worth at the minimum rate.
            assert BODY_DEADLINE * 0.9 <= waited < 10, waited
        finally:
            writer.close()


async def test_a_client_still_sending_after_the_408_reads_it_however_late_it_reads(
    tmp_path: Any,
) -> None:
    """The 408 goes out with the end of the writing side; the connection then drops what the
    client keeps sending until it falls silent. Closed at a fixed second after the answer, a
    byte the client sent later made the kernel reset the connection, and the reset took the
    unread 408 with it (the suite's trickling client under load)."""
    overrides = {"limits.body_timeout_seconds": BODY_DEADLINE}
    body = _configmap("late-reader", 1000)
    async with running_proxy(tmp_path, overrides) as running:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        try:
            writer.write(_post_head(len(body)) + body[:10])
            await writer.drain()
            # The client sends a byte now and then and reads nothing for three seconds: the
            # 408 and the proxy's FIN wait in its socket meanwhile.
            loop = asyncio.get_running_loop()
            stop_at = loop.time() + 3.0
            for byte in body[10:]:
                if loop.time() >= stop_at:
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(0.2)
            code, status = await _read_reply(reader)
            assert code == 408 and status["reason"] == "Timeout", status
        finally:
            writer.close()
