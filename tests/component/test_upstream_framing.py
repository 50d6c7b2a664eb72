"""How answers from the apiserver are framed (llhttp through httptools,
watchproxy/upstream/connection.py), through real sockets on loopback.

A scripted server answers each request it reads with the next bytes of its script, written in
the pieces given (each piece its own write, drained), so a head or a chunk that arrives split
is exercised as it would be on the wire. Pinned: every framing an apiserver uses gives the body
it sent, and the connection is reused exactly when the answer allows it; an answer that breaks
is an error, never a short body; a HEAD answer has no body; a 101 hands the connection over
with the bytes that came behind its head; an upgrade refusal's body is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest

from tests.harness import wait_for
from watchproxy.errors import UpstreamUnavailable
from watchproxy.kube.headers import HOP_BY_HOP
from watchproxy.upstream.connection import Broken
from watchproxy.upstream.pool import ConnectionPool
from watchproxy.upstream.response import UpstreamResponse

Script = Sequence[Sequence[bytes]]  # per request: the pieces of its answer
GET = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"


@contextlib.asynccontextmanager
async def scripted(
    script: Script, *, close_after: bool = False, received: list[bytes] | None = None
) -> AsyncIterator[ConnectionPool]:
    """A pool on a server that answers the n-th request with ``script[n]``; ``received`` gets
    what came after the last request head (an upgrade's bytes)."""
    answers = list(script)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while answers:
                await reader.readuntil(b"\r\n\r\n")
                for piece in answers.pop(0):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
            if not close_after:
                tail = await reader.read(100)
                if received is not None:
                    received.append(tail)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    pool = ConnectionPool("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        yield pool
    finally:
        await pool.close(2)
        server.close()
        await server.wait_closed()


async def ask(pool: ConnectionPool, data: bytes = GET, *, head: bool = False) -> UpstreamResponse:
    return await pool.request(
        data, ssl_context=None, connect_timeout=5, may_resend=False, head_request=head
    )


async def body_of(response: UpstreamResponse) -> bytes:
    body = await response.read()
    response.release()
    return body


OK_LENGTH = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-",
    b"Length: 2\r\n\r\n{}",
]
OK_CHUNKED = [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"2;ext=1\r\n{}",
    b"\r\n1\r\n\n\r\n0\r\n",
    b"Trailer-X: 1\r\n\r\n",
]


@pytest.mark.parametrize(
    ("answer", "body"),
    [(OK_LENGTH, b"{}"), (OK_CHUNKED, b"{}\n"), ([b"HTTP/1.1 204 No Content\r\n\r\n"], b"")],
    ids=["length", "chunked", "no-content"],
)
async def test_a_framed_answer_gives_its_body_and_the_connection_serves_again(
    answer: list[bytes], body: bytes
) -> None:
    async with scripted([answer, OK_LENGTH]) as pool:
        first = await ask(pool)
        assert first.status == 200 or first.status == 204
        assert await body_of(first) == body
        assert await body_of(await ask(pool)) == b"{}"
        assert pool.dials == 1


async def test_a_body_read_into_one_reused_buffer_is_kept_intact_until_taken() -> None:
    # llhttp is fed the connection's read buffer in place (no copy of each read): every part
    # of the body it keeps must be its own bytes, or the next read would overwrite it.
    # About four reads' worth, under the mark where the connection stops reading.
    parts = [bytes([65 + i]) * 30_000 + b"\n" for i in range(7)]
    answer = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        *(b"%x\r\n%s\r\n" % (len(part), part) for part in parts),
        b"0\r\n\r\n",
    ]
    async with scripted([answer, OK_LENGTH]) as pool:
        response = await ask(pool)
        connection = response._connection
        assert connection is not None
        # The whole body has arrived, nothing of it taken meanwhile.
        await wait_for(lambda: connection.complete, what="the whole body")
        assert await body_of(response) == b"".join(parts)
        assert await body_of(await ask(pool)) == b"{}"


async def test_an_interim_answer_is_skipped() -> None:
    async with scripted([[b"HTTP/1.1 100 Continue\r\n\r\n", *OK_LENGTH]]) as pool:
        answer = await ask(pool)
        assert (answer.status, answer.headers["Content-Type"]) == (200, "application/json")
        assert await body_of(answer) == b"{}"


