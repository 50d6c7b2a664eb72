"""Identical consistent LISTs share one upstream LIST, and each still sees its own writes.

The fake apiserver holds LISTs at a gate the test opens (``faults.hold_lists``), so which
requests are in flight upstream is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
import socket
import tracemalloc
from typing import Any

import aiohttp
import pytest

from tests.component.test_http_protocol import Conn, request
from tests.component.test_pitfalls import pod
from tests.harness import running_proxy, wait_for

PODS = "/api/v1/namespaces/default/pods"


def names(body: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


async def test_lists_arriving_during_one_share_the_next_and_see_every_earlier_write(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        fake, metrics = running.fake, running.proxy.metrics.registry
        fake.store.create("pods", "default", pod("before"))

        async def list_pods() -> dict[str, Any]:
            async with session.get(running.url + PODS) as response:
                assert response.status == 200, await response.text()
                body: dict[str, Any] = await response.json()
                return body

        fake.faults.hold_lists(True)
        first = asyncio.ensure_future(list_pods())
        await wait_for(lambda: fake.faults.lists_held == 1, what="the first LIST upstream")
        # Written after the first LIST was sent: the requests below arrive after the write,
        # so their answer must include it although the first one's may not.
        fake.store.create("pods", "default", pod("after"))
        later = [asyncio.ensure_future(list_pods()) for _ in range(20)]
        await wait_for(
            lambda: (
                metrics.get_sample_value("watchproxy_requests_in_flight", {"kind": "request"}) == 21
            ),
            what="all 21 LISTs in watchproxy",
        )
        fake.faults.hold_lists(False)
        answers = await asyncio.gather(first, *later)
        assert all(names(body) == ["after", "before"] for body in answers[1:])
        assert "before" in names(answers[0])
        upstream = [r for r in fake.stats.requests if r.path == PODS and not r.watch]
        assert len(upstream) == 2  # the first, then one for the 20 that waited
        assert metrics.get_sample_value("watchproxy_list_batches_total") == 2
        assert metrics.get_sample_value("watchproxy_lists_batched_total") == 21


async def test_lists_that_differ_in_what_they_ask_are_not_batched(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        fake = running.fake
        fake.store.create("pods", "default", pod("a", app="web"))
        fake.store.create("pods", "default", pod("b", app="db"))
        fake.faults.hold_lists(True)
        urls = [PODS, PODS + "?labelSelector=app%3Dweb", PODS + "?limit=1"]
        calls = [asyncio.ensure_future(session.get(running.url + url)) for url in urls]
        await wait_for(lambda: fake.faults.lists_held == 3, what="three distinct LISTs upstream")
        fake.faults.hold_lists(False)
        bodies = []
        for call in calls:
            async with await call as response:
                bodies.append(await response.json())
        assert [names(b) for b in bodies] == [["a", "b"], ["a"], ["a"]]
        assert bodies[2]["metadata"]["continue"]


def big_configmap(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"v": name * 4000}}


@pytest.mark.parametrize("connection", ["keep-alive", "close"], ids=["fast-lane", "aiohttp"])
async def test_a_batch_too_big_to_hold_is_streamed_to_its_members_from_its_one_upstream_list(
    tmp_path: Any, connection: str
) -> None:
    """A batch whose answer outgrows ``limits.list_batch_max_bytes`` hands what it read, and
    then the rest as it arrives, to every member: no member sends its LIST again."""
    overrides = {"limits.list_batch_max_bytes": 64 * 1024}
    async with (
        running_proxy(tmp_path, overrides) as running,
        aiohttp.ClientSession() as session,
    ):
        fake, metrics = running.fake, running.proxy.metrics.registry
        for i in range(60):  # about 1.2 MB of JSON: past the batch's limit
            fake.store.create("configmaps", "default", big_configmap(f"cm-{i:02}"))
        url = running.url + "/api/v1/namespaces/default/configmaps"
        # Served alike whether the connection stays open or closes after the answer.
        headers = {"Accept-Encoding": "identity", "Connection": connection}

        def lists_upstream() -> int:
            return len(
                [r for r in fake.stats.requests if r.path.endswith("/configmaps") and not r.watch]
            )

        async def list_names() -> list[str]:
            async with session.get(url, headers=headers) as response:
                assert response.status == 200, await response.text()
                return names(await response.json())

        expected = [f"cm-{i:02}" for i in range(60)]
        # One client alone: one upstream LIST, not a batch's and then its own.
        assert await list_names() == expected
        assert lists_upstream() == 1
        # One held LIST in flight, then three identical ones: they share the next batch.
        fake.faults.hold_lists(True)
        first = asyncio.ensure_future(list_names())
        await wait_for(lambda: fake.faults.lists_held == 1, what="the first LIST upstream")
        later = [asyncio.ensure_future(list_names()) for _ in range(3)]
        await wait_for(
            lambda: (
                metrics.get_sample_value("watchproxy_requests_in_flight", {"kind": "request"}) == 4
            ),
            what="all 4 LISTs in watchproxy",
        )
        fake.faults.hold_lists(False)
        assert await asyncio.gather(first, *later) == [expected] * 4
        assert lists_upstream() == 1 + 2  # before: 1 + 2 batches + 4 LISTs passed through
        assert metrics.get_sample_value("watchproxy_list_batches_streamed_total") == 3
        api = running.proxy.api
        assert api is not None and api.served == 5


async def slow_connection(port: int) -> Conn:
    """A raw keep-alive connection with a small receive buffer, so that what the client does
    not read waits in the proxy, not in the kernel."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return Conn(*await asyncio.open_connection(sock=sock))


