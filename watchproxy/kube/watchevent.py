"""One line of a watch stream, decoded and checked before anything acts on it. Pure.

The apiserver writes one JSON object per line: ``{"type": ..., "object": ...}``. A line that is
not valid JSON, nests deeper than the decoder can follow, or does not have that shape is a
:class:`WatchEventError` (a ``ValueError``) and nothing else: a broken or hostile upstream must
end up on the caller's "bad stream" path, never as an ``AttributeError`` or ``RecursionError``
deep in whatever read the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
_TYPES: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


class WatchEventError(ValueError):
    """A watch stream line that is not a watch event."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A decoded watch event.

    Guarantees: ``type`` is one of the five event types; ``object`` is a JSON object; a
    BOOKMARK's ``resource_version`` is a non-empty string; an ERROR's ``code`` is an int or None.
    """

    type: EventType
    object: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        """``object.metadata.resourceVersion`` when it is a string, else None."""
        metadata = self.object.get("metadata")
        if isinstance(metadata, dict):
            rv = metadata.get("resourceVersion")
            if isinstance(rv, str):
                return rv
        return None

    @property
    def code(self) -> int | None:
        """An ERROR event's Status code (410 means Expired)."""
        code = self.object.get("code")
        return code if isinstance(code, int) and not isinstance(code, bool) else None


def decode_watch_line(line: bytes | str) -> WatchEvent:
    """Decode one line of a JSON watch stream (surrounding whitespace allowed)."""
    try:
        document = json.loads(line)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise WatchEventError(f"not JSON: {type(error).__name__}") from None
    if not isinstance(document, dict):
        raise WatchEventError(f"a watch event is a JSON object, not {type(document).__name__}")
    kind = document.get("type")
    if not isinstance(kind, str) or kind not in _TYPES:
        shown = kind if isinstance(kind, str) and len(kind) <= 40 else type(kind).__name__
        raise WatchEventError(f"unknown watch event type {shown!r}")
    obj = document.get("object")
    if not isinstance(obj, dict):
        raise WatchEventError(f"the object of a {kind} event is not a JSON object")
    event = WatchEvent(kind, obj)  # type: ignore[arg-type]  # checked against _TYPES
    if kind == "BOOKMARK" and not event.resource_version:
        raise WatchEventError("a BOOKMARK without metadata.resourceVersion")
    return event