@pytest.mark.parametrize(
    "answer",
    [
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"],
        [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"],
    ],
    ids=["connection-close", "http10"],
)
async def test_an_answer_that_ends_its_connection_is_not_reused(answer: list[bytes]) -> None:
    async with scripted([answer, OK_LENGTH]) as pool:
        assert await body_of(await ask(pool)) == b"{}"
        assert await body_of(await ask(pool)) == b"{}"
        assert pool.dials == 2


async def test_a_body_without_framing_runs_to_the_close() -> None:
    async with scripted(
        [[b"HTTP/1.1 200 OK\r\n\r\n", b"all ", b"of it"]], close_after=True
    ) as pool:
        answer = await ask(pool)
        assert answer.content_length is None and not answer.passable
        assert await body_of(answer) == b"all of it"


async def test_a_head_answer_has_no_body_whatever_its_length() -> None:
    async with scripted([[b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n"], OK_LENGTH]) as pool:
        answer = await ask(pool, b"HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n", head=True)
        assert answer.content_length == 5000 and answer.whole_body() == b""
        answer.release()
        assert await body_of(await ask(pool)) == b"{}"


@pytest.mark.parametrize(
    "answer",
    [
        [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}"],
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{}"],
    ],
    ids=["short-length", "cut-chunk"],
)
async def test_an_answer_cut_mid_body_is_an_error_not_a_short_body(answer: list[bytes]) -> None:
    async with scripted([answer], close_after=True) as pool:
        response = await ask(pool)
        with pytest.raises(UpstreamUnavailable, match="closed the connection"):
            await response.read()
        response.cut()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000,
    ],
    ids=["two-lengths", "bad-chunk-size", "answer-after-the-answer", "not-http", "endless-head"],
)
async def test_a_garbled_answer_breaks_the_connection(answer: bytes) -> None:
    async with scripted([[answer], OK_LENGTH]) as pool:
        # Refused at the head, or else while reading the body, or after it (a second answer).
        with contextlib.suppress(Broken, UpstreamUnavailable):
            response = await ask(pool)
            try:
                await response.read()
            finally:
                response.release()
        assert await body_of(await ask(pool)) == b"{}"
        assert pool.dials == 2  # the garbled connection was never used again


async def test_a_head_passes_on_as_it_came_only_without_hop_by_hop_fields() -> None:
    async def head_with(*fields: tuple[str, str], version: str = "HTTP/1.1") -> UpstreamResponse:
        lines = "".join(f"{name}: {value}\r\n" for name, value in fields)
        raw = f"{version} 200 OK\r\n{lines}\r\n".encode("latin-1")
        async with scripted([[raw + b"abc"]]) as pool:
            answer = await ask(pool)
            assert answer.raw_head in (raw, b"")
            answer.cut()
            return answer

    assert (await head_with(("Content-Type", "a"), ("Content-Length", "3"))).passable
    assert (await head_with(("X-Te", "1"), ("Content-Length", "3"))).passable
    for name in sorted(HOP_BY_HOP - {"content-length", "transfer-encoding"}):
        assert not (await head_with((name.title(), "x"), ("Content-Length", "3"))).passable, name
    assert not (await head_with(("Content-Type", "a"))).passable
    assert not (await head_with(("Content-Length", "3"), version="HTTP/1.0")).passable
    answer = await head_with(("Audit-Id", "a"), ("Content-Length", " 3 "), ("X-Y", "b, c"))
    assert list(answer.headers.items()) == [
        ("Audit-Id", "a"),
        ("Content-Length", "3"),
        ("X-Y", "b, c"),
    ]
    assert answer.content_length == 3


async def test_a_switched_connection_is_handed_over_with_the_bytes_behind_its_head() -> None:
    switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: SPDY/3.1\r\nConnection: Upgrade\r\n\r\n"
    received: list[bytes] = []
    async with scripted([[switch + b"early", b" later"]], received=received) as pool:
        answer = await ask(pool, b"POST /exec HTTP/1.1\r\nHost: h\r\nUpgrade: SPDY/3.1\r\n\r\n")
        assert answer.switched and answer.headers["Upgrade"] == "SPDY/3.1"
        reader, writer = answer.take_stream()
        assert await reader.readexactly(len(b"early later")) == b"early later"
        writer.write(b"from the client")
        await writer.drain()
        await answer.close()
        assert received == [b"from the client"]


async def test_a_switched_connection_closed_before_the_hand_over_keeps_what_came() -> None:
    switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nbye"
    async with scripted([[switch]], close_after=True) as pool:
        answer = await ask(pool)
        await asyncio.sleep(0.05)  # the close arrives before the caller takes the stream
        reader, _writer = answer.take_stream()
        assert await reader.read() == b"bye"
        await answer.close()


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        ([b"HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\n\r\n{", b"..}"], b"{..}"),
        (
            [b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{..}\r\n0\r\n\r\n"],
            b"{..}",
        ),
        ([b"HTTP/1.1 500 Oops\r\nContent-Length: 3000000\r\n\r\n", b"x" * 3_000_000], b"x" * 1000),
    ],
    ids=["length", "chunked", "huge"],
)
async def test_a_refusal_body_is_read_whole_and_bounded(answer: list[bytes], body: bytes) -> None:
    async with scripted([answer]) as pool:
        response = await ask(pool)
        response.max_body = 1000
        assert await response.read() == body[:1000]
        await response.close()
