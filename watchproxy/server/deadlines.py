"""A client connection's deadlines: one lazily armed timer, and when a request body is late.

A connection on the API port has one deadline at a time (``server.connection``): its request
head's, its body's, or its keep-alive idleness's. :class:`DeadlineTimer` keeps them with one
timer; :class:`BodyClock` says, from values alone, when a body that is still arriving is late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class BodyClock:
    """When a request body is late: ``timeout`` after its last byte, or sooner if it came
    slower on average than ``min_rate`` bytes per second after its first ``timeout`` seconds
    (a trickle of a byte now and then must not last forever). Pure: times are passed in."""

    def __init__(self, timeout: float, min_rate: float) -> None:
        self.timeout = timeout
        self.min_rate = min_rate
        self.since = 0.0
        self.last = 0.0
        self.got = 0

    def start(self, now: float) -> None:
        self.since = self.last = now
        self.got = 0

    def progress(self, now: float, size: int) -> None:
        self.last = now
        self.got += size

    def due(self) -> float:
        deadline = self.last + self.timeout
        if self.min_rate > 0:
            deadline = min(deadline, self.since + self.timeout + self.got / self.min_rate)
        return deadline

    def why_late(self, now: float) -> str:
        if self.last + self.timeout <= now:
            return f"no byte for {self.timeout:g}s"
        return f"under {self.min_rate:g} bytes/s"


class DeadlineTimer:
    """One timer for a connection's successive deadlines.

    Lazy, because every request sets a deadline twice (its head's, then the idle one after
    its answer) and clears one: one timer stays armed and, when it fires, compares the
    deadline then in force (which ``due`` may move on: a body's moves with each read). It is
    armed at most ``recheck`` ahead (the shortest timeout there is), so a deadline set later
    never needs it re-armed earlier. ``expired`` is called once a deadline has passed."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        recheck: float,
        due: Callable[[float, float], float],
        expired: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._recheck = recheck
        self._due = due  # (deadline set, now) -> the deadline in force
        self._expired = expired
        self._handle: asyncio.TimerHandle | None = None
        self._deadline: float | None = None  # loop time

    def set(self, seconds: float) -> None:
        """The deadline is ``seconds`` from now (none if ``seconds`` <= 0)."""
        if seconds <= 0:
            self._deadline = None
            return
        now = self._loop.time()
        self._deadline = now + seconds
        if self._handle is None:
            self._handle = self._loop.call_at(min(self._deadline, now + self._recheck), self._fired)

    def clear(self) -> None:
        self._deadline = None  # the armed timer, if any, finds nothing due

    def stop(self) -> None:
        self._deadline = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fired(self) -> None:
        self._handle = None
        deadline = self._deadline
        if deadline is None:
            return  # cleared since: the next deadline arms a timer again
        now = self._loop.time()
        deadline = self._due(deadline, now)
        if now < deadline:
            self._handle = self._loop.call_at(min(deadline, now + self._recheck), self._fired)
            return
        self._deadline = None
        self._expired()
