"""tests/clients/expect.py's per-object check of an informer's handler calls against a record:
what it accepts (the record, reordered across objects only, bridged by one relist) and what it
refuses (a change lost, repeated or out of order, a relist that forgets a delete)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from tests.clients.expect import Change, ChangeLog, per_object_problems


class Record:
    """A StoreLike fed by hand: each write gets the next resourceVersion."""

    def __init__(self) -> None:
        self.resource_version = 10
        self._listeners: list[Callable[[Any], None]] = []

    def subscribe(self, resource: str, fn: Callable[[Any], None]) -> Callable[[], None]:
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn)

    def write(self, kind: str, name: str) -> int:
        self.resource_version += 1
        obj = {"metadata": {"namespace": "default", "name": name}}
        for listener in self._listeners:
            listener(SimpleNamespace(type=kind, obj=obj, rv=self.resource_version))
        return self.resource_version


def recorded() -> ChangeLog:
    """a and b created (11, 12), a changed (13), b deleted (14), c created (15), a changed (16),
    c deleted (17), d created (18)."""
    record = Record()
    log = ChangeLog(record)
    for kind, name in [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
        ("ADDED", "c"),
        ("MODIFIED", "a"),
        ("DELETED", "c"),
        ("ADDED", "d"),
    ]:
        record.write(kind, name)
    return log


def events(*spec: tuple[str, str, int]) -> list[Change]:
    return [Change(kind, name, rv) for kind, name, rv in spec]


EXACT = events(
    ("SET", "a", 11),
    ("SET", "b", 12),
    ("SET", "a", 13),
    ("DELETED", "b", 14),
    ("SET", "c", 15),
    ("SET", "a", 16),
    ("DELETED", "c", 17),
    ("SET", "d", 18),
)


def test_the_record_itself_passes() -> None:
    assert per_object_problems(EXACT, recorded(), 10) == []


def test_changes_of_different_objects_may_come_out_of_order() -> None:
    # A queue that handed over all of a's changes before b's (DeltaFIFO).
    by_object = sorted(EXACT, key=lambda e: (e.name, e.rv))
    assert per_object_problems(by_object, recorded(), 10) == []


def test_a_lost_change_fails() -> None:
    # from_rv at the end: the stream was never cut, so no relist can explain a gap.
    lost = [e for e in EXACT if e.rv != 13]
    assert per_object_problems(lost, recorded(), 18)


def test_a_lost_change_passes_only_as_a_relist_would_bridge_it() -> None:
    # A relist from 12 to 16 shows a at 16 only: losing a@13 after a cut is such a stream.
    lost = [e for e in EXACT if e.rv != 13]
    assert per_object_problems(lost, recorded(), 10) == []
    # No relist explains a lost last change: whatever the cut, d@18 comes after it.
    assert per_object_problems(EXACT[:-1], recorded(), 10)


def test_a_repeated_change_fails() -> None:
    assert per_object_problems([*EXACT[:3], EXACT[2], *EXACT[3:]], recorded(), 10)


def test_one_objects_changes_out_of_order_fail() -> None:
    swapped = [*EXACT]
    swapped[0], swapped[2] = swapped[2], swapped[0]  # a@13 before a@11
    assert per_object_problems(swapped, recorded(), 10)


def test_a_relist_may_bridge_a_gap_once_per_object() -> None:
    # The stream up to 12, then a relist at 17: a's new state, b gone (DELETED stamped in the
    # gap), c born and gone inside the gap (nothing); then d, after the relist.
    bridged = events(
        ("SET", "a", 11),
        ("SET", "b", 12),
        ("SET", "a", 16),
        ("DELETED", "b", 15),
        ("SET", "d", 18),
    )
    assert per_object_problems(bridged, recorded(), 12) == []


def test_a_relist_at_a_resource_version_the_record_does_not_hold() -> None:
    # The relist's resourceVersion (16) moved with writes elsewhere: the record has no change
    # at it, but the delete the relist stamps carries it.
    record = Record()
    log = ChangeLog(record)
    for kind, name in [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "b")]:
        record.write(kind, name)
    record.resource_version += 5  # writes elsewhere: 14 to 18
    record.write("ADDED", "c")  # 19
    bridged = events(("SET", "a", 11), ("SET", "b", 12), ("DELETED", "b", 16), ("SET", "c", 19))
    assert per_object_problems(bridged, log, 12) == []


def test_a_relist_that_forgets_a_delete_fails() -> None:
    forgot = events(("SET", "a", 11), ("SET", "b", 12), ("SET", "a", 16), ("SET", "d", 18))
    assert per_object_problems(forgot, recorded(), 12)


def test_the_part_before_from_rv_must_be_exact() -> None:
    # A "relist" cannot hide a loss before from_rv: a@13 is recorded before 14.
    skipped = events(
        ("SET", "a", 11),
        ("SET", "b", 12),
        ("DELETED", "b", 14),
        ("SET", "a", 16),
        ("SET", "d", 18),
    )
    assert per_object_problems(skipped, recorded(), 14)
