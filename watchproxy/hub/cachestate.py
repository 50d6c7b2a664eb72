"""The current objects of one shared watch, in the form its representation keeps them.

Part of :class:`~watchproxy.hub.watchcache.WatchCache` (which owns one): the objects by key,
each with its resourceVersion and encoded size, and the running total of those sizes (what
``hub.cache_max_bytes`` bounds). A JSON representation keeps each object as its ADDED line
(see ``JsonRepresentation``): initial syncs write those lines as they are and lists splice
them; nothing here parses an object back except :meth:`CacheState.object_of`. Pure.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from watchproxy.hub.cachetypes import ADDED, ListedObject, parse_rv
from watchproxy.kube.representation import Representation

Obj = dict[str, Any]


@dataclass(slots=True)
class Entry:
    kept: Any  # what the representation keeps of the object (see Representation.keep)
    rv: int
    size: int  # bytes of its encoded form, counted in CacheState.bytes
    added_line: bytes | None = None  # synthetic ADDED, encoded on first use


def listed(rep: Representation, obj: Obj, line: bytes | None = None) -> ListedObject:
    """``obj`` of a LIST page in the form the cache keeps (the fetcher calls this per page, so
    that a collection is never held as parsed objects all at once). ``line``: its ADDED event
    line, if the representation made it already."""
    line = line or rep.encode_event(ADDED, obj)
    kept = rep.keep(ADDED, obj, line)
    return ListedObject(rep.object_key(obj), parse_rv(rep.object_rv(obj)), kept, len(line))


def keyed(rep: Representation, items: Sequence[Obj | ListedObject]) -> dict[str, Entry]:
    """A LIST's objects by key, as entries."""
    out: dict[str, Entry] = {}
    for item in items:
        one = item if isinstance(item, ListedObject) else listed(rep, item)
        out[one.key] = Entry(one.kept, one.rv, one.size)
    return out


