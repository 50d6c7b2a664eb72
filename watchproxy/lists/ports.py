"""What LIST serving needs from the hub, as two small protocols.

A LIST is answered from a shared watch's state, so it reads more of a watch than a client's
watch stream does (its cache, when it last moved), but it never starts, stops or subscribes to
one: the hub owns every shared watch, and a LIST only looks at those already running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from watchproxy.hub.transitions import Phase
from watchproxy.hub.watchcache import WatchCache
from watchproxy.hub.watchkey import Unservable, WatchKey
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.headers import Headers
from watchproxy.kube.representation import Representation
from watchproxy.kube.watchquery import WatchQuery


class ListRequest(Protocol):
    """A client's LIST as LIST serving reads it: its raw request target and its headers
    (the API port's ``server.http.Request`` fits)."""

    @property
    def raw_path(self) -> str: ...

    @property
    def headers(self) -> Headers: ...

    @property
    def shared(self) -> bool:
        """``headers`` is a parse that later requests with the same header lines share, never
        changed: what is derived from it may be kept with it."""


class ListedWatch(Protocol):
    """A running shared watch as a LIST reads it (``hub.sharedwatch.SharedWatch`` fits)."""

    @property
    def closed(self) -> bool: ...

    @property
    def cache(self) -> WatchCache: ...

    @property
    def representation(self) -> Representation: ...

    @property
    def state(self) -> Phase:
        """Its upstream watch's phase (watching, backing off, relisting, ...)."""

    @property
    def advanced_at(self) -> float | None:
        """When its resourceVersion last moved (None: not yet)."""

    async def wait_change(self, timeout: float) -> None:
        """Return when its state changes, it closes, or ``timeout`` seconds pass."""

    def __hash__(self) -> int:
        """By identity: a paged answer's snapshots are kept by the watch they were cut from."""


class SharedWatches(Protocol):
    """The hub as LIST serving sees it (``hub.multiplexer.Hub`` fits)."""

    @property
    def watches(self) -> Mapping[WatchKey, ListedWatch]: ...

    def key_of(
        self, api_path: ApiPath, query: WatchQuery, headers: Headers
    ) -> tuple[WatchKey, Representation] | Unservable:
        """The key a watch of ``api_path`` with this query and these headers would share."""
