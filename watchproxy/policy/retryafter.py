"""Retry-After: parsing the header, and the gate that holds requests back until it has passed.

Pure: both take the time as an argument.
"""

from __future__ import annotations

import math
import re
from datetime import UTC
from email.utils import parsedate_to_datetime

# An upstream asking for more than this is treated as asking for this: a typo'd or hostile
# Retry-After must not stall the proxy for hours.
MAX_RETRY_AFTER = 600.0

_SECONDS_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


def parse_retry_after(value: str | None, now_epoch: float) -> float | None:
    """The delay a ``Retry-After`` header asks for, in seconds, or None if it is unusable.

    Accepts delay-seconds (decimals tolerated) and HTTP-dates (relative to ``now_epoch``, Unix
    seconds). Negative or past values give 0.0; values are capped at :data:`MAX_RETRY_AFTER`.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if _SECONDS_RE.fullmatch(text):
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            # RFC 9110 dates are always GMT; a zone-less date is read as such.
            seconds = when.replace(tzinfo=UTC).timestamp() - now_epoch
        else:
            seconds = when.timestamp() - now_epoch
    if math.isnan(seconds):
        return None
    return min(MAX_RETRY_AFTER, max(0.0, seconds))


class RetryAfterGate:
    """The moment before which no request may go upstream (set from ``429`` + Retry-After).

    Guarantees: the gate only ever moves later (``block_until`` keeps the maximum), and
    ``wait_time(now)`` is 0.0 exactly when ``now`` is at or past that moment.
    """

    def __init__(self) -> None:
        self._until = -math.inf

    @property
    def blocked_until(self) -> float | None:
        """The clock reading the gate opens at, None if it was never closed."""
        return None if self._until == -math.inf else self._until

    def block_until(self, t: float) -> None:
        """Keep requests back until ``t`` (no effect if the gate already reaches further)."""
        if t > self._until:
            self._until = t

    def wait_time(self, now: float) -> float:
        """Seconds from ``now`` until the gate opens (0.0 if open)."""
        return max(0.0, self._until - now)
