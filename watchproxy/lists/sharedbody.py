"""One upstream body read once and written to several clients, each at its own pace.

A batched LIST whose answer outgrows what a batch may hold (``limits.list_batch_max_bytes``) is
not read again by each member: what was read so far and the rest, as it arrives, are kept as
shared chunks, and every member reads them from its own position. Chunks every reader has
passed are dropped. The producer holds at most ``window`` bytes: past it, it waits for the
slowest reader; a reader that takes no chunk for ``slow_seconds`` while the producer waits is
cut (its client's connection is closed, as the apiserver closes a LIST it cannot write), so a
slow client costs at most the window, and the others go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from multidict import CIMultiDict

log = logging.getLogger("watchproxy.passthrough")

# How long the members of a streamed batch may all be kept waiting by its slowest one (the
# producer's window full) before that one is cut: as long as a slow watcher is given.
SLOW_READER_SECONDS = 30.0
# A whole answer larger than this is written to each member in pieces of this size, each once
# its client took the last (one write would hand the transport all of it: a copy per slow
# client).
PACED_BODY_BYTES = 256 * 1024


class ReaderCut(Exception):
    """This reader fell behind the window for too long, or the upstream body broke."""


class SharedBody:
    """Chunks of one body, appended by one producer (:meth:`put`, :meth:`end`) and read by
    ``readers`` readers (:meth:`read`), numbered 0 .. readers-1, each once to the end."""

    def __init__(
        self, chunks: list[bytes], readers: int, *, window: int, slow_seconds: float
    ) -> None:
        self._chunks = list(chunks)
        self._first = 0  # the position of _chunks[0]
        self._held = sum(len(c) for c in chunks)
        self._positions: dict[int, int] = dict.fromkeys(range(readers), 0)
        self._window = window
        self._slow_seconds = slow_seconds
        self._ended = False
        self._failure: str | None = None
        self._cut: set[int] = set()
        self._arrived = asyncio.Event()  # a chunk or the end arrived
        self._advanced = asyncio.Event()  # a reader took a chunk or left

    @property
    def readers(self) -> int:
        return len(self._positions)

    @property
    def held(self) -> int:
        return self._held

    async def put(self, chunk: bytes) -> bool:
        """Append ``chunk`` once the window has room; False: no reader is left, stop."""
        if not self._positions:
            return False
        self._chunks.append(chunk)
        self._held += len(chunk)
        self._arrived.set()
        while self._positions and self._held > self._window:
            self._advanced.clear()
            try:
                await asyncio.wait_for(self._advanced.wait(), self._slow_seconds)
            except TimeoutError:
                slowest = min(self._positions.values())
                for reader, position in list(self._positions.items()):
                    if position == slowest:
                        self._cut.add(reader)
                        del self._positions[reader]
                self._arrived.set()  # the cut readers learn it
                self._trim()
        return bool(self._positions)

    def end(self, failure: str | None = None) -> None:
        """The body is complete (``failure`` None) or broke with ``failure``."""
        self._ended = True
        self._failure = failure
        self._arrived.set()

    async def read(self, reader: int) -> bytes | None:
        """The reader's next chunk; None at the end of the body. Raises :class:`ReaderCut`."""
        while True:
            if reader in self._cut:
                raise ReaderCut("the client read the shared answer too slowly")
            position = self._positions[reader]
            index = position - self._first
            if index < len(self._chunks):
                chunk = self._chunks[index]
                self._positions[reader] = position + 1
                if position == self._first:
                    self._trim()
                return chunk
            if self._ended:
                if self._failure is not None:
                    raise ReaderCut(self._failure)
                return None
            self._arrived.clear()
            await self._arrived.wait()

    def leave(self, reader: int) -> None:
        """The reader stops (its client left, or it read to the end)."""
        self._cut.discard(reader)
        if self._positions.pop(reader, None) is not None:
            self._trim()

    def _trim(self) -> None:
        """Drop the chunks every reader has passed; wake the producer."""
        slowest = min(self._positions.values(), default=self._first + len(self._chunks))
        drop = slowest - self._first
        if drop > 0:
            self._held -= sum(len(c) for c in self._chunks[:drop])
            del self._chunks[:drop]
            self._first = slowest
        self._advanced.set()


class Streamed:
    """A batch's answer too big to hold whole: its head, and its body shared by the batch's
    members as it arrives. Each member :meth:`claim` s its reader once."""

    def __init__(self, status: int, reason: str, headers: CIMultiDict[str], body: SharedBody):
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body
        self._claimed = 0

    def claim(self) -> StreamedAnswer:
        reader = self._claimed
        self._claimed += 1
        return StreamedAnswer(self, reader)


class StreamedAnswer:
    """One member's view of a :class:`Streamed` answer: :meth:`next` until None, then (or
    when its client leaves) :meth:`leave`."""

    def __init__(self, shared: Streamed, reader: int) -> None:
        self.status = shared.status
        self.reason = shared.reason
        self.headers = shared.headers
        self._body = shared.body
        self._reader = reader

    async def next(self) -> bytes | None:
        """The next piece of the body; None at its end. Raises ``ReaderCut``: the client read
        too slowly, or the upstream body broke (the client's answer cannot be completed)."""
        return await self._body.read(self._reader)

    def leave(self) -> None:
        self._body.leave(self._reader)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces, for a writer that waits for its client between them; leaves
        the shared body at the end, or when the writer stops. Raises ``ReaderCut``."""
        try:
            while (chunk := await self.next()) is not None:
                yield chunk
        finally:
            self.leave()


async def paced_chunks(body: bytes) -> AsyncIterator[bytes]:
    """A large whole answer in pieces of PACED_BODY_BYTES, for a writer that hands the
    transport each once the client took the last: the batch's members share its one body, and
    a slow client holds one piece in its buffer, not a copy of the whole."""
    for start in range(0, len(body), PACED_BODY_BYTES):
        yield body[start : start + PACED_BODY_BYTES]