async def counted_answer(conn: Conn) -> tuple[int, int]:
    """An answer's status and body length, its body read and dropped piece by piece (the
    clients' own copies must not count in the proxy's peak)."""
    status_line = await conn.reader.readline()
    headers = b""
    while (line := await conn.reader.readline()) != b"\r\n":
        headers += line.lower()
    length = 0
    if b"transfer-encoding: chunked" in headers:
        while size := int((await conn.reader.readline()).strip(), 16):
            while size:
                got = len(await conn.reader.read(min(size, 65536)))
                assert got, "the answer was cut"
                size -= got
                length += got
            await conn.reader.readexactly(2)
        await conn.reader.readexactly(2)
    else:
        (declared,) = [h for h in headers.split(b"\r\n") if h.startswith(b"content-length:")]
        remaining = int(declared.split(b":")[1])
        while remaining:
            got = len(await conn.reader.read(min(remaining, 65536)))
            assert got, "the answer was cut"
            remaining -= got
            length += got
    return int(status_line.split()[1]), length


async def batch_peak(tmp_path: Any, members: int) -> tuple[int, int]:
    """One held LIST, then ``members`` slow clients that share the next batch of an 8 MB
    collection and read nothing until the first LIST has been answered: the answer's size and
    the peak of what Python allocated meanwhile (tracemalloc; the fake apiserver runs in this
    process too, and its encoding of the answer counts the same in every run)."""
    async with running_proxy(tmp_path) as running:
        fake, metrics = running.fake, running.proxy.metrics.registry
        for i in range(200):  # 200 x 40 KB
            obj = {"metadata": {"name": f"cm-{i:03}"}, "data": {"v": "x" * 40_000}}
            fake.store.create("configmaps", "default", obj)
        ask = request("GET", "/api/v1/namespaces/default/configmaps", Accept_Encoding="identity")
        first = await Conn.open(running.proxy.api_port)
        fake.faults.hold_lists(True)
        first.send(ask)
        await wait_for(lambda: fake.faults.lists_held == 1, what="the first LIST upstream")
        slow = [await slow_connection(running.proxy.api_port) for _ in range(members)]
        try:
            for conn in slow:
                conn.send(ask)
            await wait_for(
                lambda: (
                    metrics.get_sample_value("watchproxy_requests_in_flight", {"kind": "request"})
                    == members + 1
                ),
                what="all LISTs in watchproxy",
            )
            tracemalloc.start()
            try:
                fake.faults.hold_lists(False)
                status, _, body = await first.answer()
                assert status == 200
                size = len(body)
                del body
                await wait_for(
                    lambda: (
                        metrics.get_sample_value("watchproxy_lists_batched_total") == members + 1
                    ),
                    what="the batch answered",
                )
                # Then they all read at once: the batch moves at the pace of the slowest,
                # holding at most its window (one at a time would wait for the others, and be
                # cut).
                answers = await asyncio.gather(*(counted_answer(conn) for conn in slow))
                assert answers == [(200, size)] * members
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        finally:
            # Closed also when an assertion failed: a connection left open with megabytes
            # unread keeps the event loop's close waiting, and the worker hangs.
            for conn in [first, *slow]:
                conn.close()
    return size, peak


