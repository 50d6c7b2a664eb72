"""Current state and bounded event history of one shared watch: pure, synchronous, clock passed in.

The hub feeds one upstream LIST (:meth:`WatchCache.replace`) then the upstream WATCH
(:meth:`WatchCache.apply`, :meth:`WatchCache.bookmark`) into a ``WatchCache``; every event is
decoded once and encoded once (``CachedEvent.line``). A subscriber is a cursor (a ``seq``) into
the history; :meth:`WatchCache.plan` says where a new subscriber starts and what it gets first.

resourceVersions are compared as integers (the hub shares only keys whose RVs parse as
decimal integers) and handed to clients exactly as upstream spelled them.

Relist without breaking streams: a later :meth:`WatchCache.replace` (after an upstream 410)
appends the diff to the current state: ADDED/MODIFIED in ascending order of their own RV, then
DELETED for objects gone, carrying the last known state at the LIST's RV (the first RV at which
each is known gone; last, so that no client's RVs go backwards). These events can share the list
RV ``L``. A client holding ``L`` has had the whole group, and a resume at ``L`` gets only what
came after it, like any other RV. Mechanism of the old duplicates: the group used to be replayed
to every resume at exactly ``L`` (in case the client had stopped inside it), so every client that
re-watched at ``L`` before anything newer arrived (a bookmark at ``L``, a client-go ``Watch``
re-opened on a timer) got the whole group again, each time. ``L`` is trustworthy because the hub
never ends a stream inside a group by itself: the subscriber writes the rest of the group before
it stops, or, when it cannot (the client fell too far behind), ends with the 410 line so that the
client relists instead of resuming at ``L`` (``CachedEvent.ends_group`` marks the group's last
event). Only a client that breaks its own stream inside a group can hold ``L`` without all of it;
the subscriber counts those (``watchproxy_relist_group_cuts_total``). Relist events below the
cache's RV (anomalous data, see :meth:`WatchCache.replace`) are not at a list RV: a resume at
their RV replays them (at least once).

A relist from cache RV ``R`` to list RV ``L`` is a gap in the history: a client whose state is
at an RV strictly between them may hold an object created and deleted within the gap, which no
diff can know to delete, or may have read part of the diff. :meth:`WatchCache.plan` answers such
an RV ``expired`` (the apiserver's 410 for ``R`` is what made it ambiguous: passing it through
could lose deletes silently), and a subscriber that joined ahead of the cache with such an RV is
ended by :meth:`WatchCache.events_from` (pass its ``start_rv``).

The window starts where the clients need it (issue 18). Mechanism of the old spurious 410s: the
first list set the oldest resumable RV to the list's RV, so a client whose RV was even one change
older (an informer that had just LISTed, a client resuming after a restart) was told 410 though
the apiserver still had that history. Now the first :meth:`WatchCache.replace`
may be given a ``floor``: the oldest RV a waiting client asked for, older than the list. The
upstream watch is then opened from the floor, and the events it replays up to the list RV
("backfill") enter the history without touching the state, which the list already holds. Two
RVs follow: ``resource_version`` (what the state reflects) and ``stream_resource_version``
(up to where the history is complete: the upstream watch resumes from it, and bookmarks carry
it); they differ only during the backfill. If the apiserver answers 410 for the backfill,
:meth:`WatchCache.abandon_backfill` records a cutoff: subscribers that started below the list
RV read what they had, then get the apiserver's own 410 line and end.

Apart from those relist consequences, the cache makes up no 410: an RV older than its history
is ``outside_window``, and the hub passes that watch to the apiserver, whose answer (events or
its own 410) is the right one.

Eviction: beyond ``capacity`` events, beyond ``max_bytes``, and events older than ``max_age``.
Evicting an event makes RVs below its own
unresumable. A list older than the cache (an etcd restore, a stale read) raises
:class:`ListRegressed`; :meth:`WatchCache.reset` then starts over and evicts every cursor.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from watchproxy.errors import status_object
from watchproxy.hub.cachetypes import (
    ADDED,
    DELETED,
    MODIFIED,
    CachedEvent,
    ListedObject,
    ListRegressed,
    NotSynced,
    StartPlan,
    parse_rv,
)
from watchproxy.hub.historybudget import HistoryBudget
from watchproxy.hub.window import ResumeWindow
from watchproxy.kube.representation import Representation

_EVENT_TYPES = frozenset({ADDED, MODIFIED, DELETED})
Obj = dict[str, Any]


@dataclass(slots=True)
class _Entry:
    kept: Any  # what the representation keeps of the object (see Representation.keep)
    rv: int
    size: int  # bytes of its encoded form, counted in state_bytes
    added_line: bytes | None = None  # synthetic ADDED, encoded on first use


class WatchCache:
    """Current state + bounded history of one watch key.

    Guarantees: history RVs never decrease and seqs increase by one; every event in history
    with ``rv > N`` for ``N >= oldest_resumable_rv`` is retained, so a client at ``N`` that
    replays them (see :meth:`plan`) reaches the current state; events at or below the stream
    RV are never appended twice; an RV the history cannot serve is never answered with a
    made-up 410 (``outside_window``); the history holds at most ``capacity`` events and, once
    :meth:`apply` or :meth:`evict_expired` ran, none older than ``max_age``. No I/O, no
    locking.
    """

    def __init__(
        self,
        representation: Representation,
        *,
        capacity: int,
        max_age: float,
        clock: Callable[[], float],
        max_bytes: int = 0,
        budget: HistoryBudget | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if max_age <= 0:
            raise ValueError("max_age must be positive")
        self._rep = representation
        self._capacity = capacity
        self._max_age = max_age
        self._max_bytes = max_bytes  # 0: no bound of its own
        self._budget = budget
        self._clock = clock
        self._state: dict[str, _Entry] = {}
        self._state_bytes = 0
        self._events: list[CachedEvent] = []  # ring: live events are self._events[self._head:]
        self._head = 0
        self._bytes = 0
        self._next_seq = 0
        self._rv: int | None = None  # the state's RV
        self._rv_str: str | None = None
        self._stream: tuple[int, str] | None = None  # history complete up to here
        self._window = ResumeWindow()
        self._bookmark_cache: tuple[str, bytes] | None = None
        if budget is not None:
            budget.register(self)

    def detach(self) -> None:
        """The shared watch ends: its history no longer counts against the budget."""
        if self._budget is not None:
            self._budget.unregister(self)
            self._budget = None

    # --- properties ---------------------------------------------------------------------

    @property
    def representation(self) -> Representation:
        return self._rep

    @property
    def synced(self) -> bool:
        return self._rv is not None

    @property
    def resource_version(self) -> int | None:
        return self._rv

    @property
    def resource_version_str(self) -> str | None:
        return self._rv_str

    @property
    def stream_resource_version(self) -> int | None:
        """Every event up to this RV is in the history: the upstream watch resumes from here."""
        return self._stream[0] if self._stream is not None else None

    @property
    def stream_resource_version_str(self) -> str | None:
        return self._stream[1] if self._stream is not None else None

    @property
    def backfilling(self) -> bool:
        """The history is still being filled up to the state's RV (see the module docstring)."""
        return self._stream is not None and self._rv is not None and self._stream[0] < self._rv

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def oldest_seq(self) -> int:
        return self._next_seq - self.history_len()

    @property
    def oldest_resumable_rv(self) -> int | None:
        return self._window.oldest

    def __len__(self) -> int:
        return len(self._state)

    def history_len(self) -> int:
        return len(self._events) - self._head

    # --- feeding ------------------------------------------------------------------------

    def replace(
        self, items: Sequence[Obj | ListedObject], list_rv: str, *, floor: str | None = None
    ) -> list[CachedEvent]:
        """Apply a LIST; the first one syncs silently, later ones append the diff events.

        ``floor`` (first LIST only): the oldest RV a client waits for; when it is older than
        the list, the history starts there and the upstream watch must replay from it.
        """
        rv = parse_rv(list_rv)
        keyed = self._keyed(items)
        if self._rv is None:
            self._state = keyed
            self._state_bytes = sum(entry.size for entry in keyed.values())
            self._set_rv(rv, list_rv)
            self._stream = (rv, list_rv)
            start = rv
            if floor is not None and parse_rv(floor) < rv:
                start = parse_rv(floor)
                self._stream = (start, floor)
            self._window.start(start)
            return []
        if self.backfilling:
            raise RuntimeError("relist during a backfill: abandon_backfill() first")
        if rv < self._rv:
            raise ListRegressed(f"list resourceVersion {rv} is older than the cache's {self._rv}")
        self._window.relisted(self._next_seq, self._rv, rv)
        now = self._clock()
        changed = [
            (entry.rv, key, entry)
            for key, entry in keyed.items()
            if (old := self._state.get(key)) is None or old.rv != entry.rv
        ]
        changed.sort(key=lambda c: (c[0], c[1]))
        gone = sorted(key for key in self._state if key not in keyed)
        out: list[CachedEvent] = []
        at_least = self._rv
        for obj_rv, key, entry in changed:
            event_type = MODIFIED if key in self._state else ADDED
            self._put(key, entry)
            at_least = max(at_least, obj_rv)  # only anomalous data is below the cache RV
            obj = self._rep.kept_object(entry.kept)
            out.append(self._append(event_type, at_least, key, obj, now, relist=True))
        for key in gone:
            last = self._pop(key)
            assert last is not None
            obj = self._rep.with_rv(self._rep.kept_object(last.kept), list_rv)
            out.append(self._append(DELETED, rv, key, obj, now, relist=True))
        if out:
            out[-1] = self._events[-1] = dataclasses.replace(out[-1], ends_group=True)
        self._set_rv(rv, list_rv)
        self._stream = (rv, list_rv)
        self._evict(now)
        return out

    def reset(self, items: Sequence[Obj | ListedObject], list_rv: str) -> None:
        """Start over from a LIST that cannot be diffed (see :class:`ListRegressed`).

        Every current cursor is evicted (``events_from`` answers None: one seq is skipped
        so that even a caught-up cursor is) and only RVs at or after ``list_rv`` are
        resumable.
        """
        rv = parse_rv(list_rv)
        self._state = self._keyed(items)
        self._state_bytes = sum(entry.size for entry in self._state.values())
        self._charge(-self._bytes)
        self._events, self._head, self._bytes = [], 0, 0
        self._next_seq += 1
        self._rv, self._rv_str = rv, list_rv
        self._stream = (rv, list_rv)
        self._window.start(rv)
        self._bookmark_cache = None

    def apply(self, event_type: str, obj: Obj) -> CachedEvent | None:
        """An upstream ADDED/MODIFIED/DELETED; None if it is at or below the stream RV.

        During a backfill, an event at or below the state's RV enters the history only: the
        state already holds its effect.
        """
        if self._rv is None or self._stream is None:
            raise NotSynced("apply() before the first replace()")
        if event_type not in _EVENT_TYPES:
            raise ValueError(f"unexpected event type {event_type!r}")
        obj = self._rep.prepare(obj)
        rv_str = self._rep.object_rv(obj)
        rv = parse_rv(rv_str)
        if rv <= self._stream[0]:
            return None
        key = self._rep.object_key(obj)
        now = self._clock()
        event = self._append(event_type, rv, key, obj, now, relist=False)
        if rv > self._rv:
            if event_type == DELETED:
                self._pop(key)
            else:  # ADDED for a known key / MODIFIED for an unknown one: upsert, keep the type
                kept = self._rep.keep(event_type, obj, event.line)
                self._put(key, _Entry(kept, rv, len(event.line)))
            self._set_rv(rv, rv_str)
        self._stream = (rv, rv_str)
        self._evict(now)
        return event

    def bookmark(self, rv: str) -> None:
        """An upstream BOOKMARK: the history is complete up to ``rv``."""
        if self._rv is None or self._stream is None:
            raise NotSynced("bookmark() before the first replace()")
        value = parse_rv(rv)
        if value > self._stream[0]:
            self._stream = (value, rv)
        if value > self._rv:
            self._set_rv(value, rv)

    def abandon_backfill(self, line: bytes) -> None:
        """The apiserver answered 410 for the backfill: give it up (see the module docstring).

        Subscribers that started below the state's RV are cut once they have read what the
        history holds now, with ``line`` (the apiserver's ERROR event); RVs below the state's
        RV stop being resumable, and the stream goes on from the state's RV.
        """
        if not self.backfilling:
            return
        assert self._rv is not None and self._rv_str is not None
        self._window.cut(self._next_seq, self._rv, line)
        self._stream = (self._rv, self._rv_str)

    def evict_expired(self) -> int:
        """Drop events older than ``max_age``; returns how many were dropped."""
        return self._evict(self._clock())

    # --- serving ------------------------------------------------------------------------

    def plan(self, rv: str | None, *, send_initial_events: bool = False) -> StartPlan:
        """Where a subscriber asking for ``rv`` starts (see the module docstring)."""
        if self._rv is None or self._rv_str is None or self._stream is None:
            raise NotSynced("plan() before the first replace()")
        if rv in (None, "", "0") or send_initial_events:
            if send_initial_events and rv not in (None, ""):
                wanted = parse_rv(rv)
                if wanted > self._rv:
                    return StartPlan(
                        initial=[], next_seq=self._next_seq, min_rv=wanted, wait_rv=wanted
                    )
            initial = self._initial_lines()
            if send_initial_events:
                initial.append(self.bookmark_line(initial_events_end=True))
            # During a backfill the history below the state's RV is already in ``initial``.
            skip = self._rv if self.backfilling else -1
            return StartPlan(
                initial=initial,
                next_seq=self._next_seq,
                initial_rv=self._rv_str,
                min_rv=skip,
                start_rv=self._rv,
            )
        wanted = parse_rv(rv)
        if self._window.expired(wanted):
            return StartPlan(initial=[], next_seq=self._next_seq, expired=True)
        if self._window.outside(wanted):
            return StartPlan(initial=[], next_seq=self._next_seq, outside_window=True)
        if wanted > self._stream[0]:
            return StartPlan(initial=[], next_seq=self._next_seq, min_rv=wanted, start_rv=wanted)
        events, head = self._events, self._head
        at = bisect.bisect_right(events, wanted, lo=head, key=lambda e: e.rv)
        # Relist events at exactly ``wanted`` are replayed unless ``wanted`` is their list's RV
        # (see the module docstring).
        trusted = self._window.is_list_rv(wanted)
        while at > head and events[at - 1].rv == wanted and events[at - 1].relist and not trusted:
            at -= 1
        next_seq = events[at].seq if at < len(events) else self._next_seq
        return StartPlan(initial=[], next_seq=next_seq, start_rv=wanted)

    def events_from(self, seq: int, start_rv: int = -1) -> Sequence[CachedEvent] | None:
        """Events with ``seq`` and later; None if that subscriber must be ended.

        None when ``seq`` was evicted (the cursor is too slow), when a relist at or after
        ``seq`` jumped over ``start_rv`` (the plan's: a subscriber that joined ahead of the
        cache cannot be reconciled), or at a backfill cutoff (:meth:`cut_line` then says what
        to write last). Before a cutoff that applies, only the events up to it are returned.
        """
        oldest = self.oldest_seq
        if seq < oldest:
            return None
        end = self._window.end_of(seq, start_rv, self._next_seq)
        if end is None:
            return None
        if seq >= end:
            return []
        return self._events[self._head + seq - oldest : self._head + end - oldest]

    def expired_line(self, rv: str) -> bytes:
        """An ERROR event with a 410 Expired Status for an ``expired`` plan's ``rv``."""
        oldest = self._window.oldest or 0
        shown = str(int(rv)) if rv.isascii() and rv.isdigit() else rv
        status = status_object(410, "Expired", f"too old resource version: {shown} ({oldest})")
        return self._rep.error_line(status)

    def cut_line(self, seq: int, start_rv: int) -> bytes | None:
        """The apiserver's 410 line for a subscriber at a backfill cutoff, else None."""
        return self._window.cut_line(seq, start_rv)

    def bookmark_line(self, *, initial_events_end: bool = False) -> bytes:
        """A BOOKMARK event at the stream RV: every event up to it is in the history."""
        if self._stream is None:
            raise NotSynced("bookmark_line() before the first replace()")
        rv_str = self._stream[1]
        if not initial_events_end and self._bookmark_cache is not None:
            cached_rv, line = self._bookmark_cache
            if cached_rv == rv_str:
                return line
        obj = self._rep.bookmark_object(rv_str, initial_events_end=initial_events_end)
        line = self._rep.encode_event("BOOKMARK", obj)
        if not initial_events_end:
            self._bookmark_cache = (rv_str, line)
        return line

    def objects_snapshot(self) -> list[Obj]:
        """The current objects (watch-event form; do not mutate them)."""
        return [self._rep.kept_object(entry.kept) for entry in self._state.values()]

    def list_response(self) -> bytes:
        """A LIST response body of the current state at its RV."""
        if self._rv_str is None:
            raise NotSynced("list_response() before the first replace()")
        kept = [entry.kept for entry in self._state.values()]
        return self._rep.encode_kept_list(kept, self._rv_str)

    def stats(self) -> dict[str, Any]:
        return {
            "objects": len(self._state),
            "history_events": self.history_len(),
            "history_bytes": self._bytes,
            "resource_version": self._rv_str,
            "oldest_resumable_rv": self._window.oldest,
            "oldest_seq": self.oldest_seq,
            "next_seq": self._next_seq,
        }

    # --- internals ----------------------------------------------------------------------

    def _keyed(self, items: Sequence[Obj | ListedObject]) -> dict[str, _Entry]:
        keyed: dict[str, _Entry] = {}
        for item in items:
            listed = item if isinstance(item, ListedObject) else self.listed(self._rep, item)
            keyed[listed.key] = _Entry(listed.kept, listed.rv, listed.size)
        return keyed

    @staticmethod
    def listed(rep: Representation, obj: Obj, line: bytes | None = None) -> ListedObject:
        """``obj`` of a LIST page in the form the cache keeps (the fetcher calls this per page,
        so that a collection is never held as parsed objects all at once). ``line``: its
        ADDED event line, if the representation made it already."""
        line = line or rep.encode_event(ADDED, obj)
        kept = rep.keep(ADDED, obj, line)
        return ListedObject(rep.object_key(obj), parse_rv(rep.object_rv(obj)), kept, len(line))

    def _set_rv(self, rv: int, rv_str: str) -> None:
        self._rv, self._rv_str = rv, rv_str

    def _initial_lines(self) -> list[bytes]:
        lines: list[bytes] = []
        for entry in self._state.values():
            line = self._rep.kept_added_line(entry.kept) or entry.added_line
            if line is None:
                line = entry.added_line = self._rep.encode_event(ADDED, entry.kept)
            lines.append(line)
        return lines

    def _append(
        self, event_type: str, rv: int, key: str, obj: Obj, now: float, *, relist: bool
    ) -> CachedEvent:
        line = self._rep.stream_line(event_type, obj)
        event = CachedEvent(self._next_seq, event_type, rv, key, line, now, relist)
        self._next_seq += 1
        self._events.append(event)
        self._bytes += len(line)
        self._charge(len(line))
        return event

    def _evict(self, now: float) -> int:
        events, evicted = self._events, 0
        deadline = now - self._max_age
        while self._head < len(events) and (
            len(events) - self._head > self._capacity
            or (self._max_bytes and self._bytes > self._max_bytes)
            or events[self._head].time < deadline
        ):
            self._drop_head()
            evicted += 1
        self._compact()
        if self._budget is not None:
            self._budget.enforce()
        return evicted

    @property
    def history_bytes(self) -> int:
        return self._bytes

    @property
    def state_bytes(self) -> int:
        """Bytes of the current objects, encoded (what hub.cache_max_bytes bounds)."""
        return self._state_bytes

    def _put(self, key: str, entry: _Entry) -> None:
        old = self._state.get(key)
        self._state[key] = entry
        self._state_bytes += entry.size - (old.size if old is not None else 0)

    def _pop(self, key: str) -> _Entry | None:
        old = self._state.pop(key, None)
        if old is not None:
            self._state_bytes -= old.size
        return old

    def shed_oldest(self) -> bool:
        """Evict the oldest event for the byte budget; False when only the newest is left:
        caught-up subscribers may not have been handed it yet, and losing it would end them."""
        if len(self._events) - self._head <= 1:
            return False
        self._drop_head()
        self._compact()
        return True

    def _drop_head(self) -> None:
        events = self._events
        gone = events[self._head]
        self._head += 1
        self._bytes -= len(gone.line)
        self._charge(-len(gone.line))
        # A client at gone.rv has seen gone and everything else at that RV — except at relist
        # events below their list's RV, which are replayed: with part of them gone, a client
        # at that RV could not get them all again, so that one RV becomes a (one-RV) gap.
        if (
            gone.relist
            and self._head < len(events)
            and events[self._head].rv == gone.rv
            and not self._window.is_list_rv(gone.rv)
        ):
            self._window.group_broken(gone.rv)
        self._window.evicted(gone.rv)

    def _charge(self, delta: int) -> None:
        if self._budget is not None:
            self._budget.charge(delta)

    def _compact(self) -> None:
        if self._head > 1024 and self._head * 2 > len(self._events):
            del self._events[: self._head]
            self._head = 0
