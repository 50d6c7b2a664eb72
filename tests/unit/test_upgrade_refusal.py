"""An upgrade the apiserver refuses: its body is read by the HTTP/1.1 parser's framing, whole,
bounded, and a body that breaks off is a BadAnswer."""

from __future__ import annotations

import asyncio

import pytest

from watchproxy.upstream.upgrade import MAX_REFUSAL_BYTES, BadAnswer, read_refusal_body

STATUS = b'{"kind":"Status","code":403}'


def reader_of(*parts: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for part in parts:
        reader.feed_data(part)
    if eof:
        reader.feed_eof()
    return reader


async def test_a_refusal_with_a_content_length_is_read_to_its_length() -> None:
    head = b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n" % len(STATUS)
    # Not to the close: the apiserver may keep the connection open after its answer.
    reader = reader_of(STATUS[:3], STATUS[3:], eof=False)
    assert await read_refusal_body(reader, head) == STATUS


async def test_a_chunked_refusal_is_read_across_reads() -> None:
    head = b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = b"5\r\n" + STATUS[:5] + b"\r\n" + b"%x\r\n" % (len(STATUS) - 5) + STATUS[5:]
    reader = reader_of(chunks[:7], chunks[7:] + b"\r\n0\r\n\r\n", eof=False)
    assert await read_refusal_body(reader, head) == STATUS


async def test_a_refusal_without_framing_runs_to_the_close() -> None:
    head = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\r\n"
    assert await read_refusal_body(reader_of(STATUS[:4], STATUS[4:]), head) == STATUS


async def test_a_refusal_without_a_body_needs_no_read() -> None:
    head = b"HTTP/1.1 204 No Content\r\n\r\n"
    assert await read_refusal_body(reader_of(eof=False), head) == b""


async def test_a_huge_refusal_is_cut_at_the_bound() -> None:
    size = MAX_REFUSAL_BYTES + 100_000
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % size
    body = await read_refusal_body(reader_of(b"x" * size, eof=False), head)
    assert body == b"x" * MAX_REFUSAL_BYTES


@pytest.mark.parametrize(
    ("head", "body"),
    [
        (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 100\r\n\r\n", STATUS),
        (b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n", b"40\r\n" + STATUS),
        (b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n", b"zz\r\n"),
    ],
    ids=["short-length", "cut-chunk", "bad-chunk-size"],
)
async def test_a_refusal_that_breaks_off_is_a_bad_answer(head: bytes, body: bytes) -> None:
    with pytest.raises(BadAnswer, match="broke off"):
        await read_refusal_body(reader_of(body), head)
