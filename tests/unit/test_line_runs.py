"""A cold key's watch-list, taken in batches of whole lines (``read_line_batches``) and split at
its initial-events-end bookmark (``fetcher._initial_lines``): whatever the pieces the body came
in, the batches hold exactly its lines, in order, and the end bookmark is found wherever it
falls; a batch is relayed without a look at each line's JSON only when every line is an ADDED
event."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator

import pytest

from watchproxy.hub.fetcher import _all_added, _initial_lines
from watchproxy.upstream.bodies import LineTooLong, read_line_batches


def added(i: int) -> bytes:
    obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": f"p{i}", "resourceVersion": "7"}}
    return json.dumps({"type": "ADDED", "object": obj}, separators=(",", ":")).encode() + b"\n"


def bookmark(rv: str, *, end: bool) -> bytes:
    meta: dict[str, object] = {"resourceVersion": rv}
    if end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": "Pod", "apiVersion": "v1", "metadata": meta}
    return json.dumps({"type": "BOOKMARK", "object": obj}, separators=(",", ":")).encode() + b"\n"


async def part_lists(body: bytes, rng: random.Random) -> AsyncIterator[list[bytes]]:
    """``body`` cut anywhere, in reads of one or more parts."""
    start = 0
    while start < len(body):
        parts = []
        for _ in range(rng.randint(1, 4)):
            size = rng.randint(1, 400)
            parts.append(body[start : start + size])
            start += size
        yield [part for part in parts if part]


async def batches_of(body: bytes, seed: int, max_line: int = 10_000) -> list[list[bytes]]:
    reads = part_lists(body, random.Random(seed))
    batches = [b async for b in read_line_batches(reads, max_line)]
    assert all(size == sum(map(len, lines)) for lines, size in batches)
    return [lines for lines, _ in batches]


async def test_a_part_that_is_one_line_is_that_line() -> None:
    """An apiserver writes one HTTP chunk per event: each part is a line, kept, not copied."""
    lines = [added(i) for i in range(3)]

    async def reads() -> AsyncIterator[list[bytes]]:
        yield lines[:2]
        yield [lines[2][:10], lines[2][10:]]  # a line across two parts is joined

    batches = [b async for b in read_line_batches(reads(), 10_000)]
    assert [lines for lines, _ in batches] == [lines[:2], [lines[2]]]
    assert all(kept is line for kept, line in zip(batches[0][0], lines[:2], strict=True))


@pytest.mark.parametrize("seed", range(20))
async def test_batches_hold_the_body_s_lines_whatever_its_pieces(seed: int) -> None:
    lines = [added(i) for i in range(50)]
    body = b"".join(lines) + b'{"type":"ADD'  # a truncated last line is not a line
    batches = await batches_of(body, seed)
    assert all(batches)
    assert [line for batch in batches for line in batch] == lines


async def test_a_line_longer_than_the_limit_is_refused() -> None:
    body = added(1) + b"x" * 5000 + b"\n"
    with pytest.raises(LineTooLong):
        await batches_of(body, 1, max_line=1000)


def test_the_end_bookmark_splits_a_run_and_what_follows_is_kept() -> None:
    modified = added(9).replace(b'"ADDED"', b'"MODIFIED"')
    batch = [added(1), added(2), bookmark("40", end=True), modified]
    runs, end_rv, strange, after = _initial_lines(batch)
    assert (end_rv, strange, after) == ("40", None, [modified])
    assert runs == [([added(1), added(2)], bookmark("40", end=True), True)]


def test_a_progress_bookmark_before_the_end_is_its_own_run() -> None:
    batch = [added(1), bookmark("30", end=False), added(2)]
    runs, end_rv, strange, after = _initial_lines(batch)
    assert (end_rv, strange, after) == (None, None, [])
    assert runs == [([added(1)], bookmark("30", end=False), False), ([added(2)], None, False)]


def test_an_error_before_the_end_is_reported() -> None:
    error = b'{"type":"ERROR","object":{"kind":"Status","code":410}}\n'
    runs, end_rv, strange, _ = _initial_lines([added(1), error])
    assert runs == [([added(1), error], None, False)]  # relayed as it came, then the end
    assert end_rv is None and strange == "an event of type ERROR"


async def test_lines_are_cut_at_newlines_only() -> None:
    carriage = added(2).replace(b'"p2"', b'"p\r2"')  # as no apiserver writes it
    body = added(1) + carriage + added(3)
    batches = await batches_of(body, 3)
    assert [line for batch in batches for line in batch] == [added(1), carriage, added(3)]


def test_a_run_skips_the_look_at_each_line_only_when_every_line_is_added() -> None:
    # An object may hold what a bookmark line begins with: it is still an ADDED line.
    nested = added(1).replace(b'"metadata"', b'"spec":{"type":"BOOKMARK","x":1},"metadata"')
    assert _all_added([added(0), nested, added(2)])
    assert _all_added([])
    for other in (
        bookmark("30", end=False),
        bookmark("40", end=True),
        b'{"type":"ERROR","object":{"kind":"Status","code":410}}\n',
        b"\n",
    ):
        assert not _all_added([added(0), other, added(2)])
        assert not _all_added([other])
