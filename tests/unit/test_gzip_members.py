"""``GzipMembers``: a gzip body of many members, fed in any pieces, decodes completely; one that
ends inside a member or is not gzip is a ``BadBody``, never a shorter body; an identity body
is read as it came."""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import AsyncIterator

import pytest

from watchproxy.upstream.bodies import (
    DECODED_PIECE_BYTES,
    BadBody,
    BodyTooLarge,
    GzipMembers,
    decoded,
    decoded_whole,
)


def members(lines: list[bytes]) -> bytes:
    """One gzip member per line, as kube-apiserver 1.37 writes one per flush of a watch-list."""
    return b"".join(gzip.compress(line) for line in lines)


def event(i: int) -> bytes:
    return b'{"type":"ADDED","object":{"metadata":{"name":"cm-%d","resourceVersion":"%d"}}}\n' % (
        i,
        100 + i,
    )


def test_thousands_of_members_in_one_piece_decode_completely() -> None:
    lines = [event(i) for i in range(2500)]
    decoder = GzipMembers()
    assert decoder.feed(members(lines)) == b"".join(lines)
    decoder.finish()
    assert decoder.members == 2500


def test_members_split_at_every_boundary_decode_completely() -> None:
    lines = [event(i) for i in range(3)]
    body = members(lines)
    for cut in range(len(body) + 1):
        decoder = GzipMembers()
        assert decoder.feed(body[:cut]) + decoder.feed(body[cut:]) == b"".join(lines), cut
        decoder.finish()


def test_random_pieces_and_empty_members_decode_completely() -> None:
    rng = random.Random(28)
    lines = [event(i) if i % 7 else b"" for i in range(400)]  # an empty flush is a member too
    body = members(lines)
    decoder = GzipMembers()
    out, at = [], 0
    while at < len(body):
        size = rng.randint(1, 300)
        out.append(decoder.feed(body[at : at + size]))
        at += size
    decoder.finish()
    assert b"".join(out) == b"".join(lines)
    assert decoder.members == 400


@pytest.mark.parametrize("missing", [1, 8, 30])
def test_a_truncated_last_member_is_an_error_after_every_complete_one(missing: int) -> None:
    lines = [event(i) for i in range(50)]
    body = members(lines)
    decoder = GzipMembers()
    got = decoder.feed(body[:-missing])
    # Every complete member is decoded; the last one's bytes may come out in part, but the
    # body is not taken as complete.
    assert got.startswith(b"".join(lines[:49]))
    with pytest.raises(BadBody, match="truncated inside member 50"):
        decoder.finish()


def test_garbage_is_an_error() -> None:
    decoder = GzipMembers()
    with pytest.raises(BadBody, match="not valid"):
        decoder.feed(b"not gzip at all")


def test_a_raw_deflate_member_is_not_accepted_as_gzip() -> None:
    deflated = zlib.compress(event(1))
    with pytest.raises(BadBody):
        GzipMembers().feed(deflated)


def test_inflation_yields_bounded_pieces_however_much_one_read_expands() -> None:
    # 64 MiB of one byte compress to about 64 KiB: one read that would inflate a thousandfold.
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    body = b"".join(compressor.compress(b"x" * (1 << 20)) for _ in range(64))
    body += compressor.flush() + gzip.compress(b"end")
    members = GzipMembers()
    sizes = [len(piece) for piece in members.pieces(body)]
    members.finish()
    assert max(sizes) <= DECODED_PIECE_BYTES
    assert sum(sizes) == 64 * (1 << 20) + 3
    assert members.members == 2


def test_inflation_past_the_total_bound_raises_body_too_large() -> None:
    body = gzip.compress(b" " * (8 << 20))
    with pytest.raises(BodyTooLarge, match="inflates past 1048576 bytes"):
        decoded_whole(body, "gzip", 1 << 20)
    assert decoded_whole(body, "gzip", 8 << 20) == b" " * (8 << 20)  # the bound itself is fine


async def _pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_an_identity_body_is_its_pieces_and_an_unknown_coding_fails_once_read() -> None:
    body = _pieces(b"a", b"b")
    assert decoded(body, " Identity ") is body  # no step of its own per piece
    assert [p async for p in decoded(_pieces(gzip.compress(b"ab")), "gzip")] == [b"ab"]
    unknown = decoded(_pieces(b"a"), "br")  # not refused before it is read
    with pytest.raises(BadBody):
        _ = [p async for p in unknown]
