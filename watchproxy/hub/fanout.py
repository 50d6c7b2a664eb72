"""The write path of a key: new events go to every caught-up subscriber in one pass.

A subscriber that has caught up with the history parks a :class:`LiveCursor` here instead of
waking on every event. When the cache changes, :meth:`Fanout.schedule` runs one pass at the
end of the loop iteration (``call_soon``), so every event that arrived in that iteration goes
out together: per group of subscribers at the same position (cursor, start RV, min RV) the
events are read once, joined once and framed once (the sink's chunk), and the same bytes are
handed to each sink without an await. Metrics are counted per group, not per write.

Sinks of different content codings (identity, gzip) frame the same events differently, so the
coding is part of a group's position. Groups that write the same events (the same cursor, end
and min RV: they differ only in their start RV) share one framing per coding, and so does a
subscriber that writes a batch from its own cursor (:meth:`Fanout.framed`, which keeps the last
few): the common case costs one compression per batch of events, however many gzip clients
there are. The framings are shared with such subscribers too because, framed per pass only,
most compressions were theirs: a subscriber whose liveness timer woke it just before a pass
writes that pass's events itself (``bench.gzip_watchers``; bench/README.md, "Figures behind
the code").

A sink whose buffer is over its high-water mark after the write, or whose client has gone, is
*kicked*: it leaves the pass and its subscriber's task resumes on its own cursor (it drains,
then reads the shared history like any lagging client, and is ended as today when it lags past
the limits). The same happens to everyone when the pass cannot serve a group (a relist gap or
an eviction: ``events_from`` says None) or the key is closed: the task decides, as before.

Pacing (off unless ``hub.fanout_max_delay_seconds`` is set). A pass costs one ``write()`` per
subscriber, and the kernel's TCP work in that write is most of it (most of the proxy's CPU
at hundreds of subscribers, by perf), so the only way to make a busy key cheaper is fewer
writes, which costs latency. After a pass that used ``d`` seconds of CPU, the next one waits until
``d / cpu_share`` has gone by since this one began (at most ``max_delay`` after it ended): a
key whose events come slower than that is written at once, event by event; a key whose fan-out
would take more than ``cpu_share`` of a core gets its events batched, several to a write, and
they wait at most ``max_delay``. The pass is timed in thread CPU time, not wall time: on a busy
node the process is often descheduled mid-pass, and wall time would hold events for other
processes' work: a longer p99 and no CPU saved (bench/README.md, "Figures behind the
code"). A closed key's pass is never held back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from watchproxy.hub.cachetypes import CachedEvent
from watchproxy.hub.ports import WatchSink
from watchproxy.hub.watchcache import WatchCache
from watchproxy.metrics import Metrics

GroupKey = tuple[int, int, int, str]  # (cursor, start_rv, min_rv, coding)
# A framing: (framed bytes, lines, payload bytes), b"" when no line is wanted; kept by
# (cursor, end, min_rv, coding). Seqs are never reused, so a seq range always holds the same
# lines. A few are kept, passes and catch-ups within moments of each other share them; few
# and small, since they are copies the history budget does not count (a catch-up batch is up
# to 64 KiB of events: at most 8 such per key).
Framing = tuple[bytes, int, int]
FRAMINGS_KEPT = 32
FRAMINGS_KEPT_BYTES = 512 * 1024


def wake(waiter: asyncio.Future[None]) -> None:
    """Complete a waiter's future unless a timer or another wake already did."""
    if not waiter.done():
        waiter.set_result(None)


@dataclass(frozen=True)
class FanoutPacing:
    """How long a key's fan-out waits after a pass before the next (see the module's doc)."""

    max_delay: float = 0.0  # 0: every pass at the end of the iteration its events came in
    cpu_share: float = 1.0

    def pause_after(self, pass_seconds: float) -> float:
        if self.max_delay <= 0:
            return 0.0
        return min(self.max_delay, pass_seconds * (1.0 / self.cpu_share - 1.0))


class LiveCursor:
    """One subscriber's position while the fan-out writes for it."""

    __slots__ = (
        "coding",
        "cursor",
        "min_rv",
        "paused",
        "send_framed",
        "sink",
        "start_rv",
        "waiter",
    )

    def __init__(self, sink: WatchSink, cursor: int, start_rv: int, min_rv: int) -> None:
        self.sink = sink
        self.send_framed = sink.send_framed  # bound once: the pass calls it per event
        self.coding = sink.coding
        self.cursor = cursor
        self.start_rv = start_rv
        self.min_rv = min_rv
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False  # kicked because its buffer was over the high-water mark


