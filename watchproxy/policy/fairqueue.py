"""Fair shares of the upstream budget between *flows*, the clients the server tells apart.

:func:`flow` marks whose work a block of code does (per source address, and per credential when
clients' credentials are forwarded); :class:`FairQueue` orders waiting requests so that, while
requests queue, each waiting flow gets the next token in turn: a client looping on LISTs gets no
more than an equal share of the queue while others want some, and all of it while they do not.
Pure apart from the futures it hands back to wake a waiter.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import itertools
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

__all__ = ["FairQueue", "Turn", "current_flow", "flow"]

# Who the current request is for: set by the server around the work it does for one client, read
# by the limiter wherever that work reaches the upstream (no signature in between needs to know).
_FLOW: contextvars.ContextVar[Hashable] = contextvars.ContextVar("watchproxy_flow", default=None)


def current_flow() -> Hashable:
    """The flow the running code works for (None: the proxy's own work)."""
    return _FLOW.get()


class flow:  # lower case: it reads as a function, ``with flow(key):``
    """Charge upstream requests made inside the block to ``key`` (None: the proxy's own work).

    A class rather than a generator-based context manager: it wraps every request the proxy
    forwards, and a generator costs several times the calls."""

    __slots__ = ("_key", "_token")

    def __init__(self, key: Hashable) -> None:
        self._key = key

    def __enter__(self) -> None:
        self._token = _FLOW.set(self._key)

    def __exit__(self, *exc: object) -> None:
        _FLOW.reset(self._token)


@dataclass(order=True)
class Turn:
    """One waiting request: its start tag, its arrival order, its flow, how to wake it."""

    start: int
    sequence: int
    key: Hashable = field(compare=False)
    wake: asyncio.Future[None] | None = field(default=None, compare=False)


class FairQueue:
    """Start-time fair queueing of requests between flows, one unit of work per request.

    Guarantees: requests are ordered by (start tag, arrival); a flow's tag is the later of the
    virtual time and the finish tag of its previous request, so while flows wait, each gets one
    turn per round whatever the length of its backlog, and a newly arriving flow queues behind
    at most one request of each other flow. Memory is bounded by the waiting requests plus
    ``max_flows`` remembered finish tags (least recently used forgotten first, which at worst
    gives a flow one turn early).
    """

    def __init__(self, max_flows: int = 10_000) -> None:
        self.max_flows = max_flows
        self._virtual = 0
        self._finish: OrderedDict[Hashable, int] = OrderedDict()
        self._queue: list[Turn] = []
        self._waiting: Counter[Hashable] = Counter()
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def waiting_flows(self) -> int:
        return len(self._waiting)

    def waiting_of(self, key: Hashable) -> int:
        """How many requests of ``key`` wait."""
        return self._waiting.get(key, 0)  # not [key]: Counter.__missing__ is Python, per request

    def ahead_of_new(self, key: Hashable) -> int:
        """How many queued requests a new request of ``key`` would queue behind."""
        start = max(self._virtual, self._finish.get(key, self._virtual))
        return bisect.bisect_right(self._queue, start, key=lambda turn: turn.start)

    def join(self, key: Hashable) -> Turn:
        turn = Turn(self._charge(key), next(self._sequence), key)
        bisect.insort(self._queue, turn)
        self._waiting[key] += 1
        return turn

    def served_without_waiting(self, key: Hashable) -> None:
        """A request of ``key`` was served without joining: it uses up the flow's turn all the
        same (an empty queue's virtual time moves to it, as a join and a served leave would)."""
        start = self._charge(key)
        if not self._queue:
            self._virtual = max(self._virtual, start)

    def _charge(self, key: Hashable) -> int:
        """The start tag of ``key``'s next request, its finish tag recorded."""
        start = max(self._virtual, self._finish.get(key, self._virtual))
        self._finish[key] = start + 1
        self._finish.move_to_end(key)
        while len(self._finish) > self.max_flows:
            self._finish.popitem(last=False)
        return start

    def is_first(self, turn: Turn) -> bool:
        return bool(self._queue) and self._queue[0] is turn

    def leave(self, turn: Turn, *, served: bool) -> None:
        """``turn`` is done waiting: served (virtual time moves to its tag) or given up."""
        index = bisect.bisect_left(self._queue, turn)
        while self._queue[index] is not turn:
            index += 1
        del self._queue[index]
        self._waiting[turn.key] -= 1
        if not self._waiting[turn.key]:
            del self._waiting[turn.key]
        if served:
            self._virtual = max(self._virtual, turn.start)
            # Finish tags at or behind virtual time say nothing: forget them.
            while self._finish:
                oldest_key, finish = next(iter(self._finish.items()))
                if finish > self._virtual or oldest_key in self._waiting:
                    break
                del self._finish[oldest_key]
        self.wake_first()

    def wake_first(self) -> None:
        """Tell the first waiter to look again (a slot or a place at the front came free)."""
        if self._queue:
            wake = self._queue[0].wake
            if wake is not None and not wake.done():
                wake.set_result(None)
