"""Rate limiting: pure token arithmetic plus one thin async limiter for upstream requests.

:class:`TokenBucket`, :class:`RetryAfterGate` and :func:`parse_retry_after` take the time as an
argument and never sleep. :class:`UpstreamLimiter` is the only part that awaits; its clock and
sleep are injectable. It hands its budget out in turn between clients with the fair queue of
``policy.fairqueue``; per-client limits on what clients ask for are in ``policy.clientlimits``.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections.abc import Awaitable, Callable, Hashable

from watchproxy.errors import TooManyRequests
from watchproxy.policy.adaptive import AdaptiveLimit, Outcome
from watchproxy.policy.fairqueue import FairQueue, Turn, current_flow
from watchproxy.policy.retryafter import MAX_RETRY_AFTER, RetryAfterGate, parse_retry_after
from watchproxy.policy.tokenbucket import TokenBucket

__all__ = [
    "MAX_RETRY_AFTER",
    "RetryAfterGate",
    "TokenBucket",
    "UpstreamLimiter",
    "parse_retry_after",
]

# Below this a wait for the next token is rounding, not rate limiting.
_TOKEN_SLACK = 1e-6

# The light-flow reserve, in seconds of refill: tokens that a flow with a backlog leaves in the
# bucket for requests of flows that have none (see UpstreamLimiter).
LIGHT_RESERVE_SECONDS = 0.1


class _Default(enum.Enum):
    MAX_WAIT = enum.auto()


class UpstreamLimiter:
    """Admission to the upstream apiserver: Retry-After gate, token bucket, concurrency limit.

    ``async with limiter.slot(): ...`` guarantees, for the body of the block:

    - it starts no earlier than the latest Retry-After noted before it started;
    - requests are admitted at most ``burst + qps * t`` in any ``t`` seconds (``qps <= 0`` =
      unlimited);
    - at most ``concurrency_limit`` bodies run at once: the smaller of ``max_concurrent`` (an
      operator's fixed cap, 0 = none) and the ``adaptive`` limit, which :meth:`record` moves
      with what the apiserver answers (none: only the fixed cap);
    - tokens and concurrency slots go to waiting requests in :class:`FairQueue` order: first come
      first served within a flow (:func:`flow`), in turn between flows;
    - a *light* request (its flow has nothing else waiting) finds a token at once while any flow
      is backlogged: the first waiter of a flow with a backlog takes a token only when it leaves
      ``reserve`` tokens behind (``qps`` x 0.1 s, at most half the burst), and waits for that no
      longer than ``reserve / qps`` after it became first, so light flows cannot starve it.

    Why the reserve: with start-time fair queueing alone, a client looping on LISTs keeps the
    bucket empty, so every other client's request waits for the next token (up to ``1/qps``,
    20 ms at 50 qps) even though it is served next, which showed in the quiet clients' p99
    (bench/README.md, "Figures behind the code"). The reserve is refilled at the same rate the
    backlog drains it, so throughput is unchanged; a flow alone pays ``reserve / qps`` once,
    when its backlog starts.

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
        adaptive: AdaptiveLimit | None = None,
        max_wait: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if max_concurrent < 0:
            raise ValueError(f"max_concurrent must be >= 0, got {max_concurrent!r}")
        if max_wait is not None and not max_wait >= 0:
            raise ValueError(f"max_wait must be >= 0 or None, got {max_wait!r}")
        self.clock = clock
        self._sleep = sleep
        self._bucket = TokenBucket(qps, burst, clock())
        self._gate = RetryAfterGate()
        self._queue = FairQueue()
        self.reserve = (
            0 if self._bucket.unlimited else min(burst // 2, round(qps * LIGHT_RESERVE_SECONDS))
        )
        # True while the first waiter sleeps only to leave the reserve: light requests may pass.
        self._head_holds_reserve = False
        self._busy = 0
        self.max_concurrent = max_concurrent
        self.adaptive = adaptive
        self._refused_in_row = 0
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
        self._gate.block_until(self.clock() + min(MAX_RETRY_AFTER, max(0.0, seconds)))

    def retry_after_remaining(self) -> float:
        """Seconds until the Retry-After gate opens (0.0 if open)."""
        return self._gate.wait_time(self.clock())

    @property
    def waiting_flows(self) -> int:
        """Flows with requests waiting for a token or a concurrency slot."""
        return self._queue.waiting_flows

    def slot(self, max_wait: float | _Default | None = _Default.MAX_WAIT) -> Slot:
        """Wait for admission, run the block, free the concurrency slot afterwards:
        ``async with limiter.slot() as waited: ...``.

        ``max_wait`` defaults to the constructor's; pass None to wait however long it takes.
        The request is charged to the current :func:`flow`. The block gets the seconds it
        waited for admission (0.0 when it did not have to wait: the time the caller was merely
        not scheduled is no wait of the limiter's).
        """
        return Slot(self, max_wait)

    async def admit(self, max_wait: float | _Default | None = _Default.MAX_WAIT) -> float:
        """:meth:`slot`'s admission without the context manager, for a caller that first tried
        :meth:`admit_now`: returns the seconds waited once the block may run, holding the slot
        (the caller calls :meth:`release` when its block ends); raises without holding it."""
        budget = self.default_max_wait if isinstance(max_wait, _Default) else max_wait
        started = self.clock()
        waited = await self._wait_for_gate(started, budget)
        waited = await self._admit(current_flow(), started, budget) or waited
        try:
            # A 429 may have arrived while this request queued: honour it before going out.
            waited = await self._wait_for_gate(started, budget) or waited
        except BaseException:
            self._release()
            raise

        wait_seconds = max(0.0, self.clock() - started) if waited else 0.0
        if waited:
            self.throttled_total += 1
            self.waited_seconds_total += wait_seconds
        self.in_flight += 1
        return wait_seconds

    def admit_now(self) -> bool:
        """:meth:`slot`'s admission when nothing stands in the way (no Retry-After, a token and a
        concurrency slot free, nobody of this flow waiting), taken at once without a context
        manager: the common case, for every request of a healthy apiserver. True: the caller
        holds the slot and calls :meth:`release` when its block ends; False: use :meth:`slot`."""
        now = self.clock()
        if self._gate.wait_time(now) > 0:
            return False
        key = current_flow()
        if not self._may_pass(key):
            return False
        self._bucket.reserve(now)
        self._busy += 1
        self._queue.served_without_waiting(key)
        self.in_flight += 1
        return True

    def release(self) -> None:
        """End the block of an :meth:`admit_now` admission."""
        self.in_flight -= 1
        self._release()

    @property
    def concurrency_limit(self) -> int:
        """Requests that may be in flight at once now (0: no limit)."""
        if self.adaptive is None:
            return self.max_concurrent
        if self.max_concurrent == 0:
            return self.adaptive.limit
        return min(self.max_concurrent, self.adaptive.limit)

    def record(
        self,
        outcome: Outcome,
        *,
        kind: str = "",
        latency: float | None = None,
        retry_after: float | None = None,
        sent: float | None = None,
    ) -> bool:
        """Tell the adaptive limit how one upstream request ended (see
        :meth:`AdaptiveLimit.record`), after its slot was given back; ``sent`` is when it went
        out, on :attr:`clock`. True when the limit moved.

        A ``retry_after`` (a 429's) closes the gate for every request only where cutting the
        limit is no answer: without an adaptive limit, or when the apiserver refused more
        requests in a row (no success in between) than were in flight beside the first, so that
        a request sent after a refusal was refused too: it refuses everything, as a priority
        level whose seats are all held by others does. Any other refusal is answered by the cut,
        and the refused client itself still gets the 429 and its Retry-After. Closing the gate
        sooner stalls every client of the pod for the Retry-After: against a priority level
        that rejects (``bench.controller --pushback``), closing it on any refusal, or on any two
        in a row, left the apiserver idle and the clients all but stalled (bench/README.md,
        "Figures behind the code").
        """
        if outcome is Outcome.OK:
            self._refused_in_row = 0
        elif outcome is Outcome.THROTTLED:
            self._refused_in_row += 1
        if self.adaptive is None:
            if retry_after is not None:
                self.note_retry_after(retry_after)
            return False
        if retry_after is not None and self._refused_in_row >= 2 + self._busy:
            # More refusals in a row than requests still in flight: even one sent after a
            # refusal was refused. (Answers already on their way under the old limit are not.)
            self.note_retry_after(retry_after)
        limit = self.concurrency_limit
        # Binding: every slot taken (this request's own, if still held, counts) or requests
        # queue for one. Growth is earned only while the limit is what holds requests back.
        binding = self._busy + 1 >= limit or len(self._queue) > 0
        changed = self.adaptive.record(
            self.clock(),
            outcome,
            kind=kind,
            latency=latency,
            binding=binding,
            sent=sent,
        )
        if changed and self.concurrency_limit > limit:
            self._queue.wake_first()
        return changed

    def _has_room(self) -> bool:
        limit = self.concurrency_limit
        return limit == 0 or self._busy < limit

    def _release(self) -> None:
        self._busy -= 1
        self._queue.wake_first()

    async def _admit(self, key: Hashable, started: float, budget: float | None) -> bool:
        """Take one token and one concurrency slot, in fair order. True if it had to wait."""
        if not self._bucket.unlimited:
            # The tokens this request needs: one for itself and one for each request ahead.
            needed = self._queue.ahead_of_new(key) + 1 - self._bucket.tokens(self.clock())
            if needed > 0:
                self._check_budget(started, budget, needed / self._bucket.rate, "rate limit")
        if budget is not None and not self._has_room() and budget - (self.clock() - started) <= 0:
            self._refuse(1.0, "too many concurrent upstream requests")
        if self._may_pass(key):
            self._bucket.reserve(self.clock())
            self._busy += 1
            self._queue.served_without_waiting(key)
            return False
        turn = self._queue.join(key)
        served = False
        waited = False
        first_since: float | None = None
        try:
            while True:
                if self._queue.is_first(turn):
                    now = self.clock()
                    if first_since is None:
                        first_since = now
                    wait = self._bucket.time_until(now)
                    reserve_wait = self._reserve_wait(key, now, first_since)
                    if wait <= _TOKEN_SLACK and not reserve_wait and self._has_room():
                        # Having slept for the token, it is ours even if float arithmetic left
                        # it a hair short: reserve it rather than sleep for nothing again.
                        self._bucket.reserve(now)
                        self._busy += 1
                        served = True
                        return waited
                    waited = True
                    wait = max(wait, reserve_wait)
                    if wait > 0:
                        self._check_budget(started, budget, wait, "client-side rate limit")
                        self._head_holds_reserve = reserve_wait > 0
                        try:
                            await self._sleep(wait)
                        finally:
                            self._head_holds_reserve = False
                        continue
                waited = True
                await self._wait_turn(turn, started, budget)
        finally:
            self._queue.leave(turn, served=served)

    def _may_pass(self, key: Hashable) -> bool:
        """A light request takes a token at once: nobody waits, or only for the reserve."""
        if self._queue.waiting_of(key) or not self._has_room():
            return False
        if len(self._queue) and not self._head_holds_reserve:
            return False
        return self._bucket.time_until(self.clock()) <= _TOKEN_SLACK

    def _reserve_wait(self, key: Hashable, now: float, first_since: float) -> float:
        """How long the first waiter of ``key`` waits to leave the reserve (0: it need not)."""
        if not self.reserve or self._queue.waiting_of(key) < 2:
            return 0.0
        limit = first_since + self.reserve / self._bucket.rate - now
        wait = min(limit, self._bucket.time_until(now, 1 + self.reserve))
        return 0.0 if wait <= _TOKEN_SLACK else wait

    async def _wait_turn(self, turn: Turn, started: float, budget: float | None) -> None:
        """Until this turn may look again: it became first, or a concurrency slot came free."""
        turn.wake = asyncio.get_running_loop().create_future()
        try:
            if budget is None:
                await turn.wake
                return
            remaining = budget - (self.clock() - started)
            if remaining <= 0:
                self._refuse(1.0, "too many concurrent upstream requests")
            try:
                # Slots and turns are freed by real requests finishing: a bound on loop time.
                async with asyncio.timeout(remaining):
                    await turn.wake
            except TimeoutError:
                self._refuse(1.0, "too many requests waiting upstream")
        finally:
            turn.wake = None

    async def _wait_for_gate(self, started: float, budget: float | None) -> bool:
        waited = False
        while (wait := self._gate.wait_time(self.clock())) > 0:
            self._check_budget(started, budget, wait, "upstream asked to retry later")
            waited = True
            await self._sleep(wait)
        return waited

    def _check_budget(self, started: float, budget: float | None, wait: float, why: str) -> None:
        if budget is None:
            return
        if (self.clock() - started) + wait > budget:
            self._refuse(wait, why)

    def _refuse(self, retry_after: float, why: str) -> None:
        self.rejected_total += 1
        raise TooManyRequests(
            f"too many requests: {why}, retry in {retry_after:.1f}s", retry_after=retry_after
        )


class Slot:
    """The block of one :meth:`UpstreamLimiter.slot` admission. A class, not
    ``contextlib.asynccontextmanager``: every upstream request enters one, and the generator-based
    manager costs several times as much per entry (bench/README.md, "Figures behind the code")."""

    __slots__ = ("_limiter", "_max_wait")

    def __init__(self, limiter: UpstreamLimiter, max_wait: float | _Default | None) -> None:
        self._limiter = limiter
        self._max_wait = max_wait

    async def __aenter__(self) -> float:
        return await self._limiter.admit(self._max_wait)

    async def __aexit__(self, *exc_info: object) -> None:
        self._limiter.release()
