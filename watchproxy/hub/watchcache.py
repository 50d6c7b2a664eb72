"""Current state and bounded event history of one shared watch: pure, synchronous, clock passed in.

The hub feeds one upstream LIST (:meth:`WatchCache.replace`) then the upstream WATCH
(:meth:`WatchCache.apply`, :meth:`WatchCache.bookmark`) in; every event is decoded once and
encoded once (``CachedEvent.line``). The objects are a :class:`CacheState`, the events a
:class:`HistoryRing`. A subscriber is a cursor (a ``seq``) into the history;
:meth:`WatchCache.plan` says where it starts and what it gets first. RVs are compared as
integers (only keys whose RVs are decimal are shared) and handed out as upstream spelled them.

Relist without breaking streams: a later :meth:`WatchCache.replace` (after an upstream 410)
appends the diff: ADDED/MODIFIED in ascending order of their own RV, then DELETED for objects
gone, with their last known state at the list's RV ``L`` (the first RV at which each is known
gone; last, so that no client's RVs go backwards). A client holding ``L`` has had the whole
group, and a resume at ``L`` gets what came after it. Replaying the group to every resume at
``L`` (in case the client had stopped inside it) would hand it again to each client that
re-watches at ``L`` before anything newer arrives (after a bookmark at ``L``, or on a timer).
``L`` can be trusted because the hub never ends a stream inside a group
by itself: the subscriber writes the rest first or, when it cannot, ends with the 410 line
(``CachedEvent.ends_group`` marks a group's last event); only a client that breaks its own
stream inside one can hold ``L`` without all of it (``watchproxy_relist_group_cuts_total``).
Relist events below the cache's RV (anomalous data) are not at a list RV: a resume at their RV
replays them.

The relist from cache RV ``R`` to ``L`` is a gap: a client at an RV strictly between them may
hold an object created and deleted within it, which no diff can know to delete, or may have
read part of the diff. :meth:`WatchCache.plan` answers such an RV ``expired`` (the apiserver's
410 for ``R`` made it ambiguous; passing it through could lose deletes silently), and
:meth:`WatchCache.events_from` ends a subscriber that joined ahead of the cache at such an RV.

The window starts where the clients need it: the first :meth:`WatchCache.replace` may
be given a ``floor``, and the events replayed from it up to the list RV ("backfill") enter the
history only (see ``window`` for the mechanism and the backfill cutoff).

Apart from those, the cache makes up no 410: an RV older than its history is
``outside_window``, and the hub passes that watch to the apiserver. Evicting an event makes RVs
below its own unresumable. A list older than the cache (an etcd restore, a stale read) raises
:class:`ListRegressed`; :meth:`WatchCache.reset` then starts over and evicts every cursor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from watchproxy.errors import status_object
from watchproxy.hub import cachestate
from watchproxy.hub.cachestate import CacheState
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
from watchproxy.hub.historyring import HistoryRing
from watchproxy.hub.window import ResumeWindow
from watchproxy.kube.representation import Representation

_EVENT_TYPES = frozenset({ADDED, MODIFIED, DELETED})
Obj = dict[str, Any]


class BookmarkLines:
    """BOOKMARK lines, encoded once per RV: every subscriber's bookmark at one RV is the same
    bytes (the initial-events-end one, sent once per client, is not kept)."""

    def __init__(self, rep: Representation) -> None:
        self._rep = rep
        self._last: tuple[str, bytes] | None = None

    def line(self, rv: str, *, initial_events_end: bool = False) -> bytes:
        if not initial_events_end and self._last is not None and self._last[0] == rv:
            return self._last[1]
        obj = self._rep.bookmark_object(rv, initial_events_end=initial_events_end)
        line = self._rep.encode_event("BOOKMARK", obj)
        if not initial_events_end:
            self._last = (rv, line)
        return line

    def forget(self) -> None:
        self._last = None


class WatchCache:
    """Current state + bounded history of one watch key.

    Guarantees: history RVs never decrease and seqs increase by one; every event in history
    with ``rv > N`` for ``N >= oldest_resumable_rv`` is retained, so a client at ``N`` that
    replays them (see :meth:`plan`) reaches the current state; events at or below the stream
    RV are never appended twice; an RV the history cannot serve is never answered with a
    made-up 410 (``outside_window``); the history holds at most ``capacity`` events and, right
    after each :meth:`apply` or :meth:`replace`, none older than ``max_age``. A quiet history
    is kept however old, as the apiserver's watch cache keeps its own: it costs no more memory
    with time (the byte budget bounds it anyway), and every event it holds is still a correct
    answer to a resume. No I/O, no locking.
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
        self._clock = clock
        self._state = CacheState(representation)
        self._ring = HistoryRing(
            capacity=capacity,
            max_age=max_age,
            max_bytes=max_bytes,
            budget=budget,
            on_drop=self._dropped,
        )
        self._rv: int | None = None  # the state's RV
        self._rv_str: str | None = None
        self._stream: tuple[int, str] | None = None  # history complete up to here
        self._window = ResumeWindow()
        self._bookmarks = BookmarkLines(representation)

    def detach(self) -> None:
        """The shared watch ends: its history no longer counts against the budget."""
        self._ring.detach()

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
        return self._ring.next_seq

    @property
    def oldest_seq(self) -> int:
        return self._ring.oldest_seq

    @property
    def oldest_resumable_rv(self) -> int | None:
        return self._window.oldest

    def __len__(self) -> int:
        return len(self._state)

    def history_len(self) -> int:
        return len(self._ring)

    # --- feeding ------------------------------------------------------------------------

    def replace(
        self, items: Sequence[Obj | ListedObject], list_rv: str, *, floor: str | None = None
    ) -> list[CachedEvent]:
        """Apply a LIST; the first one syncs silently, later ones append the diff events.

        ``floor`` (first LIST only): the oldest RV a client waits for; when it is older than
        the list, the history starts there and the upstream watch must replay from it.
        """
        rv = parse_rv(list_rv)
        keyed = cachestate.keyed(self._rep, items)
        if self._rv is None:
            self._state.reset(keyed)
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
        self._window.relisted(self._ring.next_seq, self._rv, rv)
        now = self._clock()
        changed, gone = self._state.relist_changes(keyed)
        out: list[CachedEvent] = []
        at_least = self._rv
        for obj_rv, key, entry in changed:
            event_type = MODIFIED if key in self._state else ADDED
            self._state.put(key, entry)
            at_least = max(at_least, obj_rv)  # only anomalous data is below the cache RV
            obj = self._state.object_of(entry)
            out.append(self._append(event_type, at_least, key, obj, now, relist=True))
        for key in gone:
            last = self._state.pop(key)
            assert last is not None
            obj = self._rep.with_rv(self._state.object_of(last), list_rv)
            out.append(self._append(DELETED, rv, key, obj, now, relist=True))
        if out:
            out[-1] = self._ring.end_group()
        self._set_rv(rv, list_rv)
        self._stream = (rv, list_rv)
        self._ring.evict(now)
        return out

    def reset(self, items: Sequence[Obj | ListedObject], list_rv: str) -> None:
        """Start over from a LIST that cannot be diffed (see :class:`ListRegressed`).

        Every current cursor is evicted (``events_from`` answers None: one seq is skipped
        so that even a caught-up cursor is) and only RVs at or after ``list_rv`` are
        resumable.
        """
        rv = parse_rv(list_rv)
        self._state.reset(cachestate.keyed(self._rep, items))
        self._ring.clear()
        self._rv, self._rv_str = rv, list_rv
        self._stream = (rv, list_rv)
        self._window.start(rv)
        self._bookmarks.forget()

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
                self._state.pop(key)
            else:  # ADDED for a known key / MODIFIED for an unknown one: upsert, keep the type
                self._state.keep(key, event_type, obj, event.line, rv)
            self._set_rv(rv, rv_str)
        self._stream = (rv, rv_str)
        self._ring.evict(now)
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
        self._window.cut(self._ring.next_seq, self._rv, line)
        self._stream = (self._rv, self._rv_str)

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
                        initial=[], next_seq=self._ring.next_seq, min_rv=wanted, wait_rv=wanted
                    )
            initial = self._state.added_lines()
            if send_initial_events:
                initial = [*initial, self.bookmark_line(initial_events_end=True)]
            # During a backfill the history below the state's RV is already in ``initial``.
            skip = self._rv if self.backfilling else -1
            return StartPlan(
                initial=initial,
                next_seq=self._ring.next_seq,
                initial_rv=self._rv_str,
                min_rv=skip,
                start_rv=self._rv,
            )
        wanted = parse_rv(rv)
        if self._window.expired(wanted):
            return StartPlan(initial=[], next_seq=self._ring.next_seq, expired=True)
        if self._window.outside(wanted):
            return StartPlan(initial=[], next_seq=self._ring.next_seq, outside_window=True)
        if wanted > self._stream[0]:
            return StartPlan(
                initial=[], next_seq=self._ring.next_seq, min_rv=wanted, start_rv=wanted
            )
        # Relist events at exactly ``wanted`` are replayed unless ``wanted`` is their list's RV
        # (see the module docstring).
        next_seq = self._ring.start_after(wanted, not self._window.is_list_rv(wanted))
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
        end = self._window.end_of(seq, start_rv, self._ring.next_seq)
        if end is None:
            return None
        if seq >= end:
            return []
        return self._ring.slice(seq, end)

    def expired_line(self, rv: str) -> bytes:
        """An ERROR event with the apiserver's 410 Expired Status for an ``expired`` plan's
        ``rv``."""
        shown = str(int(rv)) if rv.isascii() and rv.isdigit() else rv
        oldest = self._window.oldest or 0
        status = status_object(410, "Expired", f"too old resource version: {shown} ({oldest})")
        return self._rep.error_line(status)

    def cut_line(self, seq: int, start_rv: int) -> bytes | None:
        """The apiserver's 410 line for a subscriber at a backfill cutoff, else None."""
        return self._window.cut_line(seq, start_rv)

    def bookmark_line(self, *, initial_events_end: bool = False) -> bytes:
        """A BOOKMARK event at the stream RV: every event up to it is in the history."""
        if self._stream is None:
            raise NotSynced("bookmark_line() before the first replace()")
        return self._bookmarks.line(self._stream[1], initial_events_end=initial_events_end)

    @property
    def state(self) -> CacheState:
        """The current objects, to read (only the cache changes them)."""
        return self._state

    def list_response(self, namespace: str | None = None) -> bytes:
        """A LIST response body of the current state at its RV (one namespace's part)."""
        if self._rv_str is None:
            raise NotSynced("list_response() before the first replace()")
        return self._state.list_body(self._rv_str, namespace)

    def list_pieces(self, namespace: str | None = None) -> Iterator[bytes]:
        """:meth:`list_response` in pieces, encoded as they are written."""
        if self._rv_str is None:
            raise NotSynced("list_pieces() before the first replace()")
        return self._state.list_pieces(self._rv_str, namespace)

    def stats(self) -> dict[str, Any]:
        return {
            "objects": len(self._state),
            "history_events": self.history_len(),
            "history_bytes": self._ring.bytes,
            "resource_version": self._rv_str,
            "oldest_resumable_rv": self._window.oldest,
            "oldest_seq": self.oldest_seq,
            "next_seq": self._ring.next_seq,
        }

    # --- internals ----------------------------------------------------------------------

    def _set_rv(self, rv: int, rv_str: str) -> None:
        self._rv, self._rv_str = rv, rv_str

    def _append(
        self, event_type: str, rv: int, key: str, obj: Obj, now: float, *, relist: bool
    ) -> CachedEvent:
        line = self._rep.stream_line(event_type, obj)
        return self._ring.append(event_type, rv, key, line, now, relist=relist)

    @property
    def history_bytes(self) -> int:
        return self._ring.bytes

    @property
    def state_bytes(self) -> int:
        """Bytes of the current objects, encoded (what hub.cache_max_bytes bounds)."""
        return self._state.bytes

    def _dropped(self, gone: CachedEvent, oldest: CachedEvent | None) -> None:
        self._window.dropped(gone.rv, gone.relist, oldest.rv if oldest is not None else None)
