"""Watches from "now" served from a shared watch only once its state is as new as the apiserver's.

A watch without a resourceVersion asks for the current state and the changes after it, and the
apiserver answers it consistently: from 1.34 it turns it into a watch-list (``sendInitialEvents``
with ``NotOlderThan``), reads etcd's current revision R and serves the initial events once its
watch cache has caught up with R (``Cacher.getWatchCacheResourceVersion`` and
``waitUntilWatchCacheFreshAndForceAllEvents``); before, etcd served such a watch itself. Either
way every write that finished before the request is in the initial events. A shared watch's
state lags the apiserver by the events still on their way to it, so a client joining it gets
the state only once it is known to hold everything up to R:

1. R is read with a one-item LIST sent after the client's request arrived (a consistent read);
2. a state already at R or later is current;
3. a state that moves is waited for, as for a consistent LIST;
4. otherwise a short upstream watch of the key from the state's resourceVersion C replays the
   key's changes after C: the apiserver, having answered the consistent read at R, holds them
   all and sends them at once. None up to R: the state at C is the state at R. Some: the state
   is current once it reaches the last of them, which is on its way to the shared watch.

A watch that cannot be shown current is passed through, and the apiserver answers it — except
while the apiserver cannot answer (no answer, a 5xx or a 429 to the probe or the replay), when
nothing better than the state exists and the client is served from it (the shared watch resumes
behind it, as for every client of an outage).
A shared watch whose first LIST had not been sent when the client arrived (made for it, or
just made for another) is current by construction: the multiplexer does not check it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from watchproxy.hub.fetcher import REPLAY_FAILED, UNAVAILABLE
from watchproxy.hub.sharedwatch import SharedWatch
from watchproxy.hub.watchcache import WatchCache

log = logging.getLogger("watchproxy.hub")

# How long a state may take to reach the last change a replay showed (it is in flight).
REPLAYED_CHANGE_WAIT = 3.0
# A state that has not moved for this many waits is quiet: its next move is not expected soon
# (consistent LISTs, in lists/fresh.py, follow the same rule through these functions).
QUIET_AFTER_WAITS = 4


class Moving(Protocol):
    """A shared watch's state as these checks read it (``SharedWatch`` fits, and so does the
    watch a LIST reads)."""

    @property
    def advanced_at(self) -> float | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def cache(self) -> WatchCache: ...

    async def wait_change(self, timeout: float) -> None: ...


def looks_busy(shared: Moving, wait: float, now: float) -> bool:
    """Whether the state moved recently enough that waiting for it may pay."""
    moved = shared.advanced_at
    return moved is not None and now - moved <= wait * QUIET_AFTER_WAITS


async def caught_up(shared: Moving, rv: int, wait: float, clock: Callable[[], float]) -> bool:
    """Whether ``shared``'s state is at ``rv`` or later within ``wait`` seconds (False if the
    shared watch ends first). True means: answer from it now, before the next await."""
    deadline = clock() + wait
    while True:
        state_rv = shared.cache.resource_version
        if state_rv is not None and state_rv >= rv and not shared.closed:
            return True
        remaining = deadline - clock()
        if remaining <= 0 or shared.closed:
            return False
        await shared.wait_change(remaining)


async def not_current(
    shared: SharedWatch, resource_version: str | None, wait: float, clock: Callable[[], float]
) -> bool:
    """Whether a watch from ``resource_version`` must be passed through: it asks for the
    current state (no resourceVersion, or an empty one) and ``shared``'s is not shown to be."""
    return not resource_version and not await is_current(shared, wait, clock)


async def is_current(shared: SharedWatch, wait: float, clock: Callable[[], float]) -> bool:
    """Whether ``shared``'s state holds every write that finished before this call; False:
    pass the watch through. Probes are counted in ``watchproxy_freshness_probes_total``."""
    fetcher = shared.fetcher
    shared.metrics.freshness_probes.inc()
    current = await fetcher.current_rv()
    if current is None:
        return False  # refused: the apiserver answers the watch itself
    if current == UNAVAILABLE:
        return True  # the apiserver cannot answer now: the state is the best there is
    # A state that moves is waited for; a quiet one would wait for nothing.
    busy = wait > 0 and looks_busy(shared, wait, clock())
    if await caught_up(shared, current, wait if busy else 0.0, clock):
        return True
    since = shared.cache.resource_version_str
    if since is None or shared.closed:
        return False
    newest = await fetcher.replay(since, current)
    if newest in (REPLAY_FAILED, UNAVAILABLE):
        log.debug("no replay of %s from %s", shared.key.collection_path, since)
        return newest == UNAVAILABLE
    if newest is None:
        return True  # nothing of this key changed between the state and R
    return await caught_up(shared, newest, REPLAYED_CHANGE_WAIT, clock)
