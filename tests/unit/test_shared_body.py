"""``SharedBody``: one body read once, written to several readers each at its own pace, holding
at most a window of bytes for the slowest; a reader that stays behind a full window is cut."""

from __future__ import annotations

import asyncio

import pytest

from watchproxy.lists.sharedbody import ReaderCut, SharedBody


async def read_all(body: SharedBody, reader: int, pause: float = 0.0) -> bytes:
    out = bytearray()
    try:
        while (chunk := await body.read(reader)) is not None:
            out += chunk
            if pause:
                await asyncio.sleep(pause)
    finally:
        body.leave(reader)
    return bytes(out)


async def test_every_reader_gets_the_prefix_and_the_rest_while_the_window_bounds_what_is_held():
    body = SharedBody([b"a" * 100], 3, window=300, slow_seconds=5)
    readers = [asyncio.ensure_future(read_all(body, r)) for r in range(3)]
    most = 0
    for i in range(50):
        assert await body.put(bytes([98 + i % 20]) * 100)
        most = max(most, body.held)
    body.end()
    got = await asyncio.gather(*readers)
    assert len(set(got)) == 1 and len(got[0]) == 5100
    assert most <= 300 + 100  # the window, and the chunk that waits for room
    assert body.held == 0


async def test_a_reader_behind_a_full_window_is_cut_and_the_others_finish() -> None:
    body = SharedBody([], 2, window=200, slow_seconds=0.05)
    fast = asyncio.ensure_future(read_all(body, 0))
    # Reader 1 never reads: once the window is full the producer waits for it, then cuts it.
    for _ in range(10):
        assert await body.put(b"x" * 100)
    body.end()
    assert await fast == b"x" * 1000
    with pytest.raises(ReaderCut, match="too slowly"):
        await body.read(1)
    body.leave(1)
    assert body.readers == 0


async def test_the_producer_stops_when_every_reader_left() -> None:
    body = SharedBody([b"x" * 100], 2, window=100, slow_seconds=5)
    body.leave(0)
    body.leave(1)
    assert not await body.put(b"y")
    assert body.held == 0


async def test_a_broken_body_is_an_error_for_its_readers_not_a_short_end() -> None:
    body = SharedBody([b"x"], 1, window=100, slow_seconds=5)
    body.end("the upstream answer broke")
    assert await body.read(0) == b"x"
    with pytest.raises(ReaderCut, match="broke"):
        await body.read(0)
