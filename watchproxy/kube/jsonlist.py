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


class _More(Exception):
    """The text so far ends inside the next token: wait for more."""


class ListWalker:
    """:func:`walk_list` over a body that arrives in pieces: :meth:`feed` each piece of text
    as it comes, and get the members (and items) that it completed; :meth:`finish` at the end.

    What it holds is the text not yet walked: at most the member or item being read (a LIST
    item is one object, at most ``max_pending`` characters: past that, ``ValueError``) and the
    rest of the last piece, never the body. Each item is yielded with its own text, from which
    the caller makes its line; a failed attempt to read an item that has not all come is made
    again only once the text after it has doubled, so a big item is parsed about twice at most.
    """

    # States: what is expected next.
    _OPEN, _KEY, _FIRST_KEY, _AFTER_MEMBER, _FIRST_ITEM, _ITEM, _AFTER_ITEM, _END = range(8)

    def __init__(self, max_pending: int) -> None:
        self._text = ""
        self._at = 0
        self._state = self._OPEN
        self._max_pending = max_pending
        self._retry_at = 0  # no new attempt before the text not walked is this long
        self._finished = False

    def feed(self, text: str) -> list[tuple[str, Any, str]]:
        """The members completed by ``text``, as (name, value, its text); the text is
        only kept for items ("" for other members)."""
        # The text walked is dropped: what is kept starts with what is not walked yet.
        self._text = self._text[self._at :] + text if self._at else self._text + text
        self._at = 0
        if len(self._text) < self._retry_at:
            return []
        return self._walk()

    def finish(self) -> list[tuple[str, Any, str]]:
        """The last members; ``ValueError`` unless the document ended, and only it."""
        self._finished = True
        found = self._walk()
        if self._state != self._END or self._skip(self._at) != len(self._text):
            raise ValueError("the list ended early, or data follows it")
        return found

    def _walk(self) -> list[tuple[str, Any, str]]:
        found: list[tuple[str, Any, str]] = []
        try:
            while self._state != self._END:
                self._step(found)
        except _More:
            pending = len(self._text) - self._at
            if pending > self._max_pending:
                raise ValueError(f"a list member over {self._max_pending} bytes") from None
            if self._finished:
                raise ValueError("the list ended inside a member") from None
            self._retry_at = 2 * pending  # (feed() compares the text not walked yet)
        else:
            self._retry_at = 0
        return found

    def _skip(self, at: int) -> int:
        match = _WHITESPACE.match(self._text, at)
        assert match is not None  # the pattern matches the empty string
        return match.end()

    def _char(self, at: int) -> str:
        """The character at ``at`` (after whitespace is skipped by the caller)."""
        if at >= len(self._text):
            raise _More
        return self._text[at]

    def _value(self, at: int) -> tuple[Any, int]:
        """A JSON value from ``at`` and where it ends; _More if it may not have all come."""
        try:
            value, end = _DECODER.raw_decode(self._text, at)
        except json.JSONDecodeError as error:
            if self._finished:
                raise ValueError(f"unreadable list: {error.msg} at {error.pos}") from None
            raise _More from None
        # A number at the very end may go on in the next piece ("12" of "123").
        if end >= len(self._text) and not self._finished:
            raise _More
        return value, end

    def _step(self, found: list[tuple[str, Any, str]]) -> None:
        """Read one token or value and move on; nothing but whitespace is taken when it
        raises _More (whitespace is dropped as it comes: a body of it holds nothing)."""
        at = self._at = self._skip(self._at)
        state = self._state
        if state == self._OPEN:
            if self._char(at) != "{":
                raise ValueError("a list that is not a JSON object")
            self._at, self._state = at + 1, self._FIRST_KEY
        elif state in (self._KEY, self._FIRST_KEY):
            char = self._char(at)
            if char == "}" and state == self._FIRST_KEY:
                self._at, self._state = at + 1, self._END
                return
            key, end = self._value(at)
            if not isinstance(key, str):
                raise ValueError("a member name that is not a string")
            colon = self._skip(end)
            if self._char(colon) != ":":
                raise ValueError(f"expected ':' at {colon}")
            start = self._skip(colon + 1)
            if key == "items" and self._char(start) == "[":
                self._at, self._state = start + 1, self._FIRST_ITEM
                return
            value, end = self._value(start)
            found.append((key, value, ""))
            self._at, self._state = end, self._AFTER_MEMBER
        elif state == self._AFTER_MEMBER:
            char = self._char(at)
            if char not in ",}":
                raise ValueError(f"expected ',' or '}}' at {at}")
            self._at, self._state = at + 1, self._KEY if char == "," else self._END
        elif state in (self._ITEM, self._FIRST_ITEM):
            if state == self._FIRST_ITEM and self._char(at) == "]":
                self._at, self._state = at + 1, self._AFTER_MEMBER
                return
            item, end = self._value(at)
            if not isinstance(item, dict):
                raise ValueError("a list item that is not an object")
            found.append(("items", item, self._text[at:end]))
            self._at, self._state = end, self._AFTER_ITEM
        else:  # _AFTER_ITEM
            char = self._char(at)
            if char not in ",]":
                raise ValueError(f"expected ',' or ']' at {at}")
            self._at, self._state = at + 1, self._ITEM if char == "," else self._AFTER_MEMBER
