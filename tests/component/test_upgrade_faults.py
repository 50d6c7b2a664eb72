"""The upgrade relay under TCP faults, driven by a minimal SPDY/3.1 exec client.

watchproxy -> FaultProxy -> fake apiserver (kubefake/spdyserver.py runs ``cat``). What is pinned:
bytes cross the relay unchanged in both directions, with backpressure; an upstream reset ends
the client's stream at once and leaves the proxy up; a client that goes away closes its
upstream connection; an upgrade the apiserver cannot take gets a Status, not a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import Any

import pytest

from kubefake.spdy import (
    SYN_REPLY,
    SYN_STREAM,
    ControlFrame,
    DataFrame,
    FrameReader,
    HeaderCodec,
    encode_control,
    encode_data,
    syn_stream_payload,
)
from tests.faultproxy import faulty_upstream
from tests.harness import wait_for

ERROR, STDIN, STDOUT = 1, 3, 5


class Refused(Exception):
    def __init__(self, head: bytes, body: bytes) -> None:
        super().__init__(head.decode("latin-1"))
        self.status = int(head.split(b" ", 2)[1])
        self.body = body


class ExecClient:
    """``cat`` in pod ``shell`` over SPDY: stdin written, stdout read back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames = FrameReader()
        self.pending: list[ControlFrame | DataFrame] = []

    @classmethod
    async def open(cls, port: int) -> ExecClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /api/v1/namespaces/default/pods/shell/exec?command=cat&stdin=true&stdout=true"
            b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
        )
        client = cls(reader, writer)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if not head.startswith(b"HTTP/1.1 101"):
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            body = await reader.readexactly(length)
            client.close()
            raise Refused(head, body)
        assert b"x-stream-protocol-version: v4.channel.k8s.io" in head.lower()
        codec = HeaderCodec()
        for stream_id, kind in ((ERROR, "error"), (STDIN, "stdin"), (STDOUT, "stdout")):
            payload = syn_stream_payload(codec, stream_id, {"streamtype": kind})
            writer.write(encode_control(SYN_STREAM, 0, payload))
        replies = [f for f in await client.read_frames(3) if isinstance(f, ControlFrame)]
        assert [f.type for f in replies] == [SYN_REPLY] * 3
        return client

    async def read_frames(self, count: int) -> list[ControlFrame | DataFrame]:
        async with asyncio.timeout(10):
            while len(self.pending) < count:
                data = await self.reader.read(65536)
                if not data:
                    raise EOFError("the relay closed the stream")
                self.pending.extend(self.frames.feed(data))
        frames, self.pending = self.pending[:count], self.pending[count:]
        return frames

    async def echo(self, payload: bytes) -> bytes:
        for start in range(0, len(payload), 16384):
            self.writer.write(encode_data(STDIN, payload[start : start + 16384]))
        got = bytearray()
        async with asyncio.timeout(20):
            while len(got) < len(payload):
                (frame,) = await self.read_frames(1)
                if isinstance(frame, DataFrame) and frame.stream_id == STDOUT:
                    got += frame.data
        return bytes(got)

    def close(self) -> None:
        self.writer.close()


