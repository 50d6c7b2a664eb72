"""The values a :class:`~watchproxy.hub.watchcache.WatchCache` hands out: cached events, start
plans, resourceVersions as integers, and its errors. Pure data, no logic beyond a comparison."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"

Obj = dict[str, Any]


def parse_rv(rv: str) -> int:
    """A resourceVersion as an integer; ``ValueError`` unless it is plain decimal digits."""
    if not rv.isascii() or not rv.isdigit():
        raise ValueError(f"resourceVersion {rv!r} is not a decimal integer")
    return int(rv)


class NotSynced(RuntimeError):
    """The cache has not received its first LIST yet."""


class ListRegressed(ValueError):
    """A relist's RV is older than the cache's: applying it would send clients back in time."""


@dataclass(frozen=True, slots=True)
class ListedObject:
    """A listed object in the form a watch cache keeps (see ``cachestate.listed``).

    Made as each LIST page arrives, so that a large collection is never held as parsed
    Python objects all at once: several bytes of RSS per byte of JSON, which the allocator
    then keeps (bench.collection; bench/README.md, "Figures behind the code").
    """

    key: str
    rv: int
    kept: Any
    size: int  # bytes of its encoded ADDED line: what it counts against hub.cache_max_bytes


@dataclass(frozen=True, slots=True)
class CachedEvent:
    """One event in the history; ``line`` is written unchanged to every subscriber."""

    seq: int  # position in this cache's history, strictly increasing by 1
    type: str  # ADDED | MODIFIED | DELETED
    rv: int  # the event's RV (relist DELETEs: the list RV); never decreases along the history
    key: str  # "namespace/name", or "name" if cluster-scoped
    line: bytes  # b'{"type":"ADDED","object":{...}}\n', compact JSON
    time: float  # clock() when it entered the cache
    relist: bool = False  # synthesised by a relist diff rather than received from upstream
    # The last event of its relist group: a client whose last event is a relist event without
    # this flag stopped inside the group (see ``watchcache``: it must not resume at that RV).
    ends_group: bool = False

    @property
    def inside_group(self) -> bool:
        return self.relist and not self.ends_group


@dataclass(frozen=True, slots=True)
class StartPlan:
    """Where a new subscriber starts.

    Write ``initial`` first, then ``events_from(next_seq, start_rv)`` onwards, skipping events
    for which :meth:`wants` is false. ``outside_window``: older than the history; only the
    apiserver can answer it. ``expired``: an RV that a relist made ambiguous (see the module
    docstring): send ``expired_line`` and end. ``wait_rv``:
    sendInitialEvents with an RV newer than the cache; plan again once
    ``resource_version >= wait_rv`` (or time out as the apiserver does).
    """

    initial: Sequence[bytes]  # shared with other subscribers: read-only
    next_seq: int
    outside_window: bool = False
    expired: bool = False
    initial_rv: str | None = None  # the RV at which ``initial`` is the complete state
    # Skip events with rv <= min_rv, and send no BOOKMARK below it: the client is ahead of
    # the history (its RV, or the state's RV during a backfill). -1: everything.
    min_rv: int = -1
    wait_rv: int | None = None
    # The RV the client's state is at when it starts: relist gaps and backfill cutoffs that
    # jump over it end the subscriber (see ``events_from``). -1: unknown / not needed.
    start_rv: int = -1

    def wants(self, event: CachedEvent) -> bool:
        return event.rv > self.min_rv
