"""Scheduled outages of the fake apiserver, for the demo: ``--outage 30s@60s`` takes it away for
30 s, 60 s after the start, so that a new user sees watchproxy back off and recover."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .faults import OUTAGE_MODES, Faults

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``1.5m``, ``1m30s``, ``2h``: seconds. Raises ValueError."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration (like 30s, 2m, 1m30s)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


@dataclass(frozen=True, order=True)
class Outage:
    """The apiserver is unreachable from ``start`` to ``start + duration`` (seconds after the
    demo started)."""

    start: float
    duration: float

    @property
    def end(self) -> float:
        return self.start + self.duration


def parse_outage(text: str) -> Outage:
    """``DURATION@START``, e.g. ``30s@60s``. Raises ValueError with a one-line reason."""
    duration, sep, start = text.partition("@")
    if not sep:
        raise ValueError(f"{text!r} must be DURATION@START, like 30s@60s")
    outage = Outage(parse_duration(start), parse_duration(duration))
    if outage.duration <= 0:
        raise ValueError(f"{text!r}: the duration must be > 0")
    return outage


def check_schedule(outages: Sequence[Outage]) -> list[Outage]:
    """Sorted by start; overlapping outages are refused (ValueError)."""
    ordered = sorted(outages)
    for before, after in itertools.pairwise(ordered):
        if after.start < before.end:
            raise ValueError(
                f"outages overlap: {before.duration:g}s@{before.start:g}s and "
                f"{after.duration:g}s@{after.start:g}s"
            )
    return ordered


class OutageSchedule:
    """Runs the outages in a task this object owns (``start()``; ``stop()`` cancels it and
    brings the apiserver back if it is down). ``say`` gets one line at each change."""

    def __init__(
        self,
        faults: Faults,
        outages: Sequence[Outage],
        *,
        mode: str = "refuse",
        say: Callable[[str], None] = print,
        hint: str = "",
    ) -> None:
        if mode not in OUTAGE_MODES:
            raise ValueError(f"outage mode must be one of {', '.join(OUTAGE_MODES)}")
        self.faults = faults
        self.outages = check_schedule(outages)
        self.mode = mode
        self.say = say
        self.hint = hint
        self.done = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and self.outages:
            self._task = asyncio.get_running_loop().create_task(self._run(time.monotonic()))

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.faults.outage_mode is not None:
            await self.faults.recover()

    async def _run(self, started: float) -> None:
        what = {"refuse": "connections refused", "reset": "connections reset", "503": "503s"}
        for outage in self.outages:
            await asyncio.sleep(max(0.0, started + outage.start - time.monotonic()))
            await self.faults.outage(self.mode)
            self.say(
                f"{_now()} apiserver DOWN for {outage.duration:g}s ({what[self.mode]})"
                + (f": {self.hint}" if self.hint else "")
            )
            await asyncio.sleep(max(0.0, started + outage.end - time.monotonic()))
            await self.faults.recover()
            self.done += 1
            self.say(
                f"{_now()} apiserver back: watchproxy reconnects at its next backoff attempt, "
                "and open watches resume where they were"
            )


def _now() -> str:
    return time.strftime("%H:%M:%S")
