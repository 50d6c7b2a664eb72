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
import socket
import ssl
import struct
import threading
import time
from typing import Any

import pytest

from kubefake.spdy import (
    SYN_REPLY,
    SYN_STREAM,
    WINDOW_UPDATE,
    ControlFrame,
    DataFrame,
    FrameReader,
    HeaderCodec,
    encode_control,
    encode_data,
    syn_stream_payload,
)
from kubefake.tls import make_server_tls
from tests.faultproxy import faulty_upstream
from tests.harness import proxy_for_upstream, running_proxy, wait_for

ERROR, STDIN, STDOUT = 1, 3, 5
CAT_STREAMS = ((ERROR, "error"), (STDIN, "stdin"), (STDOUT, "stdout"))


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
    async def open(
        cls,
        port: int,
        command: tuple[str, ...] = ("cat",),
        kinds: tuple[tuple[int, str], ...] = (
            (ERROR, "error"),
            (STDIN, "stdin"),
            (STDOUT, "stdout"),
        ),
        *,
        receive_buffer: int = 0,
    ) -> ExecClient:
        """``receive_buffer``: the socket's SO_RCVBUF, set before it connects (0: the default)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        query = "&".join(f"command={part}" for part in command)
        query += "".join(f"&{kind}=true" for _, kind in kinds if kind != "error")
        writer.write(
            f"POST /api/v1/namespaces/default/pods/shell/exec?{query} HTTP/1.1\r\n".encode()
            + b"Host: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
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
        for stream_id, kind in kinds:
            payload = syn_stream_payload(codec, stream_id, {"streamtype": kind})
            writer.write(encode_control(SYN_STREAM, 0, payload))
        replies = [f for f in await client.read_frames(len(kinds)) if isinstance(f, ControlFrame)]
        assert [f.type for f in replies] == [SYN_REPLY] * len(kinds)
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


async def test_a_slow_reader_gets_the_whole_tail_after_the_apiserver_ended_the_session(
    tmp_path: Any,
) -> None:
    """The apiserver ends a session as soon as the kubelet does, with megabytes still on their
    way to a client that reads slowly and keeps sending while it reads (spdystream's
    WINDOW_UPDATEs, client-go's WebSocket pings). The relay must not close its socket to the
    client while that client is still reading: a byte the client sends to a closed socket
    makes the kernel answer with a reset, and the reset drops what the relay's kernel still
    had to send. Found on a real kubelet (tests/realnode/test_streams.py): the tail of a
    2.9 MB `seq` went missing in about 1 session of 20 (kubectl 1.37: WebSocket 1006, 1.27:
    exit 0 with the output cut)."""
    last = 400_000
    expected = b"".join(b"%d\n" % i for i in range(1, last + 1))  # 2.9 MB, as on the node
    async with running_proxy(tmp_path) as running:
        running.fake.store.create(
            "pods",
            "default",
            {"metadata": {"name": "shell"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        )
        # A small receive buffer: the tail waits in the relay's send queue, not in ours.
        client = await ExecClient.open(
            running.proxy.api_port,
            ("seq", "1", str(last)),
            ((ERROR, "error"), (STDOUT, "stdout")),
            receive_buffer=32 * 1024,
        )
        got, status, started = bytearray(), b"", time.monotonic()
        reset: ConnectionError | None = None
        try:
            async with asyncio.timeout(60):
                while True:
                    try:
                        data = await client.reader.read(16 * 1024)
                    except ConnectionResetError as error:
                        reset = error
                        break
                    if not data:
                        break
                    for frame in client.frames.feed(data):
                        if isinstance(frame, DataFrame) and frame.stream_id == STDOUT:
                            got += frame.data
                        elif isinstance(frame, DataFrame) and frame.stream_id == ERROR:
                            status += frame.data
                    # What a Go client sends while it reads: a window update per read.
                    update = struct.pack(">II", STDOUT, len(data))
                    client.writer.write(encode_control(WINDOW_UPDATE, 0, update))
                    await asyncio.sleep(0.02)  # a slow reader: about 800 kB/s
        finally:
            client.close()
        took = time.monotonic() - started
        assert reset is None and len(got) == len(expected), (reset, len(got), f"{took:.1f} s")
        assert bytes(got) == expected
        assert json.loads(status)["status"] == "Success"


class GoLikeApiserver:
    """An apiserver reduced to how Go's TLS server ends an upgraded connection: every upgrade
    request is answered with a 101 and ``payload``, then close_notify and the FIN at once,
    without waiting for anything from the client (the apiserver closes a session's connection
    as soon as the kubelet ends the session). Every other request gets a 200. Blocking sockets
    in threads: its writes are done when the kernel has the bytes, whatever the test's loop
    does."""

    def __init__(self, directory: str, payload: bytes, *, hold: bool = False) -> None:
        """``hold``: after ``payload``, keep the session open and silent, whatever the client
        sends (its close_notify too), until the server stops."""
        self.payload = payload
        self.hold = hold
        tls = make_server_tls(directory)
        self.context, self.ca_path = tls.context, tls.ca_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.upgrades = 0

    def kubeconfig(self, path: str) -> str:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "go",
                            "cluster": {
                                "server": f"https://127.0.0.1:{self.port}",
                                "certificate-authority": self.ca_path,
                            },
                        }
                    ],
                    "users": [{"name": "go", "user": {"token": "t"}}],
                    "contexts": [{"name": "go", "context": {"cluster": "go", "user": "go"}}],
                    "current-context": "go",
                },
                out,
            )
        return path

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                raw, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        with contextlib.suppress(OSError), self.context.wrap_socket(raw, server_side=True) as conn:
            buffered = b""
            while not self.stopping.is_set():
                while b"\r\n\r\n" not in buffered:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                if b"\nupgrade:" not in head.lower():
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                self.upgrades += 1
                conn.sendall(
                    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                    b"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
                    + self.payload
                )
                if self.hold:
                    self.stopping.wait()
                # close_notify without waiting for the client's, then the FIN: Go's Close.
                conn.setblocking(False)
                with contextlib.suppress(ssl.SSLError):
                    conn.unwrap()
                return

    @contextlib.contextmanager
    def serving(self) -> Any:
        accepter = threading.Thread(target=self._accept, daemon=True)
        accepter.start()
        try:
            yield self
        finally:
            self.stopping.set()
            accepter.join(5)
            for thread in self.threads:
                thread.join(5)
            self.listener.close()


def sockets_to(port: int) -> int:
    """This process's open sockets whose peer is 127.0.0.1:``port`` (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    with open("/proc/net/tcp", encoding="ascii") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    peer = f"0100007F:{port:04X}"
    return sum(1 for row in rows if row[2] == peer and row[9] in inodes)


async def read_slowly(port: int, path: str, *, pace: float) -> tuple[bytes, bytes]:
    """An upgrade request, then its answer read 16 kB at a time every ``pace`` seconds,
    through a small receive buffer, to its end: (head, the bytes after it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n".encode()
            + b"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        got = bytearray()
        async with asyncio.timeout(60):
            while data := await reader.read(16 * 1024):
                got += data
                await asyncio.sleep(pace)
        return head, bytes(got)
    finally:
        writer.close()


async def test_the_apiservers_last_bytes_before_its_fin_reach_a_slow_client(
    tmp_path: Any,
) -> None:
    """The apiserver writes the end of a session, close_notify and its FIN at once while the
    relay's reading is paused for a slow client: every byte before the FIN reaches the client.
    uvloop's TLS layer dropped what it had not decrypted yet when the FIN came (up to about
    200 kB of a 2.9 MB exec output on a real kubelet: tests/realnode/test_streams.py)."""
    payload = os.urandom(3 * 1024 * 1024)
    with GoLikeApiserver(str(tmp_path), payload).serving() as apiserver:
        upstream = apiserver.kubeconfig(os.path.join(tmp_path, "go.kubeconfig"))
        async with proxy_for_upstream(tmp_path, upstream) as running:
            for _ in range(2):
                head, got = await read_slowly(
                    running.proxy.api_port,
                    "/api/v1/namespaces/default/pods/shell/exec?command=seq&stdout=true",
                    pace=0.005,
                )
                assert head.startswith(b"HTTP/1.1 101 "), head
                assert len(got) == len(payload) and got == payload, len(got)
        assert apiserver.upgrades == 2


async def test_a_proxy_stopping_while_a_session_closes_leaves_no_connection_open(
    tmp_path: Any,
) -> None:
    """The client leaves a session whose apiserver does not answer close_notify (a port-forward
    session), and the proxy stops while the relay waits for that answer: the upstream
    connection is dropped, not left open past the proxy's stop (to the loop's end: a
    ResourceWarning, and uvloop then fails to close the loop). Found on a real kubelet:
    tests/realnode/test_streams.py's port-forward tests."""
    apiserver = GoLikeApiserver(str(tmp_path), os.urandom(256 * 1024), hold=True)
    overrides = {"limits.shutdown_grace_seconds": 1}
    with apiserver.serving():
        upstream = apiserver.kubeconfig(os.path.join(tmp_path, "go.kubeconfig"))
        async with proxy_for_upstream(tmp_path, upstream, overrides) as running:
            reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
            writer.write(
                b"POST /api/v1/namespaces/default/pods/web/portforward HTTP/1.1\r\n"
                b"Host: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                b"X-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n"
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 101 "), head
            await reader.readexactly(256 * 1024)
            assert sockets_to(apiserver.port) >= 1
            writer.close()
            await writer.wait_closed()
        # The proxy stopped: none of its sockets is connected to the apiserver any more.
        assert sockets_to(apiserver.port) == 0


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
