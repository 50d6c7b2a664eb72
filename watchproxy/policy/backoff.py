"""Exponential backoff with jitter: a pure policy and a small state machine.

Nothing here sleeps or reads a clock of its own: the random source and the clock are passed in,
so the schedule can be tested with thousands of seeded samples in milliseconds.

    delay = backoff.failure()     # pure: record the failure, get the delay
    await asyncio.sleep(delay)    # the caller's only I/O
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

JitterMode = Literal["full", "proportional", "none"]
_JITTER_MODES: tuple[str, ...] = ("full", "proportional", "none")


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """An exponential backoff schedule with jitter; the defaults are client-go's reflector.

    Guarantees: ``base_delay(attempt) == min(cap, initial * factor**attempt)`` and never
    overflows; ``delay()`` is never negative and never above ``cap``.

    Jitter modes, with ``d = base_delay(attempt)``:

    - ``"proportional"``: client-go's ``wait.Jitter(d, 1.0)``, uniform in ``[d, 2d)``, then capped
      at ``cap`` (so the result lies in ``[d, cap]``);
    - ``"full"``: AWS "full jitter", uniform in ``[0, d]``;
    - ``"none"``: exactly ``d``.

    ``reset_after`` is how long a connection must stay healthy before the attempt counter of a
    :class:`Backoff` goes back to 0.

    ``cap_jitter`` (0 = client-go's behaviour) keeps some jitter once the schedule reaches the
    cap: a delay that would be ``cap`` is drawn uniformly from ``[cap * (1 - cap_jitter), cap]``.
    Without it every delay at the cap is exactly ``cap`` and proxies that lost the apiserver at
    the same moment would keep retrying in lockstep.
    """

    initial: float = 0.8
    factor: float = 2.0
    cap: float = 30.0
    jitter: JitterMode = "proportional"
    reset_after: float = 120.0
    cap_jitter: float = 0.0

    def __post_init__(self) -> None:
        for name in ("initial", "factor", "cap", "reset_after"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"backoff {name} must be a finite number, got {value!r}")
        if self.initial <= 0:
            raise ValueError(f"backoff initial must be > 0, got {self.initial!r}")
        if self.factor < 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor!r}")
        if self.cap < self.initial:
            raise ValueError(
                f"backoff cap must be >= initial, got cap={self.cap!r} initial={self.initial!r}"
            )
        if not 0.0 <= self.cap_jitter <= 1.0:
            raise ValueError(f"backoff cap_jitter must be in [0, 1], got {self.cap_jitter!r}")
        if self.reset_after < 0:
            raise ValueError(f"backoff reset_after must be >= 0, got {self.reset_after!r}")
        if self.jitter not in _JITTER_MODES:
            raise ValueError(
                f"backoff jitter must be one of {', '.join(_JITTER_MODES)}, got {self.jitter!r}"
            )

    def base_delay(self, attempt: int) -> float:
        """The delay before retry number ``attempt`` (0 = first retry) without jitter.

        Nondecreasing in ``attempt``, at most ``cap``, safe for any attempt however large.
        """
        if attempt < 0:
            raise ValueError(f"backoff attempt must be >= 0, got {attempt!r}")
        try:
            grown = self.initial * self.factor**attempt
        except OverflowError:  # float ** int overflows long after the cap is reached
            return self.cap
        return min(self.cap, grown)

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The jittered delay before retry number ``attempt``, drawn from ``rng``."""
        base = self.base_delay(attempt)
        if self.jitter == "none":
            return base
        if self.jitter == "full":
            return rng.uniform(0.0, base)
        delay = base + rng.random() * base
        if delay < self.cap:
            return delay
        return self.cap - rng.random() * self.cap * self.cap_jitter


class Backoff:
    """Backoff state for one thing that reconnects (a shared upstream watch, the connection).

    Guarantees: each :meth:`failure` returns the delay for the next attempt and advances the
    schedule; the schedule starts again at attempt 0 only when the previous failure was
    preceded by at least ``policy.reset_after`` seconds of health (from :meth:`success`).
    A failure after a shorter healthy spell keeps growing the delay, so a server that accepts a
    watch and drops it at once cannot pull the proxy into a fast reconnect loop.
    """

    def __init__(
        self, policy: BackoffPolicy, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        self.policy = policy
        self._rng = rng
        self._clock = clock
        self._attempt = 0
        self._current_delay = 0.0
        self._healthy_since: float | None = None

    @property
    def attempt(self) -> int:
        """The attempt number the next failure will use (0 once reset)."""
        if self._healthy_long_enough():
            return 0
        return self._attempt

    @property
    def current_delay(self) -> float:
        """The delay last returned by :meth:`failure`, 0.0 before any failure."""
        return self._current_delay

    @property
    def healthy_since(self) -> float | None:
        """The clock reading at which the connection became healthy, None while failing."""
        return self._healthy_since

    def failure(self) -> float:
        """Record a failure; return how long to wait before the next attempt."""
        if self._healthy_long_enough():
            self._attempt = 0
        self._healthy_since = None
        delay = self.policy.delay(self._attempt, self._rng)
        self._attempt += 1
        self._current_delay = delay
        return delay

    def success(self) -> None:
        """Mark the connection healthy now; repeated calls keep the first healthy moment."""
        if self._healthy_since is None:
            self._healthy_since = self._clock()

    def reset(self) -> None:
        """Forget all failures (e.g. after a configuration change)."""
        self._attempt = 0
        self._current_delay = 0.0

    def _healthy_long_enough(self) -> bool:
        if self._healthy_since is None:
            return False
        return self._clock() - self._healthy_since >= self.policy.reset_after
