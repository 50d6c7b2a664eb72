"""Rate limiting: pure token arithmetic plus one thin async limiter for upstream requests.

:class:`TokenBucket`, :class:`RetryAfterGate`, :class:`ClientRateLimiter` and
:func:`parse_retry_after` take the time as an argument and never sleep. :class:`UpstreamLimiter`
is the only part that awaits; its clock and sleep are injectable for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from datetime import UTC
from email.utils import parsedate_to_datetime

from watchproxy.errors import TooManyRequests

# An upstream asking for more than this is treated as asking for this: a typo'd or hostile
# Retry-After must not stall the proxy for hours.
MAX_RETRY_AFTER = 600.0

_SECONDS_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


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


class _Default(enum.Enum):
    MAX_WAIT = enum.auto()


class UpstreamLimiter:
    """Admission to the upstream apiserver: Retry-After gate, token bucket, concurrency cap.

    ``async with limiter.slot(): ...`` guarantees, for the body of the block:

    - it starts no earlier than the latest Retry-After noted before it started;
    - requests are admitted at most ``burst + qps * t`` in any ``t`` seconds, first come first
      served (``qps <= 0`` = unlimited);
    - at most ``max_concurrent`` bodies run at once (0 = unlimited).

    With ``max_wait`` (per call, or the constructor default) a request that would wait longer
    raises :class:`~watchproxy.errors.TooManyRequests` carrying ``retry_after`` instead of
    queueing; ``max_wait=0`` makes the call non-blocking. A rejected request takes no token.
    Counters are plain attributes for the metrics module to read: ``throttled_total``
    (admitted after waiting), ``waited_seconds_total`` (their total wait), ``rejected_total``
    (refused with TooManyRequests), ``retry_after_total`` (Retry-Afters noted), ``in_flight``.
    A request cancelled while it waits for its token does not give the token back.
    """

    def __init__(
        self,
        qps: float,
        burst: int,
        max_concurrent: int = 0,
        *,
        max_wait: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if max_concurrent < 0:
            raise ValueError(f"max_concurrent must be >= 0, got {max_concurrent!r}")
        if max_wait is not None and not max_wait >= 0:
            raise ValueError(f"max_wait must be >= 0 or None, got {max_wait!r}")
        self._clock = clock
        self._sleep = sleep
        self._bucket = TokenBucket(qps, burst, clock())
        self._gate = RetryAfterGate()
        self._semaphore = asyncio.Semaphore(max_concurrent) if max_concurrent > 0 else None
        self.max_concurrent = max_concurrent
        self.default_max_wait = max_wait
        self.in_flight = 0
        self.throttled_total = 0
        self.rejected_total = 0
        self.waited_seconds_total = 0.0
        self.retry_after_total = 0

    def note_retry_after(self, seconds: float) -> None:
        """Hold every request back for ``seconds`` from now (an upstream 429 said so)."""
        if math.isnan(seconds):
            return
        self.retry_after_total += 1
        self._gate.block_until(self._clock() + min(MAX_RETRY_AFTER, max(0.0, seconds)))

    def retry_after_remaining(self) -> float:
        """Seconds until the Retry-After gate opens (0.0 if open)."""
        return self._gate.wait_time(self._clock())

    @contextlib.asynccontextmanager
    async def slot(
        self, max_wait: float | _Default | None = _Default.MAX_WAIT
    ) -> AsyncIterator[None]:
        """Wait for admission, run the block, free the concurrency slot afterwards.

        ``max_wait`` defaults to the constructor's; pass None to wait however long it takes.
        """
        budget = self.default_max_wait if isinstance(max_wait, _Default) else max_wait
        started = self._clock()
        waited = await self._wait_for_gate(started, budget)

        now = self._clock()
        bucket_wait = self._bucket.time_until(now)
        if bucket_wait > 0:
            self._check_budget(started, budget, bucket_wait, "client-side rate limit")
        reserved_wait = self._bucket.reserve(now)
        if reserved_wait > 0:
            waited = True
            await self._sleep(reserved_wait)

        if self._semaphore is not None:
            waited = await self._acquire_concurrency(self._semaphore, started, budget) or waited
        try:
            # A 429 may have arrived while this request queued: honour it before going out.
            waited = await self._wait_for_gate(started, budget) or waited
        except BaseException:
            if self._semaphore is not None:
                self._semaphore.release()
            raise

        if waited:
            self.throttled_total += 1
            self.waited_seconds_total += max(0.0, self._clock() - started)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self._semaphore is not None:
                self._semaphore.release()

    async def _wait_for_gate(self, started: float, budget: float | None) -> bool:
        waited = False
        while (wait := self._gate.wait_time(self._clock())) > 0:
            self._check_budget(started, budget, wait, "upstream asked to retry later")
            waited = True
            await self._sleep(wait)
        return waited

    async def _acquire_concurrency(
        self, semaphore: asyncio.Semaphore, started: float, budget: float | None
    ) -> bool:
        if not semaphore.locked():
            await semaphore.acquire()
            return False
        if budget is None:
            await semaphore.acquire()
            return True
        remaining = budget - (self._clock() - started)
        if remaining <= 0:
            self._refuse(1.0, "too many concurrent upstream requests")
        try:
            # Slots are freed by real requests finishing, so this bound is on loop time.
            async with asyncio.timeout(remaining):
                await semaphore.acquire()
        except TimeoutError:
            self._refuse(1.0, "too many concurrent upstream requests")
        return True

    def _check_budget(self, started: float, budget: float | None, wait: float, why: str) -> None:
        if budget is None:
            return
        if (self._clock() - started) + wait > budget:
            self._refuse(wait, why)

    def _refuse(self, retry_after: float, why: str) -> None:
        self.rejected_total += 1
        raise TooManyRequests(
            f"too many requests: {why}, retry in {retry_after:.1f}s", retry_after=retry_after
        )


class ClientRateLimiter:
    """Per-client token buckets (e.g. keyed by remote address) for new watch and list requests.

    Guarantees: each key gets its own ``rate``/``burst`` bucket; memory stays bounded by
    ``max_keys`` (least recently used keys go first); a key whose bucket has refilled completely
    is forgotten early, which loses nothing since a new bucket would be identical.
    ``rate <= 0`` means unlimited.
    """

    def __init__(self, rate: float, burst: int, max_keys: int = 10_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        TokenBucket(rate, burst, 0.0)  # validate the arguments once, up front
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self.rejected_total = 0
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, key: Hashable, now: float) -> float:
        """0.0 if ``key`` may make a request now (and count it), else the seconds to wait."""
        if _is_unlimited(self.rate):
            return 0.0
        self._evict_idle(now)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        wait = bucket.try_take(now)
        if wait > 0:
            self.rejected_total += 1
        return wait

    def _evict_idle(self, now: float) -> None:
        # Oldest first; stop at the first bucket still refilling to keep this O(1) amortized.
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if oldest.tokens(now) < oldest.burst:
                return
            self._buckets.popitem(last=False)


class ErroredWatchLimiter:
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
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        TokenBucket(rate, burst, 0.0)  # validate the arguments once, up front
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

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
        self._evict_full(now)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        if bucket.tokens(now) > -self.burst:
            bucket.reserve(now)

    def _evict_full(self, now: float) -> None:
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if oldest.tokens(now) < oldest.burst:
                return
            self._buckets.popitem(last=False)
