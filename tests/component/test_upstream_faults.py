"""Network faults between watchproxy and the apiserver (tests/faultproxy.py in between).

What is pinned here: one slow request fails alone and never marks the upstream down; failed
probes are logged where an operator sees them; pass-through streams end cleanly when the
upstream goes silent; the fault proxy itself does what each mode says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import pytest

from tests.faultproxy import FaultProxy, faulty_upstream
from tests.harness import wait_for

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def test_faultproxy_relays_resets_and_blackholes(tmp_path: Any) -> None:
    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{f.faults.port}/version"
        ssl = f.fake.client_ssl_context()
        async with session.get(url, ssl=ssl) as response:
            assert response.status == 200
        f.faults.mode = "reset"
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as fresh, fresh.get(url, ssl=ssl):
                pass
        f.faults.mode = "blackhole"
        with pytest.raises(TimeoutError):
            async with (
                aiohttp.ClientSession() as fresh,
                fresh.get(url, ssl=ssl, timeout=aiohttp.ClientTimeout(total=0.5)),
            ):
                pass
        assert f.faults.counts.by_mode["reset"] >= 1
        assert f.faults.counts.by_mode["blackhole"] >= 1


async def test_reply_cut_mid_record_fails_that_request_only(tmp_path: Any) -> None:
    async with faulty_upstream(tmp_path) as f, aiohttp.ClientSession() as session:
        proxy = f.running.proxy
        for cut in (f.faults.truncate_next, f.faults.reset_mid_record):
            f.faults.reset_all()  # the next request dials anew; its reply is cut
            cut(1)
            async with session.get(f.running.url + PODS) as response:
                assert response.status in (503, 504), await response.text()
            assert proxy.connectivity.up
            async with session.get(f.running.url + PODS) as response:
                assert response.status == 200


async def test_one_timed_out_request_leaves_the_upstream_up(tmp_path: Any) -> None:
    overrides = {"upstream.request_timeout_seconds": 0.5}
    async with faulty_upstream(tmp_path, overrides) as f, aiohttp.ClientSession() as session:
        proxy = f.running.proxy
        f.faults.trickle = (1, 0.2)  # an answer that takes far longer than the timeout
        async with session.get(f.running.url + PODS) as response:
            assert response.status == 504, await response.text()
        assert proxy.connectivity.up, "one slow request marked the whole upstream down"
        f.faults.trickle = None
        f.faults.reset_all()  # drop the connection still trickling
        async with session.get(f.running.url + PODS) as response:
            assert response.status == 200, await response.text()


async def test_failed_probes_are_logged_with_their_cause(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    overrides = {"backoff.initial_seconds": 0.05, "backoff.max_seconds": 0.1}
    with caplog.at_level(logging.WARNING, logger="watchproxy"):
        async with faulty_upstream(tmp_path, overrides) as f:
            proxy = f.running.proxy
            f.faults.mode = "reset"
            f.faults.reset_all()
            proxy.connectivity.report_unreachable("test outage")
            await wait_for(lambda: proxy.connectivity.attempts >= 4, what="a few probes")
            f.faults.mode = "pass"
            await wait_for(lambda: proxy.connectivity.up, what="recovery")
    probes = [r.getMessage() for r in caplog.records if "next probe in" in r.getMessage()]
    assert len(probes) >= 2, probes
    assert all(r.levelno == logging.WARNING for r in caplog.records if "next probe" in r.msg)
    assert any("reset" in m.lower() or "cannot connect" in m for m in probes), probes


async def test_pass_through_stream_ends_cleanly_when_the_upstream_goes_silent(
    tmp_path: Any,
) -> None:
    overrides = {"upstream.stream_idle_timeout_seconds": 1.0}
    async with faulty_upstream(tmp_path, overrides) as f, aiohttp.ClientSession() as session:
        f.fake.store.create("pods", "default", pod("chatty"))
        url = f"{f.running.url}{PODS}/chatty/log?follow=true"
        lines = 0
        async with session.get(url) as response:
            assert response.status == 200
            await response.content.readline()
            frozen_at = time.monotonic()
            f.faults.freeze()  # the upstream connection goes half-open: silence, no close
            async with asyncio.timeout(10):
                async for _line in response.content:
                    lines += 1
            ended_after = time.monotonic() - frozen_at
        assert 0.5 <= ended_after < 5, ended_after
        # A clean chunked end, not a reset: the body ended without an error above.
        assert lines <= 2


async def test_fault_proxy_stop_closes_everything() -> None:
    async with FaultProxy("127.0.0.1", 9) as fp:  # nothing listens on the target: discard
        fp.mode = "blackhole"
        _, writer = await asyncio.open_connection("127.0.0.1", fp.port)
        await wait_for(lambda: fp.counts.accepted == 1, what="accept")
    writer.close()
    await writer.wait_closed()


async def test_a_stream_whose_head_never_comes_ends_after_its_idle_timeout(
    tmp_path: Any,
) -> None:
    """A watch or ``logs -f`` sent to an apiserver that accepts it and never answers is given
    up with a 504 after the stream's idle timeout (as one that stops sending mid-body is), not
    held open forever on a connection nobody will ever answer."""
    overrides = {
        "upstream.stream_idle_timeout_seconds": 1.0,
        "upstream.request_timeout_seconds": 30,
    }
    async with faulty_upstream(tmp_path, overrides) as f, aiohttp.ClientSession() as session:
        f.fake.store.create("pods", "default", pod("quiet"))
        async with session.get(f"{f.running.url}{PODS}/quiet") as got:
            assert got.status == 200  # its connection waits in the pool for the next request
        assert f.faults.freeze() >= 1  # ... and now swallows whatever is sent on it
        sent_at = time.monotonic()
        async with (
            asyncio.timeout(10),
            session.get(f"{f.running.url}{PODS}/quiet/log?follow=true") as response,
        ):
            assert response.status == 504, await response.text()
        assert 0.5 <= time.monotonic() - sent_at < 5
