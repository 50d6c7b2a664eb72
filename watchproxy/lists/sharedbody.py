"""One upstream body read once and written to several clients, each at its own pace.

A batched LIST's answer larger than a piece (``lists.batch``) is not held whole nor read again
by each member: what was read so far and the rest, as it arrives, are kept as shared chunks,
and every member reads them from its own position. Chunks every reader has passed are dropped.
The producer holds at most ``window`` bytes: past it, it waits for the slowest reader; a reader
that takes no chunk for ``slow_seconds`` while the producer waits is cut (its client's
connection is closed, as the apiserver closes a LIST it cannot write), so a slow client costs
at most the window, and the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from multidict import CIMultiDict

from watchproxy.lists.answers import PACED_BODY_BYTES, ReaderCut, StreamedAnswer

# How long the members of a streamed batch may all be kept waiting by its slowest one (the
# producer's window full) before that one is cut: as long as a slow watcher is given.
SLOW_READER_SECONDS = 30.0


class SharedBody:
    """Chunks of one body, appended by one producer (:meth:`put`, :meth:`end`) and read by
    ``readers`` readers (:meth:`read`), numbered 0 .. readers-1, each once to the end."""

    def __init__(
        self,
        chunks: list[bytes],
        readers: int,
        *,
        window: int,
        slow_seconds: float,
        released: Callable[[], None] | None = None,
    ) -> None:
        # Views of at most a piece each: a reader copies one piece at a time into its client's
        # socket, never a whole large chunk (an upstream body read whole is one).
        self._chunks: list[memoryview] = [p for c in chunks for p in _pieces(c)]
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
        # Called once, when the body has ended and every reader has left: what it held is gone.
        self._released = released

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
        self._chunks.extend(_pieces(chunk))
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
        self._release_when_done()

    async def read(self, reader: int) -> bytes | None:
        """The reader's next chunk; None at the end of the body. Raises :class:`ReaderCut`."""
        while True:
            if reader in self._cut:
                raise ReaderCut("the client read the shared answer too slowly")
            position = self._positions[reader]
            index = position - self._first
            if index < len(self._chunks):
                chunk = bytes(self._chunks[index])
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
        self._release_when_done()

    def _release_when_done(self) -> None:
        if self._ended and not self._positions and self._released is not None:
            released, self._released = self._released, None
            self._chunks.clear()
            self._held = 0
            released()

    def _trim(self) -> None:
        """Drop the chunks every reader has passed; wake the producer."""
        slowest = min(self._positions.values(), default=self._first + len(self._chunks))
        drop = slowest - self._first
        if drop > 0:
            self._held -= sum(len(c) for c in self._chunks[:drop])
            del self._chunks[:drop]
            self._first = slowest
        self._advanced.set()


def _pieces(chunk: bytes) -> list[memoryview]:
    view = memoryview(chunk)
    return [view[at : at + PACED_BODY_BYTES] for at in range(0, len(view), PACED_BODY_BYTES)]


class Streamed:
    """A batch's answer streamed to its members: its head, and its body shared by them as it
    arrives. Each member :meth:`claim` s its reader once."""

    def __init__(self, status: int, reason: str, headers: CIMultiDict[str], body: SharedBody):
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body
        self._claimed = 0

    def claim(self) -> SharedReader:
        reader = self._claimed
        self._claimed += 1
        return SharedReader(self, reader)


class SharedReader(StreamedAnswer):
    """One member's view of a :class:`Streamed` answer."""

    def __init__(self, shared: Streamed, reader: int) -> None:
        super().__init__(shared.status, shared.reason, shared.headers)
        self._body = shared.body
        self._reader = reader

    async def next(self) -> bytes | None:
        return await self._body.read(self._reader)

    def leave(self) -> None:
        self._body.leave(self._reader)
