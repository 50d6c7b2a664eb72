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
3. a state that moves is waited for, as for a consistent LIST: for ``IN_FLIGHT_SECONDS`` when
   step 4 can settle it (its events may be on their way, but so many writes elsewhere move R
   that its state most often has nothing left to reach), the whole wait otherwise;
4. otherwise, for a key of at most ``PROBE_MAX_OBJECTS`` objects, a watch-list of the key from
   R (``sendInitialEvents``, ``NotOlderThan``, JSON) is read up to its initial-events-end
   bookmark at some B >= R and closed: its objects are the key's state at B, which
   :func:`probe_difference` compares with ours (a quiet key answers within milliseconds, where
   step 5 takes a second). The same objects at the same resourceVersions: nothing the state
   (at its resourceVersion C) can show changed between C and B, and it is served; a state at
   B or later is current whatever it holds. Objects the probe holds newer, or that
   the state lacks: those writes are on their way to the shared watch, which is current once
   its state reaches the newest of them. Objects the state holds that the probe lacks were
   deleted at a resourceVersion the probe does not give: the state is current once it has
   dropped them too (and reached the newest change), within ``REPLAYED_CHANGE_WAIT``; else,
   or when the probe cannot tell (refused, as by an apiserver without watch-lists, too many
   objects, no bookmark in time), step 5.
   An object created and deleted between C and B is in neither, so a client may see its
   ADDED and DELETED after its initial events: those hold the state at B all the same;
5. a large key, or one the probe could not settle: a short upstream watch of the key from the
   state's resourceVersion C replays the key's changes after C (``REPLAY_SECONDS`` long: a
   plain watch has no end-of-replay marker): the apiserver, having answered the consistent
   read at R, holds them all and sends them at once. None up to R: the state at C is the
   state at R. Some: the state is current once it reaches the last of them, which is on its
   way to the shared watch.

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
from dataclasses import dataclass
from typing import Protocol

from watchproxy.hub.cachestate import CacheState
from watchproxy.hub.fetcher import REPLAY_FAILED, UNAVAILABLE
from watchproxy.hub.sharedwatch import SharedWatch
from watchproxy.hub.watchcache import WatchCache

log = logging.getLogger("watchproxy.hub")

# How long a state may take to reach the last change a replay showed (it is in flight).
REPLAYED_CHANGE_WAIT = 3.0
# A state that has not moved for this many waits is quiet: its next move is not expected soon
# (consistent LISTs, in lists/fresh.py, follow the same rule through these functions).
QUIET_AFTER_WAITS = 4
# How long a state that moves is waited for before a watch-list probe settles it (step 3): an
# event already on its way from a healthy apiserver arrives within this. Waiting longer holds
# every client of a key written lately for a change that, while writes to other resources move
# the revision (leases do every few seconds), most often is not coming: the probe answers in
# milliseconds (tests/component/test_fresh_watch.py, "just written").
IN_FLIGHT_SECONDS = 0.05
# The largest key a watch-list probe checks (step 4 above). The probe carries the key's whole
# state, once per client that joins it: a few hundred objects are well under a megabyte for
# the apiserver to send and for the proxy to parse, milliseconds, against the second a replay
# holds the client. A larger key's probe would cost more than that second saves; the replay's
# cost does not grow with the key.
PROBE_MAX_OBJECTS = 300


@dataclass(frozen=True, slots=True)
class Difference:
    """How a state differs from a probe of its key at ``probed_at``: ``newest``, the
    resourceVersion of the newest object the probe holds differently (None: none); ``gone``,
    the keys the state holds that the probe lacks, with the resourceVersion the state holds
    each at. (:func:`caught_up` waits for a bare resourceVersion as ``Difference(rv, rv, ())``.)"""

    probed_at: int
    newest: int | None
    gone: tuple[tuple[str, int], ...]

    @property
    def none(self) -> bool:
        return self.newest is None and not self.gone


def probe_difference(state: CacheState, probed_at: int, probed: dict[str, int]) -> Difference:
    """``state`` against ``probed``, a probe's objects at ``probed_at`` (key ->
    resourceVersion)."""
    newest: int | None = None
    for key, rv in probed.items():
        entry = state.get(key)
        if entry is None or entry.rv != rv:
            newest = rv if newest is None else max(newest, rv)
    gone: list[tuple[str, int]] = []
    for key in state:
        if key not in probed:
            entry = state.get(key)
            if entry is not None:
                gone.append((key, entry.rv))
    return Difference(probed_at, newest, tuple(gone))


def reached(state: CacheState, state_rv: int | None, difference: Difference) -> bool:
    """Whether ``state`` (at ``state_rv``) holds every change ``difference`` showed: at the
    probe's resourceVersion or later, or at the newest changed object or later and without
    any of the gone objects as they were."""
    if state_rv is not None and state_rv >= difference.probed_at:
        return True
    if difference.newest is not None and (state_rv is None or state_rv < difference.newest):
        return False
    for key, rv in difference.gone:
        entry = state.get(key)
        if entry is not None and entry.rv == rv:
            return False
    return True


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
    return await settled(shared, Difference(rv, rv, ()), wait, clock)


async def settled(
    shared: Moving, difference: Difference, wait: float, clock: Callable[[], float]
) -> bool:
    """Whether ``shared``'s state holds every change ``difference`` showed within ``wait``
    seconds (False if the shared watch ends first). True: answer from it now."""
    deadline = clock() + wait
    while True:
        cache = shared.cache
        if not shared.closed and reached(cache.state, cache.resource_version, difference):
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
    pass the watch through. Probes are counted in ``watchproxy_freshness_probes_total``, the
    watch-lists among them in ``watchproxy_freshness_watch_lists_total``."""
    fetcher = shared.fetcher
    shared.metrics.freshness_probes.inc()
    current = await fetcher.current_rv()
    if current is None:
        return False  # refused: the apiserver answers the watch itself
    if current == UNAVAILABLE:
        return True  # the apiserver cannot answer now: the state is the best there is
    # A state that moves is waited for, briefly where a probe can settle it; a quiet one would
    # wait for nothing.
    probe_settles = len(shared.cache) <= PROBE_MAX_OBJECTS
    busy = wait > 0 and looks_busy(shared, wait, clock())
    waited = (min(wait, IN_FLIGHT_SECONDS) if probe_settles else wait) if busy else 0.0
    if await caught_up(shared, current, waited, clock):
        return True
    if shared.closed:
        return False
    if probe_settles:
        outcomes = shared.metrics.freshness_watch_lists
        probed = await fetcher.probe(current, PROBE_MAX_OBJECTS)
        if probed == UNAVAILABLE:
            outcomes.labels("unavailable").inc()
            return True
        if isinstance(probed, tuple):
            difference = probe_difference(shared.cache.state, probed[0], probed[1])
            if difference.none and not shared.closed:
                outcomes.labels("same").inc()
                return True  # the state at C is the state at B >= R
            if await settled(shared, difference, REPLAYED_CHANGE_WAIT, clock):
                outcomes.labels("caught-up").inc()
                return True
        # Not settled (a gone object still held, a change not arriving) or not told: replay.
        outcomes.labels("replayed").inc()
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
