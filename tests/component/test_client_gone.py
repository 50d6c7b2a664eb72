"""Every upstream request ends within a second of its client going, while upstream is quiet.

Each test opens one long-running request through watchproxy with a raw socket, waits until the
fake apiserver is serving it and has nothing more to say (no event, no log line, a LIST held
before its first byte), then closes the socket. Within ``WITHIN`` seconds the fake's own count
of requests it is still serving, and watchproxy's in-flight gauges, are back where they were:
no upstream byte was needed for watchproxy to notice. A shared watch's last client leaving ends
the upstream watch after ``hub.linger_seconds`` and no later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubefake import FakeApiServer
from tests.component.test_upgrade_faults import ExecClient
from tests.harness import Running, running_proxy, wait_for
from watchproxy.server.upgrade import HALF_CLOSED_IDLE

PODS = "/api/v1/namespaces/default/pods"
WITHIN = 1.0
LINGER = 0.5  # tests.harness.make_config's hub.linger_seconds

JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf, application/json"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"
METADATA = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, "
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
)


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}


@contextlib.asynccontextmanager
async def quiet_proxy(
    tmp_path: Any, overrides: dict[str, Any] | None = None
) -> AsyncIterator[Running]:
    # Log follows write one line and then nothing for an hour: a silent container.
    async with FakeApiServer(bookmark_interval=0.5, log_interval=3600) as fake:
        fake.store.create("pods", "default", pod("web-0"))
        async with running_proxy(tmp_path, overrides, fake=fake) as running:
            yield running


class RawClient:
    """One HTTP/1.1 request on its own connection, read as far as the test says, then closed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def send(cls, port: int, path: str, *, accept: str = JSON) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n\r\n".encode())
        return cls(reader, writer)

    async def head(self) -> bytes:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head
        return head

    async def some_body(self) -> bytes:
        data = await asyncio.wait_for(self.reader.read(65536), 10)
        assert data, "the stream ended before its first byte"
        return data

    async def leave(self) -> float:
        """Close the connection (a FIN); returns when it was closed."""
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
        return time.monotonic()


def in_flight(running: Running, kind: str) -> float:
    value = running.proxy.metrics.registry.get_sample_value(
        "watchproxy_requests_in_flight", {"kind": kind}
    )
    return value or 0.0  # None: no request of this kind yet


async def assert_all_ended(running: Running, left_at: float, *, within: float = WITHIN) -> None:
    """The fake serves nothing and watchproxy has no request in flight, ``within`` s of
    ``left_at``."""
    remaining = max(0.0, left_at + within - time.monotonic())
    try:
        await running.fake.stats.wait_until(lambda s: s.in_flight == 0, within=remaining)
    except TimeoutError:
        raise AssertionError(
            f"the fake still serves {running.fake.stats.in_flight} request(s) "
            f"{within} s after the client left"
        ) from None
    took = time.monotonic() - left_at
    await wait_for(
        lambda: in_flight(running, "stream") == 0 and in_flight(running, "request") == 0,
        timeout=max(0.05, left_at + within - time.monotonic()),
        what="watchproxy's in-flight gauges at 0",
    )
    assert took <= within, took


PASSTHROUGH_WATCHES = {
    "json": JSON,
    "protobuf": PROTOBUF,
    "table": TABLE,
    "metadata": METADATA,
}


@pytest.mark.parametrize("accept", PASSTHROUGH_WATCHES.values(), ids=PASSTHROUGH_WATCHES.keys())
async def test_a_quiet_passthrough_watch_ends_upstream_when_its_client_leaves(
    tmp_path: Any, accept: str
) -> None:
    # hub.enabled false: every watch is passed through, whatever its representation.
    async with quiet_proxy(tmp_path, {"hub.enabled": False}) as running:
        client = await RawClient.send(
            running.proxy.api_port, PODS + "?watch=true&resourceVersion=0", accept=accept
        )
        await client.head()
        await client.some_body()  # the initial ADDED; then the watch is quiet
        await running.fake.stats.wait_until(lambda s: s.active_watches == 1)
        assert in_flight(running, "stream") == 1
        left_at = await client.leave()
        await assert_all_ended(running, left_at)