async def test_slow_members_of_a_batch_cost_a_window_each_not_a_copy_of_the_answer(
    tmp_path: Any,
) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "six").mkdir()
    size, alone = await batch_peak(tmp_path / "one", 1)
    _, six = await batch_peak(tmp_path / "six", 6)
    print(f"answer {size / 2**20:.1f} MiB; peak with 1 slow member {alone / 2**20:.1f} MiB,")
    print(f"with 6 {six / 2**20:.1f} MiB: {(six - alone) / 5 / 2**20:.2f} MiB per extra member")
    # Five more members, each a window (a piece of the answer in its socket's buffer), not a
    # copy of the answer: together less than one answer.
    assert six - alone < size, (size, alone, six)


async def read_answer(reader: asyncio.StreamReader) -> tuple[list[bytes], bytes]:
    """An answer with a Content-Length: its head's field lines as they came, and its body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.split(b"\r\n")[:-2]
    lengths = [line for line in lines if line.lower().startswith(b"content-length:")]
    assert len(lengths) == 1, lines
    body = await asyncio.wait_for(reader.readexactly(int(lengths[0].split(b":", 1)[1])), 10)
    return lines, body


def comparable(lines: list[bytes]) -> list[bytes]:
    """Field lines with the values that differ from answer to answer left out."""
    varying = (b"date:", b"audit-id:")
    return [line.split(b":")[0] if line.lower().startswith(varying) else line for line in lines]


async def test_a_batched_lists_answer_goes_on_with_the_apiservers_head_as_it_came(
    tmp_path: Any,
) -> None:
    """Nothing in the fake apiserver's head is hop-by-hop, so a batched LIST's member whose
    connection stays open gets that head byte for byte (``lists.batch.BatchAnswer.raw_head``), the
    field order included; one whose answer closes its connection gets it rebuilt, with
    ``Connection: close`` and its own Content-Length."""
    async with running_proxy(tmp_path) as running:
        fake, metrics = running.fake, running.proxy.metrics.registry
        fake.store.create("pods", "default", pod("p"))
        get = f"GET {PODS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n"
        reader, writer = await asyncio.open_connection(
            fake.host, fake.port, ssl=fake.client_ssl_context()
        )
        writer.write(f"{get}Authorization: Bearer {fake.token}\r\n\r\n".encode())
        direct, direct_body = await read_answer(reader)
        writer.close()
        batched_before = metrics.get_sample_value("watchproxy_lists_batched_total") or 0
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        try:
            for _ in range(2):  # the second on the same connection
                writer.write(f"{get}\r\n".encode())
                lines, body = await read_answer(reader)
                assert comparable(lines) == comparable(direct)
                assert body == direct_body
            writer.write(f"{get}Connection: close\r\n\r\n".encode())
            lines, body = await read_answer(reader)
            assert b"Connection: close" in lines
            assert sorted(comparable(lines)) == sorted([*comparable(direct), b"Connection: close"])
            assert body == direct_body
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, as it said
        finally:
            writer.close()
        batched = metrics.get_sample_value("watchproxy_lists_batched_total") or 0
        assert batched - batched_before == 3
