"""Lines the hub writes that no upstream event carries: bookmarks and the 410 Expired.

Part of :class:`~watchproxy.hub.watchcache.WatchCache`. Pure.
"""

from __future__ import annotations

from watchproxy.errors import status_object
from watchproxy.kube.representation import Representation


def expired_line(rep: Representation, rv: str, oldest: int) -> bytes:
    """An ERROR event with the apiserver's 410 Expired Status for a client at ``rv``."""
    shown = str(int(rv)) if rv.isascii() and rv.isdigit() else rv
    status = status_object(410, "Expired", f"too old resource version: {shown} ({oldest})")
    return rep.error_line(status)


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
