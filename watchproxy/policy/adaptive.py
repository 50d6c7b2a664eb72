"""An adaptive limit on upstream requests in flight: AIMD on the apiserver's own distress signals.

A fixed token bucket cannot tell a busy, healthy apiserver from a struggling one: set low, it
throttles one controller while the apiserver idles; set high, it protects nothing. The apiserver
says when it struggles: API Priority and Fairness answers 429, overloaded servers answer 5xx or
time out, and latency climbs before either. :class:`AdaptiveLimit` turns those signals into a
concurrency limit, in the manner of TCP congestion control and adaptive concurrency limiters:

- while the limit binds (requests wait for it) and answers are healthy, it grows by one per
  ``limit`` answers, about one per round trip (additive increase), but stops one short of the
  limit the last refusal came at until ``probe_hold_seconds`` have passed;
- a 429, a 5xx that means overload, a timeout or a broken connection cuts it (multiplicative
  decrease), once per generation: an answer to a request sent before the last cut says nothing
  about the limit that cut set, so one burst of refusals costs one cut, not fifty, while a
  refusal of a request sent under the new limit cuts again at once. (A time-based cool-down
  got this wrong both ways: on a loop slowed by its own start the cool-down outlasted the
  first burst, and refusals under the new limit went unanswered while the limit grew.)
  The cut is of the limit, not of the requests in flight when the signal came, as TCP cuts
  its flight size: against a priority level of a few seats that rejects
  (``bench.controller --pushback``), cutting the flight size held the limit lower and cost
  throughput for no fewer refusals (bench/README.md, "Figures behind the code");
- latency: per kind of request, a fast-moving average compared with a slow one; when the fast
  one runs at more than ``latency_tolerance`` times the slow one while the limit binds, the
  limit is cut gently. Comparing an average with its own history (a gradient) rather than
  with a fixed number keeps a large LIST from looking like distress next to a GET.

It never sleeps and never reads a clock: the caller passes ``now`` and the sample, and reads
:attr:`limit`. The last reason the limit moved is kept for the metrics.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = ["AdaptiveLimit", "AdaptiveSettings", "LimitReason", "Outcome"]


class Outcome(enum.Enum):
    """What one upstream request came back with, as far as the limit cares."""

    OK = "ok"
    THROTTLED = "429"  # the apiserver's flow control refused it
    OVERLOADED = "5xx"  # 500, 502, 503, 504: the apiserver or what fronts it is in trouble
    TIMEOUT = "timeout"
    BROKEN = "connection"  # an established connection broke before the answer


class LimitReason(enum.Enum):
    """Why the limit last changed (a metric's label values)."""

    INITIAL = "initial"
    GROWTH = "growth"
    THROTTLED = "429"
    OVERLOADED = "5xx"
    TIMEOUT = "timeout"
    BROKEN = "connection"
    LATENCY = "latency"


_CUT_REASON = {
    Outcome.THROTTLED: LimitReason.THROTTLED,
    Outcome.OVERLOADED: LimitReason.OVERLOADED,
    Outcome.TIMEOUT: LimitReason.TIMEOUT,
    Outcome.BROKEN: LimitReason.BROKEN,
}


@dataclass(frozen=True)
class AdaptiveSettings:
    """The knobs, with defaults that leave a healthy apiserver alone.

    ``initial`` is above what one busy client-go controller keeps in flight (its workers plus
    informers); the limit only grows past it while requests queue for it.
    """

    initial: int = 64
    minimum: int = 1
    maximum: int = 1000
    # Multiplicative decrease per distress signal.
    throttled_factor: float = 0.5
    overloaded_factor: float = 0.7
    latency_factor: float = 0.9
    # After a cut for refusals or overload, the limit it was cut from is a ceiling: growth stops
    # one short of it for this long, then probes past it again (the apiserver may have
    # recovered). Without it every climb back ends in one more refusal, one per sawtooth.
    probe_hold_seconds: float = 5.0
    latency_tolerance: float = 2.0
    # Weights of one sample in the fast and the slow moving average.
    fast_weight: float = 0.2
    slow_weight: float = 0.01
    # Samples of one kind before its averages are trusted.
    warmup_samples: int = 20

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                "need 1 <= minimum <= initial <= maximum, got "
                f"{self.minimum}, {self.initial}, {self.maximum}"
            )
        for name in ("throttled_factor", "overloaded_factor", "latency_factor"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise ValueError(f"{name} must be in (0, 1), got {value!r}")
        if not self.latency_tolerance > 1:
            raise ValueError(f"latency_tolerance must be > 1, got {self.latency_tolerance!r}")


class _Latency:
    """Fast and slow exponentially weighted averages of one kind of request's latency."""

    __slots__ = ("fast", "samples", "slow")

    def __init__(self) -> None:
        self.fast = 0.0
        self.slow = 0.0
        self.samples = 0

    def add(self, seconds: float, fast_weight: float, slow_weight: float) -> None:
        if self.samples == 0:
            self.fast = self.slow = seconds
        else:
            self.fast += fast_weight * (seconds - self.fast)
            self.slow += slow_weight * (seconds - self.slow)
        self.samples += 1


class AdaptiveLimit:
    """The current limit on upstream requests in flight, moved by what the answers say.

    Guarantees: ``minimum <= limit <= maximum`` always; it grows only on healthy answers that
    came while the limit was binding, by at most one per ``limit`` such answers; every distress
    signal about a request sent at or after the last cut cuts it by its factor (never below the
    minimum); a signal about a request sent before it changes nothing.
    """

    def __init__(self, settings: AdaptiveSettings | None = None) -> None:
        self.settings = settings or AdaptiveSettings()
        self._limit = self.settings.initial
        # Healthy answers while binding since the limit last moved: at ``limit`` it grows.
        self._credit = 0
        self.reason = LimitReason.INITIAL
        self.cuts: dict[LimitReason, int] = {reason: 0 for reason in _CUT_REASON.values()}
        self.cuts[LimitReason.LATENCY] = 0
        self._last_cut = -math.inf
        self._ceiling = math.inf
        self._ceiling_until = -math.inf
        self._latency: dict[str, _Latency] = {}

    @property
    def limit(self) -> int:
        """Requests that may be in flight at once."""
        return self._limit

    def record(
        self,
        now: float,
        outcome: Outcome,
        *,
        kind: str = "",
        latency: float | None = None,
        binding: bool = False,
        sent: float | None = None,
    ) -> bool:
        """Account for one answer. ``kind`` groups comparable requests (a verb) for the
        latency gradient; ``latency`` is None for answers whose time says nothing (streams);
        ``binding`` tells whether requests were waiting for the limit when this one ended;
        ``sent`` is when the request went out, on ``now``'s clock (None: just now). Returns
        True when :attr:`limit` changed."""
        before = self.limit
        current = (now if sent is None else sent) >= self._last_cut
        if outcome is not Outcome.OK:
            if current:
                self._cut(now, _CUT_REASON[outcome])
        elif latency is not None and self._latency_says_distress(kind, latency) and binding:
            if current:
                self._cut(now, LimitReason.LATENCY)
        elif binding and self._limit < self.settings.maximum and not self._held(now):
            self._credit += 1
            if self._credit >= self._limit:
                self._limit += 1
                self._credit = 0
                self.reason = LimitReason.GROWTH
        return self.limit != before

    def _held(self, now: float) -> bool:
        """Growth waits below the ceiling of the last refusal until its hold has passed."""
        return self._limit + 1 >= self._ceiling and now < self._ceiling_until

    def _latency_says_distress(self, kind: str, latency: float) -> bool:
        stats = self._latency.get(kind)
        if stats is None:
            stats = self._latency[kind] = _Latency()
        s = self.settings
        stats.add(latency, s.fast_weight, s.slow_weight)
        return stats.samples >= s.warmup_samples and stats.fast > s.latency_tolerance * stats.slow

    def _cut(self, now: float, reason: LimitReason) -> None:
        s = self.settings
        factor = {
            LimitReason.THROTTLED: s.throttled_factor,
            LimitReason.LATENCY: s.latency_factor,
        }.get(reason, s.overloaded_factor)
        if reason is not LimitReason.LATENCY:
            self._ceiling = float(self._limit)  # a float attribute (inf: no ceiling)
            self._ceiling_until = now + s.probe_hold_seconds
        self._limit = max(s.minimum, int(self._limit * factor))
        self._credit = 0
        self.reason = reason
        self.cuts[reason] += 1
        self._last_cut = now
        if reason is LimitReason.LATENCY:
            # The slow averages move to where latency is now: a new level is the new normal
            # once cut for, and only a further rise cuts again.
            for stats in self._latency.values():
                stats.slow = max(stats.slow, stats.fast)
