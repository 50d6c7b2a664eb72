"""LISTs in pages from the hub: the apiserver's continue tokens over short-lived snapshots.

The apiserver pages a LIST by key. Page 1 at revision R holds the first ``limit`` keys, and its
continue token says "R, after this key"; the next page reads etcd at R from there. The hub does
the same while it keeps page 1's state: a :class:`Snapshot` is the sorted keys and the kept
objects at R, references into the shared watch's state rather than copies.

The token is the apiserver's own: unpadded base64url of
``{"v":"meta.k8s.io/v1","rv":R,"start":KEY + "\\x00"}``, KEY relative to the LIST's prefix
("namespace/name" for a cluster-wide LIST, "name" for a namespaced one). A continuation that the
hub cannot serve from a snapshot (another replica's token, a snapshot that aged out or was
pushed out) therefore goes to the apiserver, which serves it from etcd at R, or answers 410
once R is compacted, exactly as for a token of its own. Pure.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

TOKEN_VERSION = "meta.k8s.io/v1"
# How long a page-1 snapshot is kept for its continuations: kubectl and client-go's pager ask
# for the next page as soon as they have read one, so a minute is generous.
SNAPSHOT_SECONDS = 60.0
# Objects the snapshots may hold in all (two references each, its key and its kept form: 8 MB
# of lists at most). A snapshot pushed out, or one larger than this, only sends its
# continuations upstream.
SNAPSHOT_MAX_ITEMS = 500_000


def encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": TOKEN_VERSION, "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str] | None:
    """(R, start key) of an apiserver continue token; None for anything else (the apiserver
    judges those: its 400 is the answer the client must get)."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(data, dict) or data.get("v") != TOKEN_VERSION:
        return None
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv <= 0 or not isinstance(start, str):
        return None
    return rv, start


@dataclass(frozen=True, slots=True)
class Snapshot:
    rv: int
    rv_str: str
    keys: Sequence[str]  # full cache keys ("namespace/name" or "name"), sorted
    kept: list[Any]  # the objects as the representation keeps them, in the same order


@dataclass(frozen=True, slots=True)
class Page:
    kept: list[Any]  # a slice of the snapshot's: the page's own list, handed to the encoder
    token: str | None  # None on the last page
    remaining: int | None  # remainingItemCount, with the token


def page_of(snapshot: Snapshot, start: str | None, limit: int, prefix: str) -> Page:
    """The page of ``snapshot`` from key ``prefix + start`` on (the whole snapshot's first page
    when ``start`` is None), at most ``limit`` objects (0: all). ``prefix`` is what the LIST's
    keys have in common ("namespace/" for a namespaced LIST) and tokens leave out."""
    keys = snapshot.keys
    first = 0 if start is None else bisect.bisect_left(keys, prefix + start)
    end = len(keys) if limit <= 0 else min(len(keys), first + limit)
    if end >= len(keys):
        return Page(snapshot.kept[first:end], None, None)
    last = keys[end - 1]
    token = encode_continue(snapshot.rv, last[len(prefix) :] + "\x00")
    return Page(snapshot.kept[first:end], token, len(keys) - end)


class Snapshots:
    """Page-1 snapshots by (shared watch, namespace, R), bounded in age and in objects."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        max_age: float = SNAPSHOT_SECONDS,
        max_items: int = SNAPSHOT_MAX_ITEMS,
    ) -> None:
        self._clock = clock
        self._max_age = max_age
        self._max_items = max_items
        self._kept: OrderedDict[tuple[Hashable, str | None, int], tuple[float, Snapshot]] = (
            OrderedDict()
        )
        self._items = 0

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, owner: Hashable, namespace: str | None, snapshot: Snapshot) -> None:
        key = (owner, namespace, snapshot.rv)
        old = self._kept.pop(key, None)
        if old is not None:
            self._items -= len(old[1].keys)
        self._kept[key] = (self._clock(), snapshot)
        self._items += len(snapshot.keys)
        self._trim()

    def get(self, owner: Hashable, namespace: str | None, rv: int) -> Snapshot | None:
        self._trim()
        found = self._kept.get((owner, namespace, rv))
        return None if found is None else found[1]

    def _trim(self) -> None:
        oldest_kept = self._clock() - self._max_age
        while self._kept:
            taken, snapshot = next(iter(self._kept.values()))
            if taken >= oldest_kept and self._items <= self._max_items:
                return
            self._kept.popitem(last=False)
            self._items -= len(snapshot.keys)
