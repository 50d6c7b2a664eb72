"""Is the apiserver reachable? One prober per proxy, on the backoff schedule while it is not.

While the upstream is down, the prober is the only thing that contacts it: shared watches
wait for :meth:`Connectivity.wait_up` and ordinary requests fail fast with 503, so the number
of upstream attempts follows one backoff schedule however many clients wait or retry.

"Down" is decided by the probe, or by consecutive failed dials (the apiserver refused, reset or
never answered a new connection) — never by one slow or timed-out request, which only asks the
prober to check now (:meth:`Connectivity.suspect`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import Backoff, BackoffPolicy

log = logging.getLogger("watchproxy.connectivity")

Probe = Callable[[], Awaitable[bool]]

# This many failed dials in a row, with no HTTP answer in between, mean the upstream is down.
DIAL_FAILURES_DOWN = 2
# A suspicion (a request timed out) triggers a probe at most this often.
SUSPECT_PROBE_INTERVAL = 1.0


class ProbeFailed(Exception):
    """The probe got no usable answer; the message says why, for the operator's log."""


class Prober(Protocol):
    """What the upstream client tells the prober, and asks it (:class:`Connectivity` fits)."""

    @property
    def down(self) -> bool: ...

    @property
    def last_error(self) -> str | None: ...

    def retry_after(self) -> float: ...

    def report_ok(self) -> None: ...

    def report_dial_failure(self, reason: str) -> None: ...

    def suspect(self, reason: str) -> None: ...


class _NoProber:
    """An upstream client with no prober wired: the apiserver is never known down, and what
    the client reports is not kept (nothing would act on it)."""

    down = False
    last_error = None

    def retry_after(self) -> float:
        return 1.0

    def report_ok(self) -> None:
        pass

    def report_dial_failure(self, reason: str) -> None:
        pass

    def suspect(self, reason: str) -> None:
        pass


NO_PROBER: Prober = _NoProber()


class Connectivity:
    """Up/down state of the upstream with a single owned prober task."""

    def __init__(
        self,
        probe: Probe,
        policy: BackoffPolicy,
        metrics: Metrics,
        *,
        idle_probe_interval: float = 30.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._metrics = metrics
        self._clock = clock
        self._idle_interval = idle_probe_interval
        self.backoff = Backoff(policy, rng or random.Random(), clock)
        self._up = asyncio.Event()
        self._down = asyncio.Event()
        # The two events' states, read by every request (report_ok, Upstream.open): an
        # attribute read where Event.is_set() is a call into Python on each.
        self._is_up = False
        self._is_down = False
        self._wake = asyncio.Event()  # down, or a suspicion: the healthy prober looks now
        self._dial_failures = 0
        self._last_attempt: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.next_probe_at: float | None = None
        self.last_ok: float | None = None
        self.last_error: str | None = None
        self.attempts = 0

    @property
    def up(self) -> bool:
        return self._is_up

    @property
    def down(self) -> bool:
        """Known to be unreachable (False before the first answer or failure)."""
        return self._is_down

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="watchproxy-connectivity")
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The prober only ends when closed; anything else is a bug an operator must see
        (close() raises it again to its caller)."""
        if not task.cancelled() and task.exception() is not None:
            log.error("the upstream prober stopped", exc_info=task.exception())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def report_ok(self) -> None:
        """Any HTTP answer from upstream proves it is reachable."""
        self.last_ok = self._clock()
        self._dial_failures = 0
        if not self._is_up:
            log.info("upstream is reachable")
            self.backoff.success()
            self._set(up=True)
            self._metrics.upstream_up.set(1)

    def _set(self, *, up: bool) -> None:
        self._is_up, self._is_down = up, not up
        if up:
            self._up.set()
            self._down.clear()
        else:
            self._up.clear()
            self._down.set()

    def report_unreachable(self, reason: str | None = None) -> None:
        if reason:
            self.last_error = reason
        if self._is_up or not self._is_down:
            log.warning(
                "upstream is unreachable (%s); probing on the backoff schedule",
                self.last_error or "no answer",
            )
        self._set(up=False)
        self._wake.set()
        self._metrics.upstream_up.set(0)

    def report_dial_failure(self, reason: str) -> None:
        """A new connection failed. Down once :data:`DIAL_FAILURES_DOWN` fail in a row."""
        self._dial_failures += 1
        self.last_error = reason
        if self._dial_failures >= DIAL_FAILURES_DOWN:
            self.report_unreachable(reason)
        else:
            self.suspect(reason)  # the probe's dial is the next one: it settles the question

    def suspect(self, reason: str) -> None:
        """Something looked wrong (a request timed out) but proves nothing: probe soon."""
        if not self._is_up or self._wake.is_set():
            return
        log.info("checking the upstream (%s)", reason)
        self._wake.set()

    def retry_after(self) -> float:
        """Seconds until the next probe: what a client told to come back later should wait."""
        if self.next_probe_at is None:
            return 1.0
        return max(1.0, self.next_probe_at - self._clock())

    async def wait_up(self) -> None:
        await self._up.wait()

    async def _run(self) -> None:
        await self._attempt()
        while True:
            if self._is_up:
                # Healthy: probe when asked to (a suspicion), and otherwise only when nothing
                # else has talked to upstream for a while, so /readyz stays truthful when idle.
                self._wake.clear()
                try:
                    # Not asyncio.wait_for: on 3.11 it drops a cancel that arrives as the event
                    # is set, and close() would then wait for a prober that never stops.
                    async with asyncio.timeout(self._idle_interval):
                        await self._wake.wait()
                except TimeoutError:
                    if self.last_ok is None or self._clock() - self.last_ok >= self._idle_interval:
                        await self._attempt()
                    continue
                if self._is_up:
                    # A suspicion: probe now, but never more often than once a second.
                    last = self._last_attempt
                    if last is not None:
                        await asyncio.sleep(max(0.0, last + SUSPECT_PROBE_INTERVAL - self._clock()))
                    await self._attempt()
                continue
            delay = self.backoff.failure()
            self._metrics.backoff_delay.set(delay)
            self.next_probe_at = self._clock() + delay
            log.warning(
                "upstream unreachable (%s); next probe in %.1fs",
                self.last_error or "no answer",
                delay,
            )
            await asyncio.sleep(delay)
            self._metrics.backoff_seconds.inc(delay)
            self.next_probe_at = None
            await self._attempt()

    async def _attempt(self) -> None:
        self.attempts += 1
        self._last_attempt = self._clock()
        try:
            ok = await self._probe()
        except ProbeFailed as failed:
            ok = False
            self.last_error = str(failed)
        except Exception as error:
            # Not a failure the probe knows: the operator needs the traceback to see why.
            log.warning("upstream probe failed unexpectedly", exc_info=True)
            ok = False
            self.last_error = f"probe error: {type(error).__name__}"
        if ok:
            self.report_ok()
        else:
            self.report_unreachable()