@contextlib.asynccontextmanager
async def shell(tmp_path: Any) -> Any:
    async with faulty_upstream(tmp_path) as f:
        f.fake.store.create(
            "pods",
            "default",
            {"metadata": {"name": "shell"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        )
        yield f


async def test_spdy_exec_bytes_cross_the_relay_unchanged(tmp_path: Any) -> None:
    async with shell(tmp_path) as f:
        client = await ExecClient.open(f.running.proxy.api_port)
        try:
            # 2 MiB: far past the relay's client buffer, so its reads pause and resume.
            payload = os.urandom(2 * 1024 * 1024)
            assert await client.echo(payload) == payload
            client.writer.write(encode_data(STDIN, b"", fin=True))
            frames = await client.read_frames(2)  # the Status on the error stream, its FIN
            status = b"".join(fr.data for fr in frames if isinstance(fr, DataFrame))
            assert json.loads(status)["status"] == "Success"
        finally:
            client.close()


async def test_a_client_half_close_still_gets_every_byte_the_upstream_sends_after_it(
    tmp_path: Any,
) -> None:
    """A client that shuts down its sending side (TCP FIN) keeps reading: what the apiserver
    sends after that reaches it. Found on a real kubelet (tests/realnode/test_streams.py): the
    relay took the client's FIN for the end of the session and cut the tail of a large exec
    output (kubectl 1.27 exited 0 with it missing; 1.37 got a WebSocket 1006)."""
    async with shell(tmp_path) as f:
        client = await ExecClient.open(f.running.proxy.api_port)
        try:
            payload = os.urandom(1024 * 1024)
            for start in range(0, len(payload), 16384):
                client.writer.write(encode_data(STDIN, payload[start : start + 16384]))
            client.writer.write(encode_data(STDIN, b"", fin=True))
            client.writer.write_eof()
            got = bytearray()
            async with asyncio.timeout(20):
                while len(got) < len(payload):
                    (frame,) = await client.read_frames(1)
                    if isinstance(frame, DataFrame) and frame.stream_id == STDOUT:
                        got += frame.data
            assert bytes(got) == payload
            frames = await client.read_frames(2)  # the Status on the error stream, its FIN
            status = b"".join(fr.data for fr in frames if isinstance(fr, DataFrame))
            assert json.loads(status)["status"] == "Success"
        finally:
            client.close()


async def test_an_upstream_reset_ends_the_client_stream_and_the_proxy_stays_up(
    tmp_path: Any,
) -> None:
    async with shell(tmp_path) as f:
        client = await ExecClient.open(f.running.proxy.api_port)
        try:
            assert await client.echo(b"before") == b"before"
            assert f.faults.reset_all() >= 1
            with pytest.raises((EOFError, ConnectionError)):
                await client.echo(b"after")
        finally:
            client.close()
        assert f.running.proxy.connectivity.up
        again = await ExecClient.open(f.running.proxy.api_port)
        try:
            assert await again.echo(b"a new session") == b"a new session"
        finally:
            again.close()


async def test_a_client_that_goes_away_closes_its_upstream_connection(tmp_path: Any) -> None:
    async with shell(tmp_path) as f:
        before = f.faults.open_links
        client = await ExecClient.open(f.running.proxy.api_port)
        assert await client.echo(b"hello") == b"hello"
        assert f.faults.open_links == before + 1
        client.close()
        await wait_for(lambda: f.faults.open_links == before, what="the upstream side to close")


@pytest.mark.parametrize("fault", ["reset", "blackhole", "truncate"])
async def test_an_upgrade_the_apiserver_cannot_take_gets_a_status(
    tmp_path: Any, fault: str
) -> None:
    overrides = {"upstream.connect_timeout_seconds": 1, "upstream.request_timeout_seconds": 1}
    async with faulty_upstream(tmp_path, overrides) as f:
        if fault == "truncate":
            f.faults.truncate_next(1)
        else:
            f.faults.mode = fault
        with pytest.raises(Refused) as refused:
            await ExecClient.open(f.running.proxy.api_port)
        status = json.loads(refused.value.body)
        assert (refused.value.status, status["kind"]) == (503, "Status"), status
        assert "the apiserver did not answer" in status["message"]


async def test_a_proxy_stopping_ends_an_open_session_and_closes_both_sides(tmp_path: Any) -> None:
    async with shell(tmp_path) as f:
        client = await ExecClient.open(f.running.proxy.api_port)
        try:
            assert await client.echo(b"before the stop") == b"before the stop"
            links = f.faults.open_links
            # Sessions are ended at once, not after half the shutdown grace (2.5 s of 5 s).
            async with asyncio.timeout(1.5):
                await f.running.proxy.stop()
            with pytest.raises((EOFError, ConnectionError)):
                await client.echo(b"after")
            await wait_for(lambda: f.faults.open_links < links, what="the upstream side to close")
        finally:
            client.close()
