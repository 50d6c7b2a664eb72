"""What a client should have seen, from the fake apiserver's own record of changes.

``ChangeLog`` subscribes to the fake's store and keeps every pod change of one namespace with
its resourceVersion, before anything can compact it away. The checkers replay a client's JSON
lines against it and return a list of problems (empty: the client saw every change once, in
order, with the apiserver's resourceVersions).

A client's view has segments: an initial list (kube-rs ``Init`` … ``InitDone``, client-node's
``add`` lines before ``READY``) then watch events. A list is a snapshot of the store at some
resourceVersion R; the events that follow must be exactly the changes after R. kube-rs starts a
new segment whenever its watcher relists; an earlier segment's events need only be a prefix
of the changes after its R (the watcher gave up on that stream), the last one must reach the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

Line = dict[str, Any]


class StoreLike(Protocol):
    """What ChangeLog needs from ``kubefake.Store``."""

    @property
    def resource_version(self) -> int: ...

    def subscribe(self, resource: str, fn: Callable[[Any], None]) -> Callable[[], None]: ...


@dataclass(frozen=True)
class Change:
    type: str  # ADDED, MODIFIED, DELETED
    name: str
    rv: int


class ChangeLog:
    """Every pod change in ``namespace`` from the moment of construction (the store must have
    no pods in it then: the log's first state is empty)."""

    def __init__(self, store: StoreLike, namespace: str = "default") -> None:
        self.namespace = namespace
        self.start_rv = store.resource_version
        self.changes: list[Change] = []
        self._store = store
        self.close = store.subscribe("pods", self._record)

    def _record(self, change: Any) -> None:
        meta = change.obj["metadata"]
        if meta.get("namespace") == self.namespace:
            self.changes.append(Change(change.type, meta["name"], change.rv))

    @property
    def last_rv(self) -> int:
        return self.changes[-1].rv if self.changes else self.start_rv

    def state_at(self, rv: int) -> dict[str, int]:
        """Pod name -> resourceVersion as the store held them at ``rv``."""
        state: dict[str, int] = {}
        for change in self.changes:
            if change.rv > rv:
                break
            if change.type == "DELETED":
                state.pop(change.name, None)
            else:
                state[change.name] = change.rv
        return state

    def after(self, rv: int) -> list[Change]:
        return [c for c in self.changes if c.rv > rv]

    def list_rv_for(self, state: dict[str, int], below: int | None) -> int | None:
        """A resourceVersion R (< ``below`` if given) at which the store held exactly ``state``."""
        candidates = [self.start_rv, *(c.rv for c in self.changes)]
        for rv in reversed(candidates):
            if below is not None and rv >= below:
                continue
            if self.state_at(rv) == state:
                return rv
        return None


@dataclass
class Segment:
    listed: dict[str, int]
    events: list[tuple[str, str, int]]  # (client's type, name, rv)
    duplicates_in_list: list[str]


KUBERS_TYPES = {"ADDED": "Apply", "MODIFIED": "Apply", "DELETED": "Delete"}
INFORMER_TYPES = {"ADDED": "add", "MODIFIED": "update", "DELETED": "delete"}


def kubers_segments(lines: list[Line], watcher: int = 0) -> tuple[list[Segment], list[str]]:
    """Split one kube-rs watcher's lines at each ``Init``; problems for lines out of place."""
    segments: list[Segment] = []
    problems: list[str] = []
    listing = False
    for line in lines:
        kind = line["type"]
        if line.get("watcher", watcher) != watcher or kind in ("ERROR", "EXIT"):
            continue
        if kind == "Init":
            segments.append(Segment({}, [], []))
            listing = True
        elif not segments:
            problems.append(f"{kind} before any Init: {line}")
        elif kind == "InitApply" and listing:
            listed = segments[-1].listed
            if line["name"] in listed:
                segments[-1].duplicates_in_list.append(line["name"])
            listed[line["name"]] = int(line["resourceVersion"])
        elif kind == "InitDone" and listing:
            listing = False
        elif kind in ("Apply", "Delete") and not listing:
            segments[-1].events.append((kind, line["name"], int(line["resourceVersion"])))
        else:
            problems.append(f"unexpected {kind} (listing={listing}): {line}")
    if listing:
        problems.append("the last Init never reached InitDone")
    return segments, problems


def informer_segments(lines: list[Line]) -> tuple[list[Segment], list[str]]:
    """client-node: the ``add`` lines before READY are the list, everything after the events."""
    segment = Segment({}, [], [])
    problems: list[str] = []
    ready = False
    for line in lines:
        kind = line["type"]
        if kind in ("ERROR", "EXIT"):
            continue
        if kind == "READY":
            ready = True
        elif not ready and kind == "add":
            if line["name"] in segment.listed:
                segment.duplicates_in_list.append(line["name"])
            segment.listed[line["name"]] = int(line["resourceVersion"])
        elif ready and kind in ("add", "update", "delete"):
            segment.events.append((kind, line["name"], int(line["resourceVersion"])))
        else:
            problems.append(f"unexpected {kind} (ready={ready}): {line}")
    if not ready:
        problems.append("no READY line")
    return [segment], problems


def check_segments(
    segments: list[Segment], log: ChangeLog, types: dict[str, str], *, to_end: bool = True
) -> list[str]:
    """Each segment's list is the store at some R and its events are the changes after R."""
    problems: list[str] = []
    if not segments:
        return ["no initial list at all"]
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment.duplicates_in_list:
            problems.append(f"segment {index}: listed twice: {segment.duplicates_in_list}")
        below = segment.events[0][2] if segment.events else None
        list_rv = log.list_rv_for(segment.listed, below)
        if list_rv is None:
            problems.append(
                f"segment {index}: the list {segment.listed} is no state the store ever had"
            )
            continue
        expected = [(types[c.type], c.name, c.rv) for c in log.after(list_rv)]
        if not (last and to_end):
            expected = expected[: len(segment.events)]
        if segment.events != expected:
            problems.append(
                f"segment {index} (list at RV {list_rv}): events differ from the store's record"
                f"\n  got      {segment.events}\n  expected {expected}"
            )
    return problems


def check_kubers(lines: list[Line], log: ChangeLog, watcher: int = 0) -> list[str]:
    segments, problems = kubers_segments(lines, watcher)
    return problems + check_segments(segments, log, KUBERS_TYPES)


def check_informer(lines: list[Line], log: ChangeLog) -> list[str]:
    segments, problems = informer_segments(lines)
    return problems + check_segments(segments, log, INFORMER_TYPES)


def kubers_state(lines: list[Line], watcher: int = 0) -> dict[str, int]:
    """What a kube-rs user's store (a reflector) would hold after these lines."""
    state: dict[str, int] = {}
    buffer: dict[str, int] = {}
    for line in lines:
        if line.get("watcher", watcher) != watcher:
            continue
        kind = line["type"]
        if kind == "Init":
            buffer = {}
        elif kind == "InitApply":
            buffer[line["name"]] = int(line["resourceVersion"])
        elif kind == "InitDone":
            state = buffer
        elif kind == "Apply":
            state[line["name"]] = int(line["resourceVersion"])
        elif kind == "Delete":
            state.pop(line["name"], None)
    return state


def seen_rv(lines: list[Line], watcher: int | None = None) -> int:
    """The highest resourceVersion a client has printed (0 if none)."""
    rvs = [
        int(line["resourceVersion"])
        for line in lines
        if line.get("resourceVersion") and (watcher is None or line.get("watcher") == watcher)
    ]
    return max(rvs, default=0)


def per_object_problems(got: list[Change], log: ChangeLog, from_rv: int) -> list[str]:
    """Empty when an informer's handler calls ``got`` (type ``SET`` for an add or update,
    ``DELETED``) are the record ``log``, object by object, from an empty start.

    An informer hands over each object's changes in order, but not the changes of different
    objects in the order they happened: its queue (client-go's DeltaFIFO, client-java's) keeps
    the changes that wait for the handler by object and hands over all of one object's at once.
    So the order is checked per object, with one cut ``g`` <= ``r`` shared by all objects: the
    stream is the record up to ``g`` (at or after ``from_rv``), then, if the stream's source
    relisted at ``r`` because ``g`` was compacted away, each object's change from its state at
    ``g`` to its state at ``r`` (its new state, or a DELETED stamped inside the gap), then the
    record after ``r``. Without a relist ``g == r``: the record itself.
    """
    record: dict[str, list[Change]] = {}
    for change in log.changes:
        kind = "DELETED" if change.type == "DELETED" else "SET"
        record.setdefault(change.name, []).append(Change(kind, change.name, change.rv))
    received: dict[str, list[Change]] = {}
    for event in got:
        received.setdefault(event.name, []).append(event)
    names = sorted(set(record) | set(received))
    # A relist's resourceVersion is the store's at the time, which the record may not hold
    # (writes elsewhere move it), but which a DELETED stamped by the relist may carry.
    cuts = sorted({log.start_rv, *(c.rv for c in log.changes), *(e.rv for e in got)})
    cuts = [cut for cut in cuts if cut >= from_rv] or [log.last_rv]
    states = {cut: log.state_at(cut) for cut in cuts}

    def fits(name: str, g: int, r: int) -> bool:
        mine, seen = record.get(name, []), received.get(name, [])
        head = [e for e in mine if e.rv <= g]
        tail = [e for e in mine if e.rv > r]
        if len(head) + len(tail) > len(seen):
            return False
        if seen[: len(head)] != head or seen[len(seen) - len(tail) :] != tail:
            return False
        middle = seen[len(head) : len(seen) - len(tail)]
        before, after = states[g].get(name), states[r].get(name)
        if after is not None and after != before:
            return middle == [Change("SET", name, after)]
        if after is None and before is not None:
            return len(middle) == 1 and middle[0].type == "DELETED" and g < middle[0].rv <= r
        return middle == []

    for index, g in enumerate(cuts):
        for r in cuts[index:]:
            if all(fits(name, g, r) for name in names):
                return []
    differ = [
        f"{name}: received {[(e.type, e.rv) for e in received.get(name, [])]},"
        f" recorded {[(e.type, e.rv) for e in record.get(name, [])]}"
        for name in names
        if received.get(name, []) != record.get(name, [])
    ]
    return differ or ["each object as recorded, but no one cut of the stream explains them all"]
