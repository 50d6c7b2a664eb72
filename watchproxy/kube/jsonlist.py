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


def with_page_meta(body: bytes, rv: str, token: str, remaining: int | None) -> bytes:
    """``body`` (a JSON list or Table whose metadata is only its resourceVersion, as the
    representations encode it) with a page's continue token and remainingItemCount added, in
    the apiserver's field order."""
    head = b'"metadata":{"resourceVersion":' + json.dumps(rv).encode() + b"}"
    at = body.find(head, 0, 4096)  # the list's own metadata precedes its items
    if at < 0:
        raise ValueError("the list body has no metadata to page")
    end = at + len(head) - 1
    extra = b',"continue":' + json.dumps(token).encode()
    if remaining is not None:
        extra += b',"remainingItemCount":%d' % remaining
    return body[:end] + extra + body[end:]


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
