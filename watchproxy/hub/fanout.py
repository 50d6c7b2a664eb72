"""The write path of a key: new events go to every caught-up subscriber in one pass.

A subscriber that has caught up with the history parks a :class:`LiveCursor` here instead of
waking on every event. When the cache changes, :meth:`Fanout.schedule` runs one pass at the
end of the loop iteration (``call_soon``), so every event that arrived in that iteration goes
out together: per group of subscribers at the same position (cursor, start RV, min RV) the
events are read once, joined once and framed once (the sink's chunk), and the same bytes are
handed to each sink without an await. Metrics are counted per group, not per write.

A sink whose buffer is over its high-water mark after the write, or whose client has gone, is
*kicked*: it leaves the pass and its subscriber's task resumes on its own cursor (it drains,
then reads the shared history like any lagging client, and is ended as today when it lags past
the limits). The same happens to everyone when the pass cannot serve a group (a relist gap or
an eviction: ``events_from`` says None) or the key is closed: the task decides, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from watchproxy.hub.ports import WatchSink
from watchproxy.hub.watchcache import WatchCache
from watchproxy.metrics import Metrics

GroupKey = tuple[int, int, int]  # (cursor, start_rv, min_rv)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class LiveCursor:
    """One subscriber's position while the fan-out writes for it."""

    __slots__ = ("cursor", "min_rv", "paused", "send_framed", "sink", "start_rv", "waiter")

    def __init__(self, sink: WatchSink, cursor: int, start_rv: int, min_rv: int) -> None:
        self.sink = sink
        self.send_framed = sink.send_framed  # bound once: the pass calls it per event
        self.cursor = cursor
        self.start_rv = start_rv
        self.min_rv = min_rv
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False  # kicked because its buffer was over the high-water mark


class Fanout:
    """The caught-up subscribers of one key, grouped by position; one pass per iteration."""

    def __init__(
        self, cache: WatchCache, metrics: Metrics, label: str, closed: Callable[[], bool]
    ) -> None:
        self._cache = cache
        self._closed = closed
        self._sent = metrics.events_sent.labels(label)
        self._bytes = metrics.bytes_sent.labels(label)
        self._groups: dict[GroupKey, dict[LiveCursor, None]] = {}
        self._handle: asyncio.Handle | None = None

    def __len__(self) -> int:
        return sum(len(group) for group in self._groups.values())

    async def wait(self, live: LiveCursor, timeout: float) -> None:
        """Park ``live`` until it is kicked or ``timeout`` passes; it leaves the pass after.

        Meanwhile the fan-out advances ``live.cursor`` over what it wrote for it.
        """
        loop = asyncio.get_running_loop()
        waiter = live.waiter = loop.create_future()
        live.paused = False
        key = (live.cursor, live.start_rv, live.min_rv)
        self._groups.setdefault(key, {})[live] = None
        timer = loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            live.waiter = None
            self._leave(live)

    def _leave(self, live: LiveCursor) -> None:
        key = (live.cursor, live.start_rv, live.min_rv)
        group = self._groups.get(key)
        if group is not None and group.pop(live, 0) is None and not group:
            del self._groups[key]

    def _kick(self, live: LiveCursor) -> None:
        if live.waiter is not None:
            _wake(live.waiter)

    def schedule(self) -> None:
        """The cache changed: run one pass at the end of this loop iteration."""
        if self._handle is None and self._groups:
            self._handle = asyncio.get_running_loop().call_soon(self._pass)

    def _pass(self) -> None:
        self._handle = None
        groups, self._groups = self._groups, {}
        if self._closed():
            # Every task ends its stream itself; they find their groups gone.
            for group in groups.values():
                for live in group:
                    self._kick(live)
            return
        cache = self._cache
        for (cursor, start_rv, min_rv), group in groups.items():
            events = cache.events_from(cursor, start_rv)
            if not events:
                if events is None:  # the task decides: a 410 cut, too slow, ...
                    for live in group:
                        self._kick(live)
                else:
                    self._merge((cursor, start_rv, min_rv), group)
                continue
            lines = [e.line for e in events if e.rv > min_rv]
            cursor = events[-1].seq + 1
            if events[-1].rv > min_rv:
                min_rv = -1  # RVs never decrease: nothing later can be below it
            if lines:
                payload = b"".join(lines)
                framed = next(iter(group)).sink.frame(payload)
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
                kept = group
                # Counted per group: lines reached every sink, kicked ones included (their
                # transports hold them; a gone client is counted as aiohttp would have).
                self._sent.inc(len(lines) * reached)
                self._bytes.inc(len(payload) * reached)
            else:
                for live in group:
                    live.cursor = cursor
                    live.min_rv = min_rv
                kept = group
            if kept:
                self._merge((cursor, start_rv, min_rv), kept)

    def _merge(self, key: GroupKey, group: dict[LiveCursor, None]) -> None:
        into = self._groups.get(key)
        if into is None:
            self._groups[key] = group
        else:
            into.update(group)
