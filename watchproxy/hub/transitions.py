"""The shared watch's phases and its transition table, as data: every move there is, and none other.

:mod:`watchproxy.hub.machine` dispatches on this table and refuses any move it does not list;
:func:`mermaid` draws it for docs/architecture.md (``scripts/architecture_diagram.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from watchproxy.hub.outcomes import (
    Bookmark,
    Broken,
    Elapsed,
    Ended,
    Event,
    Expired,
    Listed,
    Opened,
    Refused,
    Silent,
    Start,
    Stop,
    Unshareable,
    UpstreamBack,
)


class Phase(Enum):
    IDLE = "idle"
    LISTING = "listing"  # the first LIST: no state yet
    WATCHING = "watching"  # an upstream WATCH is being opened or read
    RELISTING = "relisting"  # a LIST after the upstream said 410 on resume
    BACKING_OFF = "backing-off"  # sleeping until a deadline (failure, 429, recovery jitter)
    WAITING = "waiting-for-upstream"  # the apiserver is down: the prober retries, not us
    FAILED = "failed"  # the first LIST was refused: clients get that same answer
    STOPPED = "stopped"


# ---- the table ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Move:
    """One row of the transition table: ``source --outcome--> target`` when ``condition``.

    ``logged``: worth a log line (outages, lists and relists, dead watches); routine re-watches
    and every event are not. ``label`` is the row as the log shows it, made once.
    """

    source: Phase
    outcome: type[object]
    target: Phase
    condition: str
    logged: bool
    label: str


# What is logged: every wait (a failure or the apiserver down), every LIST, and a dead watch.
_LOGGED_TARGETS = frozenset({Phase.BACKING_OFF, Phase.WAITING, Phase.LISTING, Phase.RELISTING})


def _row(source: Phase, outcome: type[object], target: Phase, condition: str = "") -> Move:
    return Move(
        source,
        outcome,
        target,
        condition,
        logged=target in _LOGGED_TARGETS or outcome is Silent,
        label=f"{source.value} --{outcome.__name__}--> {target.value}",
    )


P = Phase
# Every move the machine can make, and nothing else: handle() dispatches on (phase, outcome)
# through this table, refuses a move it does not list, and mermaid() draws it.
TRANSITIONS: tuple[Move, ...] = (
    _row(P.IDLE, Start, P.LISTING),
    _row(P.LISTING, Listed, P.WATCHING, "from the oldest RV a client waits for"),
    _row(P.LISTING, Refused, P.FAILED, "clients get the same answer"),
    _row(P.LISTING, Unshareable, P.FAILED, "clients pass through"),
    _row(P.LISTING, Broken, P.BACKING_OFF, "upstream up"),
    _row(P.LISTING, Broken, P.WAITING, "upstream down"),
    _row(P.WATCHING, Opened, P.WATCHING),
    _row(P.WATCHING, Event, P.WATCHING, "publish"),
    _row(P.WATCHING, Bookmark, P.WATCHING, "publish"),
    _row(P.WATCHING, Event, P.BACKING_OFF, "unreadable"),
    _row(P.WATCHING, Bookmark, P.BACKING_OFF, "unreadable"),
    _row(P.WATCHING, Silent, P.WATCHING, "dead, resume from the last RV"),
    _row(P.WATCHING, Ended, P.WATCHING, "resume from the last RV"),
    _row(P.WATCHING, Ended, P.BACKING_OFF, "quick and empty"),
    _row(P.WATCHING, Expired, P.WATCHING, "backfill refused, cut it, go on from the list"),
    _row(P.WATCHING, Expired, P.RELISTING),
    _row(P.WATCHING, Refused, P.FAILED, "401, 403, 404 or 405: clients get the same answer"),
    _row(P.WATCHING, Refused, P.BACKING_OFF, "429 waits Retry-After, else back-off"),
    _row(P.WATCHING, Broken, P.BACKING_OFF, "upstream up"),
    _row(P.WATCHING, Broken, P.WAITING, "upstream down"),
    _row(P.RELISTING, Listed, P.WATCHING, "publish the difference"),
    _row(P.RELISTING, Refused, P.BACKING_OFF, "429 waits Retry-After, else back-off"),
    _row(P.RELISTING, Unshareable, P.BACKING_OFF, "back-off"),
    _row(P.RELISTING, Broken, P.BACKING_OFF, "upstream up"),
    _row(P.RELISTING, Broken, P.WAITING, "upstream down"),
    _row(P.BACKING_OFF, Elapsed, P.LISTING, "the first list failed"),
    _row(P.BACKING_OFF, Elapsed, P.WATCHING, "resume"),
    _row(P.BACKING_OFF, Elapsed, P.RELISTING, "the relist failed"),
    _row(P.BACKING_OFF, Elapsed, P.WAITING, "upstream down"),
    _row(P.WAITING, UpstreamBack, P.BACKING_OFF, "jittered, under the recovery window"),
    *(_row(phase, Stop, P.STOPPED) for phase in P if phase is not P.STOPPED),
)


def _mermaid_id(phase: Phase) -> str:
    return phase.name.lower()


def mermaid() -> str:
    """The transition table as a Mermaid state diagram (``stateDiagram-v2``).

    Conditions are plain words (no ``:`` or ``;``, which Mermaid reads as syntax).
    """
    lines = ["stateDiagram-v2"]
    lines += [f'    state "{p.value}" as {_mermaid_id(p)}' for p in Phase]
    lines.append(f"    [*] --> {_mermaid_id(P.IDLE)}")
    for move in TRANSITIONS:
        if move.outcome is Stop and move.source is not P.IDLE:
            continue  # every phase stops the same way: one line says it
        name = move.outcome.__name__
        label = f"{name} [{move.condition}]" if move.condition else name
        lines.append(f"    {_mermaid_id(move.source)} --> {_mermaid_id(move.target)}: {label}")
    lines.append(f"    {_mermaid_id(P.STOPPED)} --> [*]")
    lines.append(f"    note right of {_mermaid_id(P.STOPPED)}: every phase stops on Stop")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - scripts/architecture_diagram.py writes it
    print(mermaid(), end="")
