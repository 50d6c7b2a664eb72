"""The event history of one shared watch: a ring of encoded events with three bounds.

Part of :class:`~watchproxy.hub.watchcache.WatchCache` (which owns one and decides what goes
in and what an eviction means for resumability: ``on_drop``). Events get consecutive seqs;
beyond ``capacity`` events, ``max_bytes`` of lines (0: none) or ``max_age`` seconds the oldest
go first, and the shared :class:`~watchproxy.hub.historybudget.HistoryBudget` may take more.
Pure, synchronous, clock passed in by the caller.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence

from watchproxy.hub.cachetypes import CachedEvent
from watchproxy.hub.historybudget import HistoryBudget

# How many dropped events may sit at the front of the list before it is compacted.
COMPACT_AFTER = 1024
# What a dropped event's slot holds until the compaction: the slot must let go of the event.
# The list is compacted only once the dropped slots are over COMPACT_AFTER and half the list, so
# a slot that kept its event would hold up to max(COMPACT_AFTER events, the live bytes) of
# evicted lines besides the live ones, several times the history budget in RSS (bench.backlog;
# bench/README.md, "Figures behind the code").
_DROPPED = CachedEvent(-1, "", -1, "", b"", 0.0)


class HistoryRing:
    """``on_drop(gone, next_oldest)`` runs for every event evicted, oldest first."""

    def __init__(
        self,
        *,
        capacity: int,
        max_age: float,
        max_bytes: int,
        budget: HistoryBudget | None,
        on_drop: Callable[[CachedEvent, CachedEvent | None], None],
    ) -> None:
        self._capacity = capacity
        self._max_age = max_age
        self._max_bytes = max_bytes  # 0: no bound of its own
        self._budget = budget
        self._on_drop = on_drop
        self._events: list[CachedEvent] = []  # live events are self._events[self._head:]
        self._head = 0
        self.bytes = 0
        self.next_seq = 0
        if budget is not None:
            budget.register(self)

    def detach(self) -> None:
        """The shared watch ends: its history no longer counts against the budget."""
        if self._budget is not None:
            self._budget.unregister(self)
            self._budget = None

    def __len__(self) -> int:
        return len(self._events) - self._head

    @property
    def oldest_seq(self) -> int:
        return self.next_seq - len(self)

    @property
    def history_bytes(self) -> int:
        return self.bytes

    def append(
        self, event_type: str, rv: int, key: str, line: bytes, now: float, *, relist: bool
    ) -> CachedEvent:
        event = CachedEvent(self.next_seq, event_type, rv, key, line, now, relist)
        self.next_seq += 1
        self._events.append(event)
        self.bytes += len(line)
        self._charge(len(line))
        return event

    def end_group(self) -> CachedEvent:
        """Mark the newest event as the last of its relist group."""
        last = self._events[-1] = dataclasses.replace(self._events[-1], ends_group=True)
        return last

    def clear(self) -> None:
        """Drop everything and skip one seq, so that every cursor, even a caught-up one, is
        behind the history and ends."""
        self._charge(-self.bytes)
        self._events, self._head, self.bytes = [], 0, 0
        self.next_seq += 1

    def slice(self, seq: int, end: int) -> Sequence[CachedEvent]:
        """Events ``seq`` .. ``end - 1``; both within the history."""
        oldest = self.oldest_seq
        return self._events[self._head + seq - oldest : self._head + end - oldest]

    def start_after(self, rv: int, replay_at_rv: bool) -> int:
        """The seq of the first event after ``rv`` — or, with ``replay_at_rv``, of the first
        relist event at exactly ``rv`` that is directly before those."""
        events, head = self._events, self._head
        at = bisect.bisect_right(events, rv, lo=head, key=lambda e: e.rv)
        while replay_at_rv and at > head and events[at - 1].rv == rv and events[at - 1].relist:
            at -= 1
        return events[at].seq if at < len(events) else self.next_seq

    def evict(self, now: float) -> int:
        """Apply the ring's own bounds, then the budget's; how many the ring's bounds took."""
        events, evicted = self._events, 0
        deadline = now - self._max_age
        while self._head < len(events) and (
            len(events) - self._head > self._capacity
            or (self._max_bytes and self.bytes > self._max_bytes)
            or events[self._head].time < deadline
        ):
            self._drop_head()
            evicted += 1
        self._compact()
        if self._budget is not None:
            self._budget.enforce()
        return evicted

    def shed_oldest(self) -> bool:
        """Evict the oldest event for the byte budget; False when only the newest is left:
        caught-up subscribers may not have been handed it yet, and losing it would end them."""
        if len(self) <= 1:
            return False
        self._drop_head()
        self._compact()
        return True

    def _drop_head(self) -> None:
        events = self._events
        gone = events[self._head]
        events[self._head] = _DROPPED
        self._head += 1
        self.bytes -= len(gone.line)
        self._charge(-len(gone.line))
        self._on_drop(gone, events[self._head] if self._head < len(events) else None)

    def _charge(self, delta: int) -> None:
        if self._budget is not None:
            self._budget.charge(delta)

    def _compact(self) -> None:
        if self._head > COMPACT_AFTER and self._head * 2 > len(self._events):
            del self._events[: self._head]
            self._head = 0
