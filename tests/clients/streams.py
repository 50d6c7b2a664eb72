"""Compare what a client printed with the fake apiserver's own record of changes (pure)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubefake import Change, Store
from kubefake.selectors import Filter
from kubefake.watch import filter_change

Line = Mapping[str, Any]
OBJECT_EVENTS = ("ADDED", "MODIFIED", "DELETED", "SYNC")


@dataclass(frozen=True, order=True)
class Event:
    """One object event reduced to what the comparison needs."""

    type: str
    name: str
    rv: int

    def __str__(self) -> str:
        return f"{self.type} {self.name}@{self.rv}"


class ChangeLog:
    """Every change of one resource, as the fake's store made it.

    It subscribes to the store instead of reading the store's history ring, because the ring is
    bounded and a compaction empties it, while the tests need the whole record.
    """

    def __init__(self, store: Store, resource: str = "pods") -> None:
        self.changes: list[Change] = []
        self._unsubscribe: Callable[[], None] | None = store.subscribe(
            resource, self.changes.append
        )

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def seen_by(self, flt: Filter, after: int, upto: int | None = None) -> list[Event]:
        """The events an apiserver watch with ``flt`` sends for changes in (after, upto]:
        leaving the selector is a DELETED, entering it an ADDED."""
        out = []
        for change in self.changes:
            if change.rv <= after or (upto is not None and change.rv > upto):
                continue
            event = filter_change(change, flt)
            if event is not None:
                out.append(Event(event[0], event[1]["metadata"]["name"], change.rv))
        return out


def store_state(store: Store, flt: Filter) -> dict[str, int]:
    """name -> resourceVersion of the objects ``flt`` selects now."""
    return {
        obj["metadata"]["name"]: int(obj["metadata"]["resourceVersion"])
        for obj in store.list("pods", flt.namespace)
        if flt.matches(obj)
    }


def events(lines: Iterable[Line]) -> list[Event]:
    """The object events among a client's lines (markers and bookmarks left out)."""
    return [
        Event(line["type"], line["name"], int(line["resourceVersion"]))
        for line in lines
        if line["type"] in OBJECT_EVENTS
    ]


def client_state(lines: Iterable[Line]) -> dict[str, int]:
    """name -> resourceVersion of what the client holds after replaying its lines."""
    state: dict[str, int] = {}
    for event in events(lines):
        if event.type == "DELETED":
            state.pop(event.name, None)
        else:
            state[event.name] = event.rv
    return state


def markers(lines: Iterable[Line], *types: str) -> list[Line]:
    return [line for line in lines if line["type"] in types]


def bookmark_problems(lines: Sequence[Line]) -> list[str]:
    """A bookmark promises that nothing at or below its resourceVersion follows it."""
    problems = []
    floor = 0
    for i, line in enumerate(lines):
        if line["type"] == "BOOKMARK":
            floor = max(floor, int(line["resourceVersion"]))
        elif line["type"] in OBJECT_EVENTS and int(line["resourceVersion"]) <= floor:
            problems.append(f"line {i}: {line} after a bookmark at {floor}")
    return problems


def order_problems(received: Sequence[Event]) -> list[str]:
    """resourceVersions never go back, and no object state arrives twice."""
    problems = []
    seen: set[tuple[str, int]] = set()
    last = 0
    for i, event in enumerate(received):
        if event.rv < last:
            problems.append(f"event {i} ({event}) goes back in time from {last}")
        last = max(last, event.rv)
        key = (event.name, event.rv)
        if event.type != "DELETED" and key in seen:
            problems.append(f"event {i} ({event}) repeats a state already received")
        seen.add(key)
    return problems


def diff_report(expected: Sequence[Event], received: Sequence[Event]) -> str:
    """Where two event sequences first part, with a little context."""
    for i, (want, got) in enumerate(zip(expected, received, strict=False)):
        if want != got:
            lo = max(0, i - 3)
            return (
                f"first difference at event {i}: expected {want}, received {got}\n"
                f"expected[{lo}:{i + 4}] = {[str(e) for e in expected[lo : i + 4]]}\n"
                f"received[{lo}:{i + 4}] = {[str(e) for e in received[lo : i + 4]]}"
            )
    if len(expected) != len(received):
        n = min(len(expected), len(received))
        extra = [str(e) for e in (expected[n:] if len(expected) > n else received[n:])][:8]
        who = "missing" if len(expected) > n else "extra"
        return f"{len(expected)} expected, {len(received)} received; {who}: {extra}"
    return "identical"


def relist_summary(
    before: Mapping[str, int], after: Mapping[str, int]
) -> tuple[list[Event], set[str]]:
    """What a client may see when a relist bridges a gap that history no longer covers: each
    new or changed object once at its current resourceVersion (ascending), and which vanished."""
    changed = [
        Event("MODIFIED" if name in before else "ADDED", name, rv)
        for name, rv in after.items()
        if before.get(name) != rv
    ]
    changed.sort(key=lambda e: e.rv)
    return changed, set(before) - set(after)
