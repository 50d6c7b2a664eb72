"""The token bucket under every rate in the proxy: pure arithmetic on a time it is given."""

from __future__ import annotations

import math


def _is_unlimited(rate: float) -> bool:
    return rate <= 0 or math.isinf(rate)


class TokenBucket:
    """A token bucket that holds at most ``burst`` tokens and refills at ``rate`` per second.

    Guarantees: it starts full; over any interval of length ``t`` at most ``burst + rate * t``
    tokens are handed out; ``rate <= 0`` (or infinite) means unlimited and never waits.
    Time going backwards is ignored rather than minting or destroying tokens.
    """

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if math.isnan(rate):
            raise ValueError("token bucket rate must be a number, got nan")
        self.rate = float(rate)
        self.unlimited = _is_unlimited(self.rate)
        if not self.unlimited and burst < 1:
            raise ValueError(f"token bucket burst must be >= 1 when rate > 0, got {burst!r}")
        self.burst = burst
        self._tokens = float(burst)
        self._last = now

    def tokens(self, now: float) -> float:
        """The balance at ``now`` (negative while reservations are outstanding)."""
        self._refill(now)
        return self._tokens

    def time_until(self, now: float, n: float = 1) -> float:
        """Seconds until ``n`` tokens are available, without taking any (inf if n > burst)."""
        if self.unlimited:
            return 0.0
        if n > self.burst:
            return math.inf
        self._refill(now)
        missing = n - self._tokens
        return 0.0 if missing <= 0 else missing / self.rate

    def try_take(self, now: float, n: float = 1) -> float:
        """Take ``n`` tokens and return 0.0 if they are there; else take nothing and return the
        seconds until they would be (inf if ``n`` exceeds the burst)."""
        wait = self.time_until(now, n)
        if wait == 0.0 and not self.unlimited:
            self._tokens -= n
        return wait

    def reserve(self, now: float, n: float = 1) -> float:
        """Take ``n`` tokens now, going negative if need be, and return how long the caller must
        wait before acting on them. Later reservations queue behind earlier ones (FIFO), as with
        golang.org/x/time/rate's ``Reserve``."""
        if self.unlimited:
            return 0.0
        if n > self.burst:
            raise ValueError(f"cannot reserve {n} tokens from a bucket of burst {self.burst}")
        self._refill(now)
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
