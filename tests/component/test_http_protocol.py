"""The API port's one protocol, on real sockets: every kind of request (one-shot, LIST, watch)
answered on one keep-alive connection, in order, pipelined or not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.harness import running_proxy, wait_for

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


class Conn:
    """One raw keep-alive connection to the API port."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, *requests: bytes) -> None:
        self.writer.write(b"".join(requests))

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        """One whole answer: status, headers (lower-case names), body (chunks joined)."""
        status_line = await asyncio.wait_for(self.reader.readline(), 10)
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        headers: dict[str, str] = {}
        while (line := await asyncio.wait_for(self.reader.readline(), 10)) != b"\r\n":
            assert line, "connection closed inside a head"
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            parts = []
            while size := int((await self.reader.readline()).strip(), 16):
                parts.append(await self.reader.readexactly(size))
                assert await self.reader.readexactly(2) == b"\r\n"
            assert await self.reader.readexactly(2) == b"\r\n"
            body = b"".join(parts)
        else:
            body = b""
        return int(status_line.split()[1]), headers, body

    def close(self) -> None:
        self.writer.close()


def request(method: str, target: str, body: bytes | None = None, **headers: str) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "User-Agent: fast-lane-test"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def configmap(name: str, **data: str) -> bytes:
    return json.dumps({"metadata": {"name": name}, "data": data}).encode()