class Fanout:
    """The caught-up subscribers of one key, grouped by position; one pass per iteration."""

    def __init__(
        self,
        cache: WatchCache,
        metrics: Metrics,
        label: str,
        closed: Callable[[], bool],
        pacing: FanoutPacing = FanoutPacing(),
    ) -> None:
        self._cache = cache
        self._closed = closed
        self._pacing = pacing
        self._sent = metrics.events_sent.labels(label)
        self._bytes = metrics.bytes_sent.labels(label)
        self._delay = metrics.fanout_delay.labels(label)
        self._groups: dict[GroupKey, dict[LiveCursor, None]] = {}
        self._handle: asyncio.Handle | None = None
        self._held = False  # the pending pass waits for the pause
        self._quiet_until = 0.0  # by the loop's clock: no pass before it unless the key closes
        self._framings: dict[tuple[int, int, int, str], Framing] = {}
        self._framings_bytes = 0

    def __len__(self) -> int:
        return sum(len(group) for group in self._groups.values())

    async def wait(self, live: LiveCursor, timeout: float) -> None:
        """Park ``live`` until it is kicked or ``timeout`` passes; it leaves the pass after.

        Meanwhile the fan-out advances ``live.cursor`` over what it wrote for it.
        """
        loop = asyncio.get_running_loop()
        waiter = live.waiter = loop.create_future()
        live.paused = False
        key = (live.cursor, live.start_rv, live.min_rv, live.coding)
        self._groups.setdefault(key, {})[live] = None
        timer = loop.call_later(timeout, wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            live.waiter = None
            self._leave(live)

    def _leave(self, live: LiveCursor) -> None:
        key = (live.cursor, live.start_rv, live.min_rv, live.coding)
        group = self._groups.get(key)
        if group is not None and group.pop(live, 0) is None and not group:
            del self._groups[key]

    def _kick(self, live: LiveCursor) -> None:
        if live.waiter is not None:
            wake(live.waiter)

    def schedule(self) -> None:
        """The cache changed: run one pass at the end of this loop iteration, or after the pause."""
        if not self._groups:
            return
        closed = self._closed()
        if self._handle is not None:
            if not (closed and self._held):
                return
            self._handle.cancel()  # the end goes out now, not after the pause
        loop = asyncio.get_running_loop()
        delay = 0.0 if closed else max(0.0, self._quiet_until - loop.time())
        self._held = delay > 0
        if self._held:
            self._handle = loop.call_at(self._quiet_until, self._pass)
        else:
            self._handle = loop.call_soon(self._pass)
        self._delay.observe(delay)

    def _pass(self) -> None:
        self._handle = None
        if self._pacing.max_delay <= 0:  # unpaced: nothing to time
            self._write_all()
            return
        began = time.thread_time()
        try:
            self._write_all()
        finally:
            took = time.thread_time() - began
            # The loop's clock times call_at; uvloop's reads once per iteration, so it still
            # says when this pass began.
            loop_now = asyncio.get_running_loop().time()
            self._quiet_until = loop_now + took + self._pacing.pause_after(took)

    def _write_all(self) -> None:
        groups, self._groups = self._groups, {}
        if self._closed():
            # Every task ends its stream itself; they find their groups gone.
            for group in groups.values():
                for live in group:
                    self._kick(live)
            return
        cache = self._cache
        for (cursor, start_rv, min_rv, coding), group in groups.items():
            events = cache.events_from(cursor, start_rv)
            if not events:
                if events is None:  # the task decides: a 410 cut, too slow, ...
                    for live in group:
                        self._kick(live)
                else:
                    self._merge((cursor, start_rv, min_rv, coding), group)
                continue
            framed, lines, size = self.framed(events, min_rv, next(iter(group)).sink)
            cursor = events[-1].seq + 1
            if events[-1].rv > min_rv:
                min_rv = -1  # RVs never decrease: nothing later can be below it
            if framed:
                # The loop runs once per subscriber per pass: the hottest Python in the proxy
                # (500 subscribers at 100 events/s are 50,000 iterations a second), so it does
                # only the write and the position; the rare kick leaves the group afterwards.
                reached = len(group)
                full: list[LiveCursor] = []
                for live in group:
                    live.cursor = cursor
                    live.min_rv = min_rv
                    if not live.send_framed(framed):
                        full.append(live)
                for live in full:
                    del group[live]
                    live.paused = True
                    self._kick(live)
                # Counted per group: lines reached every sink, kicked ones included (their
                # transports hold them; a gone client is counted as aiohttp would have).
                self._sent.inc(lines * reached)
                self._bytes.inc(size * reached)
            else:
                for live in group:
                    live.cursor = cursor
                    live.min_rv = min_rv
            if group:
                self._merge((cursor, start_rv, min_rv, coding), group)

    def framed(self, events: Sequence[CachedEvent], min_rv: int, sink: WatchSink) -> Framing:
        """``events`` above ``min_rv`` as ``sink`` writes them: framed (and for gzip,
        compressed) once for every sink of that coding that writes the same events."""
        if events[0].rv > min_rv:
            min_rv = -1  # the same lines as for any lower min_rv
        key = (events[0].seq, events[-1].seq + 1, min_rv, sink.coding)
        framing = self._framings.get(key)
        if framing is None:
            lines = [e.line for e in events if e.rv > min_rv]
            payload = b"".join(lines)
            framing = (sink.frame(payload), len(lines), len(payload)) if lines else (b"", 0, 0)
            self._framings[key] = framing
            self._framings_bytes += len(framing[0])
            while len(self._framings) > FRAMINGS_KEPT or self._framings_bytes > FRAMINGS_KEPT_BYTES:
                oldest = self._framings.pop(next(iter(self._framings)))
                self._framings_bytes -= len(oldest[0])
        return framing

    def _merge(self, key: GroupKey, group: dict[LiveCursor, None]) -> None:
        into = self._groups.get(key)
        if into is None:
            self._groups[key] = group
        else:
            into.update(group)
