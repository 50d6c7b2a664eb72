"""A cold key's first client, served its initial events as the hub reads them.

A key with no shared watch yet is listed before anyone can be served from it. Read page by
page, parsed and encoded again, that list kept its first client waiting several times longer
than the apiserver directly (issue 43: 10,000 pods synced in 0.74 s through watchproxy, 0.10 s
through ``kubectl proxy``). Instead, where the apiserver serves watch-lists and the key is
plain JSON, the key's first list is one upstream watch-list (``sendInitialEvents=true``): its
``ADDED`` lines are relayed to the first client as they arrive — the very bytes the apiserver
would have sent that client — and the hub parses the same lines into its state once they are
all in (``Fetcher.initial_events``). The watch-list ends at its ``k8s.io/initial-events-end``
bookmark at resourceVersion B: the state is the list at B, the shared watch goes on from B,
and the first client, having had the state at B, is served from B on like a client that
resumes from B. Nothing is lost or repeated between its initial events and its changes.

:class:`FirstSync` is what the fetcher (the producer, in the shared watch's task) and the
client's handler (the consumer, which alone writes to its socket) share: the lines not yet
written and how the relay ended. The producer never waits for the client: a slow client
holds lines the hub holds anyway until its state is built from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncGenerator
from typing import Protocol


class Relay(enum.Enum):
    WAITING = "waiting"  # no answer from upstream yet
    OPEN = "open"  # the watch-list answered 200: lines flow
    ENDED = "ended"  # the initial events are all relayed, up to ``end_rv``
    ABANDONED = "abandoned"  # nothing was relayed: the client is served the ordinary way
    FAILED = "failed"  # broken after lines were relayed: the client's stream ends
    HANDED_OVER = "handed over"  # the key will not be shared: the stream is the client's


class Stream(Protocol):
    """The rest of an upstream watch, handed to the client's handler with its ownership."""

    def lines(self) -> AsyncGenerator[bytes, None]: ...

    async def close(self) -> None: ...


class FirstSync:
    """The initial events of a cold key, from the fetcher to the key's first client.

    ``initial_events_end``: the client asked for the annotated bookmark at the end (a
    watch-list, see ``WatchQuery.watch_list``); ``bookmarks``: it allows bookmarks.
    """

    def __init__(self, *, initial_events_end: bool, bookmarks: bool) -> None:
        self.initial_events_end = initial_events_end
        self.bookmarks = bookmarks
        self.state = Relay.WAITING
        self.end_rv = ""
        self.lines_relayed = 0
        self._pending: list[bytes] = []
        self._size = 0
        self._changed = asyncio.Event()
        self._written = asyncio.Event()
        self.consumer_gone = False
        self.stream: Stream | None = None  # HANDED_OVER: the client's handler reads it

    # ---- the producer (the shared watch's fetcher) ------------------------------------------

    def open(self) -> None:
        self._move(Relay.OPEN)

    def put(self, lines: list[bytes], size: int) -> None:
        """``ADDED`` lines (``size`` bytes), in upstream order."""
        if self.state is Relay.OPEN and not self.consumer_gone:
            self._pending.extend(lines)
            self._size += size
            self._changed.set()

    def bookmark(self, line: bytes, *, end: bool) -> None:
        """A bookmark of the watch-list; ``end``: its initial-events-end one."""
        if self.wants(line, end=end) and self.state is Relay.OPEN:
            self.put([line], len(line))

    def end(self, resource_version: str) -> None:
        self.end_rv = resource_version
        self._move(Relay.ENDED)

    async def written(self, timeout: float) -> None:
        """Until the client has been written every line (or has gone), at most ``timeout``
        seconds: the state is built after, so that parsing does not hold back its bytes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._written.wait(), timeout)

    def abandon(self) -> None:
        """The hub lists the ordinary way; nothing reached the client (or must)."""
        self._move(Relay.ABANDONED if self.state is Relay.WAITING else Relay.FAILED)

    def fail(self) -> None:
        self._move(Relay.FAILED)

    def hand_over(self, stream: Stream) -> bool:
        """The key will not be shared (its collection is over the cache budget): the rest of
        the watch-list is the client's own stream, as if passed through. False when the
        client has gone (the caller still owns ``stream``)."""
        if self.consumer_gone or self.state is not Relay.OPEN:
            return False
        self.stream = stream
        self._move(Relay.HANDED_OVER)
        return True

    def wants(self, bookmark: bytes, *, end: bool) -> bool:
        """Whether the client is sent this bookmark line."""
        return self.initial_events_end if end else self.bookmarks

    def _move(self, to: Relay) -> None:
        if self.state in (Relay.WAITING, Relay.OPEN):
            self.state = to
            self._changed.set()
            if to not in (Relay.OPEN, Relay.ENDED):
                self._written.set()  # nothing more will be written to the client

    # ---- the consumer (the client's handler) ------------------------------------------------

    async def opened(self) -> bool:
        """Whether lines will flow (False: serve the client the ordinary way)."""
        while self.state is Relay.WAITING:
            self._changed.clear()
            await self._changed.wait()
        return self.state is not Relay.ABANDONED

    async def take(self) -> tuple[list[bytes], int]:
        """The lines not yet taken and their size; none once the relay is over."""
        while not self._pending and self.state is Relay.OPEN:
            self._changed.clear()
            await self._changed.wait()
        lines, size = self._pending, self._size
        self._pending, self._size = [], 0
        self.lines_relayed += len(lines)
        return lines, size

    def leave(self) -> Stream | None:
        """The client has gone: nothing more is queued for it. Returns a stream handed over
        to it, for the caller to close."""
        self.consumer_gone = True
        stream, self.stream = self.stream, None
        self._pending, self._size = [], 0
        self._written.set()
        return stream

    def all_written(self) -> None:
        """The client's socket has taken every line (to its write buffer's low-water mark)."""
        self._written.set()
