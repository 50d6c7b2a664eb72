"""Walking a JSON LIST body member by member, with where each item's text starts and ends.

:class:`watchproxy.kube.representation.JsonRepresentation` makes each item's ADDED line from
the apiserver's own bytes for that item instead of encoding the parsed item again, and yields
items as they are parsed, so a page is never held as parsed objects all at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def walk_list(text: str) -> Iterator[tuple[str, Any, int, int]]:
    """The members of a JSON list document in order, as (name, value, start, end); the
    ``items`` array is walked too: one ("items", item, start, end) per item, with where the
    item's text starts and ends. ``ValueError`` for anything but an object of such members."""

    def skip(at: int) -> int:
        match = _WHITESPACE.match(text, at)
        assert match is not None  # the pattern matches the empty string
        return match.end()

    def expect(at: int, char: str) -> int:
        if text[at : at + 1] != char:
            raise ValueError(f"expected {char!r} at {at}")
        return skip(at + 1)

    def after_value(at: int, close: str) -> int:
        """Past the ',' after a value, or at ``close`` when the value was the last."""
        at = skip(at)
        if text[at : at + 1] == ",":
            return skip(at + 1)
        if text[at : at + 1] != close:
            raise ValueError(f"expected ',' or {close!r} at {at}")
        return at

    at = expect(skip(0), "{")
    while text[at : at + 1] != "}":
        key, at = _DECODER.raw_decode(text, at)
        if not isinstance(key, str):
            raise ValueError("a member name that is not a string")
        at = expect(skip(at), ":")
        if key == "items" and text[at : at + 1] == "[":
            at = skip(at + 1)
            while text[at : at + 1] != "]":
                item, end = _DECODER.raw_decode(text, at)
                if not isinstance(item, dict):
                    raise ValueError("a list item that is not an object")
                yield key, item, at, end
                at = after_value(end, "]")
            at = skip(at + 1)
        else:
            value, end = _DECODER.raw_decode(text, at)
            yield key, value, at, end
            at = end
        at = after_value(at, "}")
    if skip(at + 1) != len(text):
        raise ValueError("data after the list")
