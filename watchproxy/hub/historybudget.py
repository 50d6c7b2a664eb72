"""One byte budget for the history rings of every shared watch: pure, no I/O.

Each ring's own bounds (``hub.history_size`` events, ``hub.history_max_age_seconds``) say how far
back one key can resume; they say nothing about memory, and with real objects (5-20 KB each) the
default 10,000 events are 50-200 MB per busy key. The budget bounds the sum: whenever a ring
grows past it, the oldest events of the ring holding the most bytes go first, so a busy key
loses its oldest history before a quiet key loses any. Evicting history only makes old RVs
unresumable from the hub (the watch is then passed to the apiserver, which answers with events
or its own 410); it never loses an event for a subscriber that is keeping up.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["HistoryBudget", "Ring"]


class Ring(Protocol):
    """What the budget needs from a history ring (``WatchCache``)."""

    @property
    def history_bytes(self) -> int: ...

    def shed_oldest(self) -> bool:
        """Evict the oldest event; False if only the newest is left (it may not have reached
        the subscribers that are keeping up yet)."""
        ...


class HistoryBudget:
    """The bytes held by the registered rings together, kept at or below ``limit`` (0: none).

    Rings report each change with :meth:`charge` and call :meth:`enforce` after growing.
    ``evicted_events`` counts the events the budget (not the rings' own bounds) evicted.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"history byte budget must be >= 0, got {limit!r}")
        self.limit = limit
        self.used = 0
        self.evicted_events = 0
        self._rings: list[Ring] = []

    def register(self, ring: Ring) -> None:
        self._rings.append(ring)

    def unregister(self, ring: Ring) -> None:
        """``ring`` ends: its bytes no longer count."""
        if ring in self._rings:
            self._rings.remove(ring)
            self.used -= ring.history_bytes

    def charge(self, delta: int) -> None:
        self.used += delta

    def enforce(self) -> int:
        """Evict oldest events from the largest rings until within the limit; how many."""
        evicted = 0
        while self.limit and self.used > self.limit:
            for ring in sorted(self._rings, key=lambda ring: ring.history_bytes, reverse=True):
                if ring.shed_oldest():
                    evicted += 1
                    break
            else:
                break  # every ring is down to its newest event
        self.evicted_events += evicted
        return evicted
