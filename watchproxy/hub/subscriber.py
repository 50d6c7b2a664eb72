"""One client watch served from a shared watch: its own start point, bookmarks and deadline.

A subscriber is a cursor into the shared history; it writes the same encoded bytes as every
other subscriber of the key. It never blocks the others: when it falls more than
``max_lag`` events behind (or out of the history ring) it is ended cleanly, so the client
re-watches from its last resourceVersion and resumes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from watchproxy.hub.cachetypes import CachedEvent, StartPlan
from watchproxy.hub.fanout import LiveCursor
from watchproxy.hub.ports import WatchSink
from watchproxy.hub.sharedwatch import SharedWatch
from watchproxy.metrics import Metrics

log = logging.getLogger("watchproxy.hub")

# How often an idle subscriber checks that its client is still connected.
LIVENESS_POLL_SECONDS = 5.0


# A subscriber behind the live edge writes its backlog from the shared history in batches of
# about this many bytes. One write of everything from its cursor to the end would be a copy of
# up to the whole history per slow client, held while its write waits on a client that has
# stopped reading (bench.backlog). Initial syncs are written in such chunks too, as references
# to the shared lines (see _write_initial). 64 KiB: when initial batches were still joined and
# framed, each was held about three times per syncing client; larger batches made concurrent
# syncs of a large collection cost more memory, smaller ones made them slower (bench.collection;
# bench/README.md, "Figures behind the code").
WRITE_BATCH_BYTES = 64 * 1024


def first_batch(events: Sequence[CachedEvent]) -> Sequence[CachedEvent]:
    """The longest prefix of ``events`` within WRITE_BATCH_BYTES (at least one event)."""
    total = 0
    for count, event in enumerate(events):
        total += len(event.line)
        if total > WRITE_BATCH_BYTES and count:
            return events[:count]
    return events


@dataclass(frozen=True, slots=True)
class SubscriberOptions:
    deadline_seconds: float
    bookmarks: bool
    bookmark_interval: float
    max_lag: int
    write_timeout: float
    # Lines were written before this subscriber (a cold key's relayed initial events): its
    # first line is not the stream's, and it parks in the fan-out as soon as it is caught up.
    started: bool = False


class Subscriber:
    """Writes one client's watch stream. ``run`` returns when the stream has ended."""

    def __init__(
        self,
        shared: SharedWatch,
        sink: WatchSink,
        options: SubscriberOptions,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.sink = sink
        self.options = options
        self.clock = clock
        label = shared.key.resource_label
        self._sent = metrics.events_sent.labels(label)
        self._bytes = metrics.bytes_sent.labels(label)
        self._slow = metrics.slow_subscribers
        self._expired = metrics.expired
        self._group_cuts = metrics.relist_group_cuts
        # The RV of the last event written when that event is inside a relist group (see
        # ``watchcache``): the client holds the group's RV without all of the group.
        self._inside_group: int | None = None
        self.ended_because = ""
        self.stalled = False

    def _abort_stalled(self) -> None:
        self.stalled = True
        self.sink.abort()  # wakes the blocked write with a connection error

    async def _bounded(self, write: Awaitable[None]) -> None:
        # A timer, not wait_for: cancelling aiohttp's drain does not reliably end it, while
        # aborting the transport does — and a timer costs no task per write.
        timer = asyncio.get_running_loop().call_later(
            self.options.write_timeout, self._abort_stalled
        )
        try:
            await write
        finally:
            timer.cancel()

    async def _write(self, data: bytes, events: int) -> None:
        await self._bounded(self.sink.write(data))
        self._sent.inc(events)
        self._bytes.inc(len(data))

    async def run(self, plan: StartPlan) -> None:
        cache = self.shared.cache
        cursor = plan.next_seq
        min_rv, start_rv = plan.min_rv, plan.start_rv
        me = id(self)
        self.shared.cursors[me] = cursor
        started = self.clock()
        deadline = started + self.options.deadline_seconds
        next_bookmark = started + self.options.bookmark_interval
        first_line = not self.options.started
        live = LiveCursor(self.sink, cursor, start_rv, min_rv)
        try:
            if plan.initial:
                await self._write_initial(plan.initial)
                first_line = False
            while True:
                if self.shared.closed and self._inside_group is None:
                    self.ended_because = "shared watch closed"
                    break
                events = cache.events_from(cursor, start_rv)
                if events is None and (cut := cache.cut_line(cursor, start_rv)) is not None:
                    # The apiserver refused the history this client started from (see
                    # WatchCache.abandon_backfill): it gets the apiserver's own 410 and ends.
                    self.ended_because = "expired upstream"
                    await self._write(cut, 1)
                    break
                if events is None or cache.next_seq - cursor > self.options.max_lag:
                    self._slow.inc()
                    self.ended_because = "too slow"
                    log.info(
                        "ended a slow watch client of %s (%d events behind)",
                        self.shared.key.collection_path,
                        cache.next_seq - cursor,
                    )
                    await self._end_inside_group()
                    break
                if events:
                    events = first_batch(events)
                    cursor = events[-1].seq + 1
                    self.shared.cursors[me] = cursor
                    wanted = [e for e in events if plan.wants(e)]
                    if wanted:
                        last = wanted[-1]
                        self._inside_group = last.rv if last.inside_group else None
                        if first_line:
                            lines = [e.line for e in wanted]
                            lines[0] = self.shared.representation.first_line_fixup(lines[0])
                            first_line = False
                            await self._write(b"".join(lines), len(lines))
                        else:
                            # Framed by the fan-out: the same bytes (for gzip, the same
                            # member) as for every other client that writes these events.
                            framing = self.shared.fanout.framed(events, plan.min_rv, self.sink)
                            await self._send_framed(*framing)
                    continue
                now = self.clock()
                if self.shared.closed:  # caught up, so not inside a group: see the loop's top
                    self.ended_because = "shared watch closed"
                    break
                if now >= deadline:
                    self.ended_because = "deadline"
                    break
                if self.options.bookmarks and now >= next_bookmark:
                    await self._bookmark(min_rv)
                    next_bookmark = now + self.options.bookmark_interval
                    continue
                wake = min(deadline, next_bookmark if self.options.bookmarks else deadline)
                timeout = min(max(0.0, wake - now), LIVENESS_POLL_SECONDS)
                if first_line:
                    # Its first line may need the Table fix-up: this one waits and writes itself.
                    await self.shared.wait_change(timeout)
                else:
                    # Caught up: the key's fan-out writes for it until it is kicked or times
                    # out (deadline, bookmark, liveness); then this loop resumes at its cursor,
                    # so whatever the fan-out had not written yet goes out before a bookmark.
                    live.cursor, live.min_rv = cursor, min_rv
                    await self.shared.fanout.wait(live, timeout)
                    cursor, min_rv = live.cursor, live.min_rv
                    self.shared.cursors[me] = cursor
                    if live.paused:
                        await self._bounded(self.sink.drain())
                if self.sink.client_gone():
                    self.ended_because = "client gone"
                    return
            if self.options.bookmarks and self.ended_because == "deadline":
                await self._bookmark(min_rv)
            # A stalled client cannot even take the end of the stream: bounded like a write.
            await self._bounded(self.sink.write_eof())
        except ConnectionError:
            # The client went away or stopped reading: its stream is over, nobody else waits.
            self.ended_because = self.ended_because or "client gone"
            self.sink.close()
        finally:
            if self._inside_group is not None:
                self._group_cuts.inc()
            if self.stalled and self.ended_because != "too slow":
                self.ended_because = "stalled"
                self._slow.inc()
                log.info(
                    "ended a watch client of %s that stopped reading",
                    self.shared.key.collection_path,
                )
            self.shared.cursors.pop(me, None)

    async def _write_initial(self, initial: Sequence[bytes]) -> None:
        # In chunks of about WRITE_BATCH_BYTES, each queued as the shared lines themselves
        # (send_lines: no join, no framing copy) and drained when the transport is full.
        # Joined into one write, the whole initial state would be a copy of the collection per
        # syncing client plus the transport's copy of it (bench.collection: concurrent initial
        # syncs of a large collection took many times its size in RSS); joined and framed per
        # batch, still three copies of each batch per syncing client.
        first = self.shared.representation.first_line_fixup(initial[0])
        lines, size = [first], len(first)
        for index in range(1, len(initial)):
            line = initial[index]
            if size + len(line) > WRITE_BATCH_BYTES:
                await self._send_lines(lines, size)
                lines, size = [], 0
            lines.append(line)
            size += len(line)
        await self._send_lines(lines, size)

    async def _send_lines(self, lines: list[bytes], size: int) -> None:
        if not self.sink.send_lines(lines, size):
            if self.sink.client_gone():
                raise ConnectionResetError("the watch client has gone")
            await self._bounded(self.sink.drain())
        self._sent.inc(len(lines))
        self._bytes.inc(size)

    async def _send_framed(self, framed: bytes, events: int, size: int) -> None:
        if not self.sink.send_framed(framed):
            if self.sink.client_gone():
                raise ConnectionResetError("the watch client has gone")
            await self._bounded(self.sink.drain())
        self._sent.inc(events)
        self._bytes.inc(size)

    async def _end_inside_group(self) -> None:
        # Cannot write the rest of the group: without this line the client would resume at
        # the group's RV and miss the rest; with it, it relists (the apiserver's own answer
        # to an RV it cannot serve).
        if self._inside_group is not None:
            self._expired.inc()
            await self._write(self.shared.cache.expired_line(str(self._inside_group)), 1)
            self._inside_group = None

    async def _bookmark(self, min_rv: int) -> None:
        # The stream RV, not the state's: during a backfill the history is complete only up
        # to it, and a bookmark promises the client everything up to its RV.
        rv = self.shared.cache.stream_resource_version
        if rv is None or rv < min_rv:
            return  # never send a client a resourceVersion older than one it already has
        await self._write(self.shared.cache.bookmark_line(), 0)
