"""What a shared watch's driver reports to its machine, and what the machine asks it to do.

Plain values: the :class:`Outcome` of an upstream request, and the :class:`Action` the driver
performs next (see :mod:`watchproxy.hub.machine`). Refusals have names: an HTTP answer of the
apiserver is :class:`Refused` with its real status; a key the hub itself will not share is
:class:`Unshareable` with a :class:`NotShared` reason, never a made-up status.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from watchproxy.hub.cachetypes import ListedObject

# ---- outcomes: what the driver saw upstream ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    pass


@dataclass(frozen=True, slots=True)
class Listed:
    items: list[dict[str, Any] | ListedObject]  # ListedObject: see cachestate.listed
    resource_version: str


@dataclass(frozen=True, slots=True)
class Refused:
    """An HTTP answer other than 200 (a 410 on a watch is :class:`Expired`)."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    retry_after: float | None = None


class NotShared(Enum):
    """Why the hub does not share a key although the apiserver answered its first LIST; the
    value is the pass-through reason the hub counts its clients' watches under."""

    CACHE_FULL = "cache-budget"  # the list would take the cache past hub.cache_max_bytes
    UNENCODABLE = "representation"  # the apiserver has no such encoding for this kind


@dataclass(frozen=True, slots=True)
class Unshareable:
    """The key's LIST shows that it cannot be shared: its clients are passed through."""

    reason: NotShared


@dataclass(frozen=True, slots=True)
class Opened:
    pass


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    object: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Bookmark:
    resource_version: str


@dataclass(frozen=True, slots=True)
class Expired:
    """410 Gone on a watch, as its HTTP status or as an in-stream ERROR ``line``."""

    line: bytes = b""


@dataclass(frozen=True, slots=True)
class Broken:
    """No HTTP answer, a reset, a read timeout, a bad line; ``down``: the prober says so."""

    reason: str
    down: bool = False


@dataclass(frozen=True, slots=True)
class Silent:
    """Neither an event nor a bookmark for the silence period."""


@dataclass(frozen=True, slots=True)
class Ended:
    """The upstream ended the watch cleanly (its timeoutSeconds)."""


@dataclass(frozen=True, slots=True)
class Elapsed:
    down: bool = False


@dataclass(frozen=True, slots=True)
class UpstreamBack:
    pass


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Outcome = (
    Start
    | Listed
    | Refused
    | Unshareable
    | Opened
    | Event
    | Bookmark
    | Expired
    | Broken
    | Silent
    | Ended
    | Elapsed
    | UpstreamBack
    | Stop
)

# ---- actions: what the driver does next ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenList:
    relist: bool
    # A relist asks for a state no older than the one the cache has: the apiserver serves that
    # from its watch cache, where resourceVersion="" is a quorum read from etcd.
    not_older_than: str | None = None


@dataclass(frozen=True, slots=True)
class OpenWatch:
    resource_version: str
    timeout_seconds: int


@dataclass(frozen=True, slots=True)
class ReadOn:
    """Keep reading the open watch; it is silent (dead) if nothing comes by ``deadline``."""

    deadline: float


@dataclass(frozen=True, slots=True)
class Sleep:
    until: float


@dataclass(frozen=True, slots=True)
class WaitForUpstream:
    pass


@dataclass(frozen=True, slots=True)
class Fail:
    refusal: Refused | Unshareable
    # The refused request was the first LIST (else the WATCH): a client that asked to watch
    # is owed the apiserver's answer to a watch, which a LIST's refusal is not.
    of_list: bool = True


@dataclass(frozen=True, slots=True)
class Halt:
    pass


Action = OpenList | OpenWatch | ReadOn | Sleep | WaitForUpstream | Fail | Halt