async def test_one_shot_list_and_watch_requests_share_one_connection_in_order(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running:
        lane = running.proxy.api
        assert lane is not None
        conn = await Conn.open(running.proxy.api_port)
        try:
            conn.send(request("POST", CONFIGMAPS, configmap("one", a="1")))
            status, _, body = await conn.answer()
            assert status == 201 and json.loads(body)["metadata"]["name"] == "one"
            assert lane.served == 1
            # A LIST, served here whether the hub, the batcher or the apiserver answers it.
            conn.send(request("GET", CONFIGMAPS))
            status, _, body = await conn.answer()
            assert status == 200 and [i["metadata"]["name"] for i in json.loads(body)["items"]]
            assert lane.served == 2
            patch = json.dumps({"data": {"a": "2"}}).encode()
            conn.send(
                request("PATCH", CONFIGMAPS + "/one", patch).replace(
                    b"application/json", b"application/merge-patch+json"
                )
            )
            status, _, body = await conn.answer()
            assert status == 200 and json.loads(body)["data"] == {"a": "2"}
            assert lane.served == 3
            # A watch, then a GET, on the same connection.
            conn.send(request("GET", CONFIGMAPS + "?watch=1&timeoutSeconds=1"))
            status, headers, body = await conn.answer()
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            conn.send(request("GET", CONFIGMAPS + "/one"))
            status, _, body = await conn.answer()
            assert status == 200 and json.loads(body)["data"] == {"a": "2"}
            assert lane.served == 5
        finally:
            conn.close()


async def test_pipelined_requests_are_answered_in_the_order_sent(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running:
        running.fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        running.fake.store.create("configmaps", "default", {"metadata": {"name": "b"}})
        conn = await Conn.open(running.proxy.api_port)
        try:
            # Two plain requests in one write, then one behind a watch.
            conn.send(request("GET", CONFIGMAPS + "/a"), request("GET", CONFIGMAPS + "/b"))
            names = [json.loads((await conn.answer())[2])["metadata"]["name"] for _ in "ab"]
            assert names == ["a", "b"]
            watch = request("GET", CONFIGMAPS + "?watch=1&timeoutSeconds=1")
            conn.send(watch, request("GET", CONFIGMAPS + "/b"))
            status, headers, body = await conn.answer()
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            status, _, body = await conn.answer()
            assert status == 200 and json.loads(body)["metadata"]["name"] == "b"
        finally:
            conn.close()


async def test_a_chunked_body_is_served_and_its_answer_closes_the_connection(
    tmp_path: Any,
) -> None:
    """A chunked body's request is the last on its connection: no trailer field can ever
    become another request's header, whatever the parser does with trailers."""
    async with running_proxy(tmp_path) as running:
        lane = running.proxy.api
        assert lane is not None
        conn = await Conn.open(running.proxy.api_port)
        try:
            body = configmap("chunked", k="v")
            head = request("POST", CONFIGMAPS).replace(
                b"\r\n\r\n",
                b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            )
            conn.send(head, b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
            status, headers, answer = await conn.answer()
            assert status == 201 and json.loads(answer)["metadata"]["name"] == "chunked"
            assert headers.get("connection", "").lower() == "close", headers
            assert await asyncio.wait_for(conn.reader.read(), 5) == b""
            assert lane.served == 1
        finally:
            conn.close()


async def test_a_large_answer_is_relayed_whole_at_the_clients_pace(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running:
        big = "x" * 900_000
        running.fake.store.create(
            "configmaps", "default", {"metadata": {"name": "big"}, "data": {"k": big}}
        )
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", running.proxy.api_port, limit=2**16
        )
        conn = Conn(reader, writer)
        try:
            conn.send(request("GET", CONFIGMAPS + "/big"))
            await asyncio.sleep(0)  # the client reads nothing yet: the proxy must wait for it
            status, headers, body = await conn.answer()
            assert status == 200 and json.loads(body)["data"]["k"] == big
            assert int(headers.get("content-length", len(body))) == len(body)
            assert running.proxy.api is not None and running.proxy.api.served == 1
        finally:
            conn.close()


async def test_an_unreachable_apiserver_is_a_status(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running:
        lane = running.proxy.api
        assert lane is not None
        await running.fake.stop()
        conn = await Conn.open(running.proxy.api_port)
        try:
            conn.send(request("GET", CONFIGMAPS + "/gone"))
            status, headers, body = await conn.answer()
            assert status == 503 and headers["content-type"] == "application/json"
            assert json.loads(body)["kind"] == "Status" and lane.served == 1
        finally:
            conn.close()


async def test_shutdown_lets_a_request_in_flight_finish(tmp_path: Any) -> None:
    # A LIST neither the hub nor the batcher answers is a plain pass-through.
    overrides = {"limits.list_batch_max_bytes": 0, "hub.consistent_list_wait_seconds": 0}
    async with running_proxy(tmp_path, overrides) as running:
        running.fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        conn = await Conn.open(running.proxy.api_port)
        running.fake.faults.hold_lists(True)
        try:
            conn.send(request("GET", CONFIGMAPS + "?limit=1"))
            await wait_for(lambda: running.fake.faults.lists_held == 1, what="the LIST upstream")
            stopping = asyncio.create_task(running.proxy.stop())
            await wait_for(
                lambda: running.proxy.api is not None and running.proxy.api.draining,
                what="draining",
            )
            running.fake.faults.hold_lists(False)
            status, headers, body = await conn.answer()
            assert status == 200 and json.loads(body)["items"]
            assert headers.get("connection") == "close"
            assert running.proxy.api.served == 1
            await stopping
        finally:
            running.fake.faults.hold_lists(False)
            conn.close()


async def test_a_body_slower_than_the_head_deadline_is_not_a_slow_head(tmp_path: Any) -> None:
    async with running_proxy(tmp_path, {"limits.header_timeout_seconds": 0.3}) as running:
        lane = running.proxy.api
        assert lane is not None
        conn = await Conn.open(running.proxy.api_port)
        try:
            whole = request("POST", CONFIGMAPS, configmap("slow", k="v"))
            cut = whole.index(b"\r\n\r\n") + 4
            conn.send(whole[:cut])
            await conn.writer.drain()
            # The body comes after the head deadline: the deadline was for the head only.
            await asyncio.sleep(0.5)
            conn.send(whole[cut:])
            status, _, body = await conn.answer()
            assert status == 201 and json.loads(body)["metadata"]["name"] == "slow"
            assert lane.served == 1
        finally:
            conn.close()


async def test_a_remembered_admission_is_never_an_impersonating_requests(tmp_path: Any) -> None:
    """The route is remembered per (method, target, Host): a request that asks to
    act as someone else is judged afresh (refused by default, nothing sent upstream), and a
    Host that is not allowed is refused though the same target was just served."""
    async with running_proxy(tmp_path) as running:
        lane = running.proxy.api
        assert lane is not None
        conn = await Conn.open(running.proxy.api_port)
        try:
            for _ in range(2):  # the second is answered from the remembered admission
                conn.send(request("GET", CONFIGMAPS))
                status, _, _ = await conn.answer()
                assert status == 200
            assert lane.served == 2
            running.fake.stats.reset()
            conn.send(request("GET", CONFIGMAPS, Impersonate_User="system:admin"))
            status, _, body = await conn.answer()
            assert status == 403 and "Impersonate-User" in json.loads(body)["message"]
            assert not [r for r in running.fake.stats.requests if r.path == CONFIGMAPS]
        finally:
            conn.close()
        stranger = await Conn.open(running.proxy.api_port)
        try:
            stranger.send(request("GET", CONFIGMAPS).replace(b"127.0.0.1", b"evil.example", 1))
            status, _, _ = await stranger.answer()
            assert status == 403
        finally:
            stranger.close()


async def test_one_server_task_serves_a_connection_and_ends_with_it(tmp_path: Any) -> None:
    """A keep-alive connection's requests are served in turn by one task of its own,
    woken for each (not a task per request); it ends when the connection does, and the proxy's
    stop leaves none behind, idle or not."""
    async with running_proxy(tmp_path) as running:
        running.fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        guard = running.proxy.guard
        assert guard is not None
        first, second = (
            await Conn.open(running.proxy.api_port),
            await Conn.open(running.proxy.api_port),
        )
        try:
            for _ in range(5):
                for conn in (first, second):
                    conn.send(request("GET", CONFIGMAPS + "/a"))
                    status, _, body = await conn.answer()
                    assert status == 200 and json.loads(body)["metadata"]["name"] == "a"
            tasks = set(guard.tasks)
            assert len(tasks) == 2 and not guard.busy  # one each, both idle now
            first.close()
            await wait_for(lambda: len(guard.tasks) == 1, what="the first's task")
            assert all(task.done() and not task.cancelled() for task in tasks - guard.tasks)
            second.send(request("GET", CONFIGMAPS + "/a"))
            assert (await second.answer())[0] == 200
            await running.proxy.stop()
            assert not guard.tasks and all(task.done() for task in tasks)
        finally:
            first.close()
            second.close()