async def test_a_watch_the_hub_does_not_share_ends_upstream_when_its_client_leaves(
    tmp_path: Any,
) -> None:
    # The legacy /watch/ path is never shared: the hub passes it through as it is.
    async with quiet_proxy(tmp_path) as running:
        client = await RawClient.send(
            running.proxy.api_port, "/api/v1/watch/namespaces/default/pods", accept=METADATA
        )
        await client.head()
        await client.some_body()
        await running.fake.stats.wait_until(lambda s: s.active_watches == 1)
        left_at = await client.leave()
        await assert_all_ended(running, left_at)


async def test_a_quiet_log_follow_ends_upstream_when_its_client_leaves(tmp_path: Any) -> None:
    async with quiet_proxy(tmp_path) as running:
        client = await RawClient.send(
            running.proxy.api_port, PODS + "/web-0/log?follow=true", accept="*/*"
        )
        await client.head()
        assert b"log line 1" in await client.some_body()
        assert running.fake.stats.in_flight == 1
        left_at = await client.leave()
        await assert_all_ended(running, left_at)


async def test_a_list_the_apiserver_has_not_answered_ends_when_its_client_leaves(
    tmp_path: Any,
) -> None:
    # Passed through on its own: no batching, no answer from a shared watch.
    overrides = {"limits.list_batch_max_bytes": 0, "hub.consistent_list_wait_seconds": 0}
    async with quiet_proxy(tmp_path, overrides) as running:
        running.fake.faults.hold_lists(True)
        client = await RawClient.send(running.proxy.api_port, PODS)
        await wait_for(lambda: running.fake.faults.lists_held == 1, what="the LIST upstream")
        left_at = await client.leave()
        try:
            await assert_all_ended(running, left_at)
        finally:
            running.fake.faults.hold_lists(False)


async def test_a_batched_list_whose_only_client_left_ends_upstream(tmp_path: Any) -> None:
    async with quiet_proxy(tmp_path, {"hub.consistent_list_wait_seconds": 0}) as running:
        running.fake.faults.hold_lists(True)
        client = await RawClient.send(running.proxy.api_port, PODS)
        await wait_for(lambda: running.fake.faults.lists_held == 1, what="the LIST upstream")
        left_at = await client.leave()
        try:
            await assert_all_ended(running, left_at)
        finally:
            running.fake.faults.hold_lists(False)


async def test_a_quiet_exec_session_ends_upstream_when_its_client_leaves(tmp_path: Any) -> None:
    async with quiet_proxy(tmp_path) as running:
        running.fake.store.create("pods", "default", pod("shell"))
        client = await ExecClient.open(running.proxy.api_port)
        assert await client.echo(b"hello") == b"hello"
        assert running.fake.stats.in_flight == 1
        client.close()
        left_at = time.monotonic()
        # Its FIN may be a half-close (Go's clients send one at a session's end and keep
        # reading): the relay waits for the apiserver's end or HALF_CLOSED_IDLE of quiet.
        await assert_all_ended(running, left_at, within=HALF_CLOSED_IDLE + WITHIN)


async def test_a_shared_watch_ends_upstream_one_linger_after_its_last_client_leaves(
    tmp_path: Any,
) -> None:
    async with quiet_proxy(tmp_path) as running:
        clients = [
            await RawClient.send(running.proxy.api_port, PODS + "?watch=true") for _ in range(2)
        ]
        for client in clients:
            await client.head()
            await client.some_body()
        assert [w["subscribers"] for w in running.proxy.debug_watches()] == [2]
        await clients[0].leave()
        await wait_for(
            lambda: [w["subscribers"] for w in running.proxy.debug_watches()] == [1],
            timeout=WITHIN,
            what="the first client's subscription to end",
        )
        left_at = await clients[1].leave()
        await assert_all_ended(running, left_at, within=LINGER + WITHIN)
        assert running.proxy.debug_watches() == []