class CacheState:
    """Objects by key; ``bytes`` is the sum of their encoded sizes."""

    def __init__(self, rep: Representation) -> None:
        self._rep = rep
        self._entries: dict[str, Entry] = {}
        self.bytes = 0
        # added_lines() of the current objects, until they change: concurrent initial syncs
        # of one state share one list (10,000 references are 80 KB per syncing client).
        self._lines: list[bytes] | None = None
        # The keys in the apiserver's order: etcd and the apiserver's watch cache list by key,
        # and ``kubectl get`` prints what the LIST returns (insertion order put the objects
        # created after the sync at the end). Sorted on first use after a relist, then kept
        # by insertion and removal (a memmove, not a sort, per object added or deleted).
        self._order: list[str] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def reset(self, entries: dict[str, Entry]) -> None:
        self._lines = None
        self._order = None
        self._entries = entries
        self.bytes = sum(entry.size for entry in entries.values())

    def put(self, key: str, entry: Entry) -> None:
        self._lines = None
        old = self._entries.get(key)
        self._entries[key] = entry
        if old is None and self._order is not None:
            bisect.insort(self._order, key)
        self.bytes += entry.size - (old.size if old is not None else 0)

    def keep(self, key: str, event_type: str, obj: Obj, line: bytes, rv: int) -> None:
        """The object of an upstream event (``line``: its encoded event) is now current."""
        self.put(key, Entry(self._rep.keep(event_type, obj, line), rv, len(line)))

    def pop(self, key: str) -> Entry | None:
        self._lines = None
        old = self._entries.pop(key, None)
        if old is not None:
            if self._order is not None:
                del self._order[bisect.bisect_left(self._order, key)]
            self.bytes -= old.size
        return old

    def relist_changes(
        self, listed: dict[str, Entry]
    ) -> tuple[list[tuple[int, str, Entry]], list[str]]:
        """What a relist to ``listed`` changes: the new or changed entries in order of their
        RV (then key), and the keys gone, sorted."""
        changed = [
            (entry.rv, key, entry)
            for key, entry in listed.items()
            if (old := self._entries.get(key)) is None or old.rv != entry.rv
        ]
        changed.sort(key=lambda c: (c[0], c[1]))
        return changed, sorted(key for key in self._entries if key not in listed)

    def object_of(self, entry: Entry) -> Obj:
        return self._rep.kept_object(entry.kept)

    def objects(self) -> list[Obj]:
        """The current objects in key order (watch-event form; do not mutate them)."""
        return [self._rep.kept_object(self._entries[key].kept) for key in self.ordered_keys()]

    def ordered_keys(self) -> Sequence[str]:
        """Every key, sorted as etcd sorts them (bytes of "namespace/name"; the keys are
        ASCII, where code points and bytes sort alike). Read-only, and only until the next
        change: the list is updated in place."""
        if self._order is None:
            self._order = sorted(self._entries)
        return self._order

    def _namespace_keys(self, namespace: str) -> Sequence[str]:
        """The keys of ``namespace``'s objects: one contiguous run of the sorted keys."""
        order = self.ordered_keys()
        prefix = namespace + "/"
        start = bisect.bisect_left(order, prefix)
        return order[start : bisect.bisect_left(order, namespace + "0", start)]  # "0" follows "/"

    def list_body(self, rv: str, namespace: str | None = None) -> bytes:
        """A LIST response body of the current objects at ``rv``, in key order (those of
        ``namespace`` only, when given: keys of namespaced objects start with it and a slash)."""
        keys = self.ordered_keys() if namespace is None else self._namespace_keys(namespace)
        entries = self._entries
        return self._rep.encode_kept_list([entries[key].kept for key in keys], rv)

    def list_pieces(self, rv: str, namespace: str | None = None) -> Iterator[bytes]:
        """:meth:`list_body` in pieces, encoded as they are asked for, from the objects kept
        now (later changes leave it alone)."""
        keys = self.ordered_keys() if namespace is None else self._namespace_keys(namespace)
        entries = self._entries
        return self._rep.kept_list_pieces([entries[key].kept for key in keys], rv)

    def page_pieces(
        self, kept: list[Any], rv: str, page: tuple[str, int | None] | None
    ) -> Iterator[bytes]:
        """A LIST (``page`` None) or a page that more follow, of ``kept``, in pieces."""
        return self._rep.kept_list_pieces(kept, rv, page)

    def count_in(self, namespace: str) -> int:
        return len(self._namespace_keys(namespace))

    def sorted_kept(self, namespace: str | None = None) -> tuple[list[str], list[Any]]:
        """The keys (of ``namespace``) in order and their kept objects: a snapshot that later
        changes leave alone (new lists of references to what is kept now)."""
        keys = list(self.ordered_keys() if namespace is None else self._namespace_keys(namespace))
        entries = self._entries
        return keys, [entries[key].kept for key in keys]

    def encode_list(self, kept: list[Any], rv: str) -> bytes:
        """A LIST response body of ``kept`` objects (from :meth:`sorted_kept`) at ``rv``."""
        return self._rep.encode_kept_list(kept, rv)

    def encode_page(self, kept: list[Any], rv: str, token: str, remaining: int | None) -> bytes:
        """A page of a LIST that more pages follow (see ``watchproxy.lists.pages``)."""
        return self._rep.encode_kept_page(kept, rv, token, remaining)

    def added_lines(self) -> Sequence[bytes]:
        """An ADDED line per object (the start of a watch without a resourceVersion); shared
        by every caller until the objects change, so read-only."""
        if self._lines is not None:
            return self._lines
        lines: list[bytes] = []
        entries = self._entries
        for key in self.ordered_keys():  # the apiserver sends initial events in key order too
            entry = entries[key]
            line = self._rep.kept_added_line(entry.kept) or entry.added_line
            if line is None:
                line = entry.added_line = self._rep.encode_event(ADDED, entry.kept)
            lines.append(line)
        self._lines = lines
        return lines
