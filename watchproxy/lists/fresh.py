"""Consistent LISTs answered from a shared watch once it is known to be current.

A LIST without a resourceVersion must reflect every write that finished before it arrived. The
apiserver (KEP-2340) serves it from its watch cache after asking etcd for its current revision
and waiting until the cache has caught up with it. watchproxy does the same one level up: the
caller reads the apiserver's current revision R with a one-item LIST sent after the request
arrived, and the shared watch's state may answer once its resourceVersion is at least R. Events
reach a watch in resourceVersion order, so by then every write to the collection up to R is in
the state.

Unlike etcd, the apiserver cannot be asked for a progress notification: the state reaches R only
with the collection's next event, or its next bookmark (about once a minute). A collection that
changes often catches up within a fraction of a second; a quiet one would keep the client
waiting for nothing, so a watch whose state has not moved for a while is not tried at all, and
the wait is bounded in any case. Either way the LIST then goes to the apiserver.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from watchproxy.hub.freshwatch import caught_up, looks_busy
from watchproxy.lists.cover import Cover

__all__ = ["Misses", "looks_busy", "wait_current"]


async def wait_current(
    cover: Cover, current_rv: int, wait: float, clock: Callable[[], float]
) -> bool:
    """Whether the state reflects ``current_rv`` within ``wait`` seconds (False if the shared
    watch ends first). True means: answer from it now, before the next await."""
    return await caught_up(cover.shared, current_rv, wait, clock)


# How long a watch that left a LIST behind is not tried: doubled by each further miss, reset
# by a LIST it answers.
FIRST_PAUSE_SECONDS = 1.0
LONGEST_PAUSE_SECONDS = 60.0


W = TypeVar("W", bound=Hashable)


class Misses(Generic[W]):
    """Which shared watches recently left a consistent LIST behind (or gave no revision to wait
    for), so that their next LISTs go upstream at once instead of costing a probe and then
    their LIST (issue 43: at most one upstream request per client request).

    Why a pause, not a longer wait or a different probe: a watch's state reaches the probe's
    revision R only with the collection's next write or its watch's next bookmark (about once
    a minute), and R moves with every write to any resource. A collection written less often
    than the wait misses it however long the probe took, so the miss is a property of the
    watch, not of the request, and it repeats. The alternatives cost more than the miss:
    waiting for R holds the client up to the next bookmark; sending the client's own LIST as
    the probe (its head read for R, the rest relayed when the hub does not catch up, or cut
    when it does) makes every LIST the hub answers cost the apiserver a LIST set up and
    written until the cut, which on a collection of a few MB is all of it: the 1-item probe is
    what the hub saves (``bench.lists``: 1.5 MB upstream instead of 358 MB for 1,000 pods). So
    the probe stays, and a miss pauses the watch: after a miss at R, its LISTs go upstream
    without a probe for ``FIRST_PAUSE_SECONDS``, doubled for each further miss up to
    ``LONGEST_PAUSE_SECONDS``; a LIST it answers ends the streak. A watch that never catches
    up costs one extra request a minute, not one per LIST. Concurrent LISTs that shared the
    probe count as one miss (by its R). Pure: the clock is passed in."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        first: float = FIRST_PAUSE_SECONDS,
        longest: float = LONGEST_PAUSE_SECONDS,
    ) -> None:
        self._clock = clock
        self._first = first
        self._longest = longest
        # watch -> (the last revision it missed, misses in a row, paused until)
        self._missed: dict[W, tuple[int, int, float]] = {}

    def __len__(self) -> int:
        return len(self._missed)

    def paused(self, watch: W) -> bool:
        found = self._missed.get(watch)
        return found is not None and self._clock() < found[2]

    def missed(self, watch: W, revision: int | None) -> None:
        """``watch`` did not reach ``revision`` in time (None: there was no revision)."""
        last, streak, _ = self._missed.get(watch, (-1, 0, 0.0))
        if revision is not None and revision <= last:
            return  # another LIST of the same probe: the same miss
        streak += 1
        pause = min(self._longest, self._first * 2 ** (streak - 1))
        until = self._clock() + pause
        self._missed[watch] = (last if revision is None else revision, streak, until)

    def answered(self, watch: W) -> None:
        """``watch`` answered a LIST: it keeps up again."""
        self._missed.pop(watch, None)

    def forget(self, keep: Callable[[W], bool]) -> None:
        """Drop the watches ``keep`` says are gone (closed shared watches)."""
        for watch in [w for w in self._missed if not keep(w)]:
            del self._missed[watch]
