"""The ``watchproxy_backoff_delay_seconds`` gauge: backoff waits that report only their start."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import Gauge


class BackoffDelay:
    """``watchproxy_backoff_delay_seconds``: the longest backoff wait still under way, else 0.

    Its writers (the connectivity prober and every shared watch) call ``set(delay)`` just
    before they sleep ``delay`` seconds, and no writer says when its sleep is over. So the
    gauge cannot hold the value written last (that stayed at the last delay after recovery):
    each ``set`` records a wait ending ``delay`` seconds later, and a scrape reads the longest
    wait that has not ended. A wait cut short (its shared watch closed) counts until its end.
    """

    def __init__(self, gauge: Gauge, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waits: list[tuple[float, float]] = []  # (ends at, delay)
        gauge.set_function(self.value)

    def set(self, delay: float) -> None:
        """A writer starts waiting ``delay`` seconds (0: it is not waiting)."""
        now = self._clock()
        # Bounded: at most one wait under way per shared watch, plus the prober's.
        self._waits = [wait for wait in self._waits if wait[0] > now]
        if delay > 0:
            self._waits.append((now + delay, delay))

    def value(self) -> float:
        now = self._clock()
        return max((delay for ends, delay in self._waits if ends > now), default=0.0)
