"""Requests ride pooled keep-alive connections (watchproxy/upstream/pool.py).

Pinned here: a busy client's requests reuse one upstream connection instead of dialing each
time; an idle pooled connection the network killed costs the next request nothing; a request
that was sent on a reused connection the apiserver closed at that moment is sent once more when
it is idempotent, and never when it is not; a big request body is read whole before it goes
upstream, and one over the limit is refused with a 413 and never half-applied.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.faultproxy import faulty_upstream
from tests.harness import wait_for
from watchproxy.upstream.connection import Broken
from watchproxy.upstream.pool import ConnectionPool

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def dials(proxy: Any) -> float:
    return float(proxy.metrics.upstream_connection_attempts._value.get())


async def test_sequential_requests_share_one_upstream_connection(tmp_path: Any) -> None:
    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        proxy = f.running.proxy
        before_dials, before_links = dials(proxy), f.faults.counts.by_mode["pass"]
        for i in range(50):
            body = json.dumps({"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}})
            async with session.post(
                f.running.url + CONFIGMAPS,
                data=body,
                headers={"Content-Type": "application/json"},
            ) as created:
                assert created.status == 201, await created.text()
            async with session.get(f"{f.running.url}{CONFIGMAPS}/cm-{i}") as got:
                assert (await got.json())["data"] == {"i": str(i)}
        # The probe's connection may be the one reused; at most one more is dialed.
        assert dials(proxy) - before_dials <= 1
        assert f.faults.counts.by_mode["pass"] - before_links <= 1


async def test_a_pooled_connection_reset_while_idle_costs_the_next_request_nothing(
    tmp_path: Any,
) -> None:
    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        for _ in range(5):
            async with session.get(f.running.url + CONFIGMAPS) as listed:
                assert listed.status == 200
            assert f.faults.reset_all() >= 1  # every idle upstream connection gets an RST
            async with session.get(f.running.url + CONFIGMAPS) as again:
                assert again.status == 200, await again.text()
        assert f.running.proxy.connectivity.up


async def test_a_big_body_is_read_whole_before_its_request_goes_upstream(
    tmp_path: Any,
) -> None:
    """While the client still holds the second half of a 1 MiB body, nothing of its request has
    gone to the apiserver (a slow sender holds no upstream slot: policy.bodybudget), the body
    holds its size of the body budget, and gives it back once the request has gone."""
    half = 512 * 1024
    value = "x" * (2 * half - 200)
    body = json.dumps({"metadata": {"name": "big"}, "data": {"v": value}}).encode()
    second_half = asyncio.Event()

    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        budget = f.running.proxy.forwarder.body_budget
        assert budget is not None
        start = f.faults.counts.bytes_up

        async def parts() -> AsyncIterator[bytes]:
            yield body[:half]
            await second_half.wait()
            yield body[half:]

        async def hold_then_release() -> None:
            await wait_for(lambda: budget.held == len(body), what="the body's budget taken")
            assert f.faults.counts.bytes_up == start  # nothing of it upstream yet
            second_half.set()

        holder = asyncio.create_task(hold_then_release())
        async with session.post(
            f.running.url + CONFIGMAPS,
            data=parts(),
            headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
        ) as created:
            assert created.status == 201, await created.text()
        await holder
        assert budget.held == 0
        async with session.get(f"{f.running.url}{CONFIGMAPS}/big") as got:
            assert (await got.json())["data"]["v"] == value


async def test_a_body_that_does_not_fit_the_budget_gets_503_before_it_is_read(
    tmp_path: Any,
) -> None:
    """With the body budget taken, a big body is answered 503 with Retry-After and a Status,
    and nothing goes upstream; once the budget is back, the same request is served."""
    body = json.dumps({"metadata": {"name": "late"}, "data": {"v": "y" * 200_000}}).encode()
    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        budget = f.running.proxy.forwarder.body_budget
        assert budget is not None and budget.take(budget.capacity)  # as if others held it all
        start = f.faults.counts.bytes_up
        headers = {"Content-Type": "application/json"}
        async with session.post(f.running.url + CONFIGMAPS, data=body, headers=headers) as busy:
            assert busy.status == 503
            assert busy.headers["Retry-After"] == "1"
            status = await busy.json()
            assert (status["kind"], status["code"]) == ("Status", 503)
            assert "request bodies" in status["message"]
        assert f.faults.counts.bytes_up == start
        budget.give(budget.capacity)
        async with session.post(f.running.url + CONFIGMAPS, data=body, headers=headers) as ok:
            assert ok.status == 201, await ok.text()
        assert budget.held == 0


@pytest.mark.parametrize("declared", [True, False])
async def test_a_body_over_the_limit_is_refused_and_nothing_is_created(
    tmp_path: Any, declared: bool
) -> None:
    limit = 256 * 1024
    body = json.dumps({"metadata": {"name": "huge"}, "data": {"v": "y" * 2 * limit}}).encode()

    async def parts() -> AsyncIterator[bytes]:
        for at in range(0, len(body), 65536):
            yield body[at : at + 65536]

    async with (
        faulty_upstream(tmp_path, {"limits.max_body_bytes": limit}) as f,
        aiohttp.ClientSession() as session,
    ):
        async with session.post(
            f.running.url + CONFIGMAPS,
            data=body if declared else parts(),
            headers={"Content-Type": "application/json"},
        ) as refused:
            assert refused.status == 413
            assert (await refused.json())["reason"] == "RequestEntityTooLarge"
        async with session.get(f"{f.running.url}{CONFIGMAPS}/huge") as missing:
            assert missing.status == 404
        assert f.running.proxy.connectivity.up


@pytest.mark.parametrize(("method", "resent"), [("GET", True), ("DELETE", True), ("POST", False)])
async def test_a_request_on_a_reused_connection_closed_under_it(method: str, resent: bool) -> None:
    """The server answers the first request of each connection and closes the connection on
    the second without answering it, as an apiserver closing an idle connection at that very
    moment would. An idempotent request goes again on a fresh connection; any other fails."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for served in range(2):
            if not await reader.readuntil(b"\r\n\r\n"):
                break
            if served == 1:
                break  # closed with the request unanswered
            writer.write(answer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool("127.0.0.1", port)  # plain TCP: the rules under test are not TLS's
    request = f"{method} /x HTTP/1.1\r\nHost: h\r\n\r\n".encode()
    try:
        first = await pool.request(
            request, ssl_context=None, connect_timeout=5, may_resend=method != "POST"
        )
        assert await first.read() == b"ok"
        first.release()
        if resent:
            again = await pool.request(
                request, ssl_context=None, connect_timeout=5, may_resend=True
            )
            assert await again.read() == b"ok"
            again.release()
            assert pool.dials == 2
        else:
            with pytest.raises(Broken):
                await pool.request(request, ssl_context=None, connect_timeout=5, may_resend=False)
            assert pool.dials == 1
    finally:
        await pool.close(2)
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("first_deadline", "second_deadline"), [(0.2, 0.6), (30.0, 0.3)])
async def test_each_request_on_a_reused_connection_times_out_at_its_own_deadline(
    first_deadline: float, second_deadline: float
) -> None:
    """A connection checks its requests' deadlines with one timer, armed lazily: the timer a
    first request armed may still be pending when the second is sent. The second request still
    ends at its own deadline, whether it is later than the first's (the timer fires early and
    looks again) or sooner (the timer is moved forward)."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    second_came = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)  # the first is answered at once
        await reader.readuntil(b"\r\n\r\n")
        second_came.set()  # the second never is
        await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool("127.0.0.1", port)  # plain TCP: the rules under test are not TLS's
    request = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"
    loop = asyncio.get_running_loop()
    try:
        first = await pool.request(
            request, ssl_context=None, connect_timeout=5, may_resend=True, deadline=first_deadline
        )
        assert await first.read() == b"ok"
        first.release()
        sent_at = loop.time()
        with pytest.raises(TimeoutError):
            await pool.request(
                request,
                ssl_context=None,
                connect_timeout=5,
                may_resend=True,
                deadline=second_deadline,
            )
        waited = loop.time() - sent_at
        assert second_came.is_set() and pool.dials == 1  # it went on the reused connection
        assert second_deadline - 0.05 <= waited < second_deadline + 1.0, waited
    finally:
        await pool.close(2)
        server.close()
        await server.wait_closed()
