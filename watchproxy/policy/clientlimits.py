"""Per-client limits on what clients ask of the proxy: new watches and lists per client, and
watches that keep ending in errors. Pure: the time is an argument; nothing sleeps here."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable

from watchproxy.policy.tokenbucket import TokenBucket, _is_unlimited

__all__ = ["ClientRateLimiter", "ErroredWatchLimiter"]


class _KeyedBuckets:
    """Token buckets by key, bounded: least recently used keys go first beyond ``max_keys``,
    and a key whose bucket is full again is forgotten (a new one would be identical)."""

    def __init__(self, rate: float, burst: int, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        TokenBucket(rate, burst, 0.0)  # validate the arguments once, up front
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, key: Hashable, now: float) -> TokenBucket:
        """The bucket of ``key`` (made full if new), marked as the most recently used."""
        self._evict_full(now)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def _evict_full(self, now: float) -> None:
        # Oldest first; stop at the first bucket still refilling to keep this O(1) amortized.
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if oldest.tokens(now) < oldest.burst:
                return
            self._buckets.popitem(last=False)


class ClientRateLimiter(_KeyedBuckets):
    """Per-client token buckets (e.g. keyed by remote address) for new watch and list requests.

    Guarantees: each key gets its own ``rate``/``burst`` bucket; memory stays bounded by
    ``max_keys`` (least recently used keys go first); a key whose bucket has refilled completely
    is forgotten early, which loses nothing since a new bucket would be identical.
    ``rate <= 0`` means unlimited.
    """

    def __init__(self, rate: float, burst: int, max_keys: int = 10_000) -> None:
        super().__init__(rate, burst, max_keys)
        self.rejected_total = 0

    def check(self, key: Hashable, now: float) -> float:
        """0.0 if ``key`` may make a request now (and count it), else the seconds to wait."""
        if _is_unlimited(self.rate):
            return 0.0
        wait = self._bucket(key, now).try_take(now)
        if wait > 0:
            self.rejected_total += 1
        return wait

    def check_now(self, key: Hashable) -> float:
        """:meth:`check` on the monotonic clock (what the proxy passes its API handler)."""
        return self.check(key, time.monotonic())


class ErroredWatchLimiter(_KeyedBuckets):
    """Per-client budget for watch requests that end in an error (a 4xx/5xx, a stream that
    ends at once): a library that re-watches in a tight loop after each error is slowed down
    to ``rate`` such watches per second once it has spent ``burst`` of them.

    Guarantees: a key that never errs never waits; each error costs one token and the next watch
    of that key waits until the balance is back to zero; the debt is capped at ``burst`` tokens
    (a wait of at most ``burst / rate`` seconds); memory is bounded by ``max_keys`` (least
    recently used first) and a key whose bucket is full again is forgotten.
    ``rate <= 0`` means off.
    """

    def __init__(self, rate: float, burst: int, max_keys: int = 10_000) -> None:
        super().__init__(rate, burst, max_keys)

    def wait(self, key: Hashable, now: float) -> float:
        """Seconds the next watch of ``key`` must wait (0.0: go ahead)."""
        bucket = self._buckets.get(key)
        if bucket is None or _is_unlimited(self.rate):
            return 0.0
        return max(0.0, -bucket.tokens(now) / self.rate)

    def record_error(self, key: Hashable, now: float) -> None:
        """A watch of ``key`` ended in an error."""
        if _is_unlimited(self.rate):
            return
        bucket = self._bucket(key, now)
        if bucket.tokens(now) > -self.burst:
            bucket.reserve(now)
