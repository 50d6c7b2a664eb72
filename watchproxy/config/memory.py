"""The memory model: the byte budgets that bound watchproxy's memory, fitted to the container's.

What watchproxy holds grows with four budgets, and nothing else grows with load (LIST answers
are streamed in pieces: ``lists.answers``, ``lists.sharedbody``):

- ``hub.cache_max_bytes``: the shared watches' objects, 1.2 bytes of RSS per byte of JSON
  (``bench.collection``);
- ``hub.history_max_bytes``: their history rings, up to 1.4 times the budget (``bench.backlog``);
- ``limits.max_buffered_body_bytes``: request bodies read whole before they go upstream;
- ``limits.max_buffered_list_bytes``: what streamed LIST batches hold for their slowest clients;

on top of the process itself (``BASE_BYTES``: the interpreter, the libraries, the connections'
buffers, one 256 KiB piece per LIST being written). A shared watch's sync in flight is inside
the cache budget: its lines are counted against ``hub.cache_max_bytes`` as they arrive (with
the other keys' syncs under way), and beside them it holds one piece of the upstream body and
the object being parsed, never the body (``hub.fetcher``; test_hub_sync_memory.py).

Given the container's memory limit (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``),
each budget the configuration does not set is derived from what the set ones leave; when the
set ones alone exceed the limit, watchproxy refuses to start with one line that names them.
Pure: the caller reads the cgroup files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

MIB = 1024 * 1024
# The process without any budget used: 43 MiB (bench.soak), and room for the connections'
# buffers and the pieces being written.
BASE_BYTES = 64 * MIB
# A limit this large (cgroup v1 writes 2^63 rounded to the page size) means "no limit".
NO_LIMIT_BYTES = 1 << 60
# The files to read, in order: cgroup v2, then v1.
CGROUP_FILES = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


@dataclass(frozen=True, slots=True)
class Budget:
    key: str  # section.key
    factor: float  # bytes of RSS per byte of budget
    share: float  # its part of what is left for the budgets not set


BUDGETS = (
    Budget("hub.cache_max_bytes", 1.2, 0.55),
    Budget("hub.history_max_bytes", 1.4, 0.15),
    Budget("limits.max_buffered_body_bytes", 1.0, 0.15),
    Budget("limits.max_buffered_list_bytes", 1.0, 0.15),
)


def parse_limit(text: str | None) -> int | None:
    """The bytes of a cgroup memory limit file's content; None for none ("max", huge, absent,
    unreadable)."""
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit():
        return None  # "max" (v2: no limit), or anything unexpected
    value = int(text)
    return None if value <= 0 or value >= NO_LIMIT_BYTES else value


def container_limit(read: Callable[[str], str | None]) -> int | None:
    """The container's memory limit from the first cgroup file that ``read`` can read."""
    for path in CGROUP_FILES:
        text = read(path)
        if text is not None:
            return parse_limit(text)
    return None


class OverBudget(ValueError):
    """The configured budgets do not fit the memory limit (the message is one line)."""


def fitted(limit: int, configured: Mapping[str, int], set_keys: frozenset[str]) -> dict[str, int]:
    """The budgets for a process limited to ``limit`` bytes: each key in ``set_keys`` keeps
    its ``configured`` value (0: unbounded, counted as nothing here), every other key gets its
    share of what the set ones leave. Raises :class:`OverBudget`."""
    used = BASE_BYTES + sum(
        b.factor * configured[b.key] for b in BUDGETS if b.key in set_keys and configured[b.key]
    )
    free = limit - used
    unset = [b for b in BUDGETS if b.key not in set_keys]
    # Each derived budget gets at least a MiB: below it the model is not worth running.
    if free < MIB * len(unset) or (not unset and free < 0):
        named = ", ".join(f"{b.key}={configured[b.key]}" for b in BUDGETS if b.key in set_keys)
        raise OverBudget(
            f"the memory budgets ({named or 'none set'}) and {BASE_BYTES // MIB} MiB for the "
            f"process need {used / MIB:.0f} MiB, more than the container's memory limit of "
            f"{limit / MIB:.0f} MiB: lower them or raise the limit"
        )
    shares = sum(b.share for b in unset)
    result = {b.key: configured[b.key] for b in BUDGETS if b.key in set_keys}
    for b in unset:
        result[b.key] = int(free * b.share / shares / b.factor)
    return result


def describe(limit: int | None, budgets: Mapping[str, int]) -> str:
    """One line for the start-up log: the limit read from the cgroup and the budgets in force,
    so that an operator sees what watchproxy fitted itself to (or that it found no limit)."""
    parts = ", ".join(
        f"{key}={value / MIB:.1f} MiB" if value else f"{key}=unbounded"
        for key, value in budgets.items()
    )
    if limit is None:
        return f"memory: no container memory limit found; budgets {parts}"
    return f"memory: container limit {limit / MIB:.0f} MiB; budgets {parts}"
