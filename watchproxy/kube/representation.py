"""Which representation of a watched resource a client asked for, and how to serve it faithfully.

A shared watch carries ONE representation: plain JSON, ``PartialObjectMetadata``, ``Table``, or
the kind's own protobuf (:mod:`watchproxy.kube.protobuf`).
:func:`watchproxy.kube.negotiation.representation_for` picks one from a client's ``Accept``
header (and ``includeObject``) as the apiserver's content negotiation does, and returns ``None``
whenever the proxy could not be sure to answer byte-for-byte what the apiserver would (YAML,
CBOR or protobuf ``as=`` chosen first, unknown ``as=``, a parameter other than ``as``, ``g``,
``v``, ``stream`` and ``charset`` such as ``pretty`` or ``drop=metadata.managedFields``, unknown
``stream=``, media types that only match case-insensitively, unparsable q-values, an ordering
that Go's sort might not reproduce). Such requests are passed through unchanged. Tables:
:mod:`watchproxy.kube.tables`.

Representations are stateful (they learn the kind and the columns): one instance per shared
watch. Object dicts handed in are never mutated; dicts handed out must not be mutated either.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from watchproxy.kube.jsonlist import ListWalker, walk_list, with_page_meta
from watchproxy.kube.jsonobjects import (
    INITIAL_EVENTS_END_ANNOTATION,
    JSON,
    META_GROUP,
    Obj,
    bookmark_metadata,
    encode_json,
    key_of,
    list_of,
    list_rv,
    replace_rv,
    rv_of,
    typed,
)

__all__ = [
    "INITIAL_EVENTS_END_ANNOTATION",
    "JsonRepresentation",
    "PartialMetadataRepresentation",
    "Representation",
    "encode_json",
]


# The size of the pieces a LIST from the cache is encoded and written in.
LIST_PIECE_BYTES = 256 * 1024


@dataclass(slots=True)
class ListPage:
    """One LIST page as (object, its ADDED line) pairs; ``rv`` and ``token`` (its continue)
    are set once ``items`` has been read to the end."""

    items: Iterator[tuple[Obj, bytes]]
    rv: str = ""
    token: str = ""
    remaining: int | None = None  # metadata.remainingItemCount, when the apiserver says


class PageReader:
    """One JSON LIST page read as it arrives: :meth:`feed` each piece of the body and get
    the (object, ADDED line) pairs it completed; :meth:`finish` at the end gets the last ones
    and the page's resourceVersion, continue token and remainingItemCount. It holds the item
    being read and the rest of the last piece, never the page (see ``ListWalker``)."""

    def __init__(self, rep: JsonRepresentation, max_item_bytes: int) -> None:
        self._rep = rep
        self._walker = ListWalker(max_item_bytes)
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._document: Obj = {}
        self._typing: _Typing | None = None
        self._pending: list[tuple[Obj, str]] = []  # items before the list's kind: typed last
        self.page = ListPage(iter(()))

    def feed(self, data: bytes) -> list[tuple[Obj, bytes]]:
        return self._items(self._walker.feed(self._decoder.decode(data)))

    def finish(self) -> tuple[list[tuple[Obj, bytes]], ListPage]:
        """The last items and the page's metadata; ``ValueError`` for a body that is not a
        whole JSON list."""
        found = self._walker.feed(self._decoder.decode(b"", final=True))
        items = self._items(found + self._walker.finish())
        document = self._document
        if self._pending:
            self._typing = self._rep._typed_prefix(document)
            items += [self._line(value, text) for value, text in self._pending]
            self._pending = []
        document["items"] = []
        page = self.page
        _, page.rv = self._rep.list_items(document)  # learns the kind, checks the RV
        metadata = document.get("metadata") or {}
        page.token = metadata.get("continue") or ""
        remaining = metadata.get("remainingItemCount")
        page.remaining = remaining if isinstance(remaining, int) and remaining >= 0 else None
        return items, page

    def _items(self, found: list[tuple[str, Any, str]]) -> list[tuple[Obj, bytes]]:
        items: list[tuple[Obj, bytes]] = []
        document = self._document
        for key, value, text in found:
            if key != "items":
                document[key] = value
            elif self._typing is None and not ("kind" in document and "apiVersion" in document):
                self._pending.append((value, text))
            else:
                if self._typing is None:
                    self._typing = self._rep._typed_prefix(document)
                items.append(self._line(value, text))
        return items

    def _line(self, value: Obj, text: str) -> tuple[Obj, bytes]:
        assert self._typing is not None
        return self._rep._item_line(text, value, 0, len(text), self._typing)


class Representation:
    """How one shared watch's objects look, are keyed, listed and encoded.

    Guarantees: ``identity`` is equal for two requests exactly when the apiserver would answer
    them with the same representation; ``encode_event`` is a pure function of its arguments;
    ``object_key``/``object_rv`` read the identity and RV of a watch-event object of this
    representation (raising ``ValueError`` when absent).
    """

    identity: str
    list_accept_header: str  # Accept for the upstream LIST
    watch_accept_header: str  # Accept for the upstream WATCH
    framed = False  # a watch body of length-prefixed frames (protobuf), not of lines

    @property
    def accept_header(self) -> str:
        """The upstream WATCH's Accept (differs from the LIST's for PartialObjectMetadata)."""
        return self.watch_accept_header

    def __init__(self) -> None:
        self._kind: str | None = None
        self._api_version: str | None = None

    @property
    def query_params(self) -> Mapping[str, str]:
        """Extra query parameters the upstream LIST and WATCH must carry."""
        return {}

    @property
    def content_type(self) -> str:
        return JSON

    @property
    def stream_content_type(self) -> str:
        """The Content-Type of a watch response."""
        return JSON

    def decode_list_page(self, body: bytes) -> tuple[list[Obj], str, str]:
        """One upstream LIST page → (watch-event objects, its resourceVersion, continue)."""
        document = json.loads(body)
        items, rv = self.list_items(document)
        return items, rv, (document.get("metadata") or {}).get("continue") or ""

    def decode_list_page_lines(self, body: bytes) -> ListPage:
        """:meth:`decode_list_page`, each object with its ADDED event line."""
        items, rv, token = self.decode_list_page(body)
        lines = [(obj, self.encode_event("ADDED", obj)) for obj in items]
        return ListPage(iter(lines), rv, token)

    def list_page_reader(self, max_item_bytes: int) -> PageReader | None:
        """A reader of one LIST page fed in pieces as they arrive (see :class:`PageReader`),
        or None when a page is decoded whole (:meth:`decode_list_page_lines`)."""
        return None

    def decode_event(self, record: bytes) -> tuple[str, Obj]:
        """One upstream watch record (a line, or a frame) → (type, object)."""
        event = json.loads(record)
        return event.get("type"), event.get("object") or {}

    def encode_list(self, objects: list[Obj], rv: str) -> bytes:
        """A LIST response body of ``objects`` at ``rv``."""
        return encode_json(self.list_body(objects, rv))

    def error_line(self, status: Mapping[str, Any]) -> bytes:
        """An ERROR event carrying ``status`` (a Status object)."""
        return self.encode_event("ERROR", status)

    def error_event_from_body(self, body: bytes) -> bytes:
        """An ERROR event carrying an upstream error answer's Status body."""
        return b'{"type":"ERROR","object":' + body.strip() + b"}\n"

    def learn_kind(self, api_version: str, kind: str) -> None:
        """Seed the watched kind (used by BOOKMARK objects) before any list or event."""
        self._api_version, self._kind = api_version, kind

    def learn_bookmark(self, obj: Mapping[str, Any]) -> None:
        """An upstream BOOKMARK's object: what the apiserver's bookmarks look like in this
        representation (only Tables learn from it: their bookmark row's cells)."""

    def list_items(self, list_body: Mapping[str, Any]) -> tuple[list[Obj], str]:
        """One LIST page → (watch-event objects, the list's metadata.resourceVersion)."""
        raise NotImplementedError

    def list_body(self, objects: list[Obj], rv: str) -> Obj:
        """The inverse of :meth:`list_items`: a LIST response of ``objects`` at ``rv``."""
        raise NotImplementedError

    def object_key(self, obj: Mapping[str, Any]) -> str:
        return key_of(obj)

    def object_rv(self, obj: Mapping[str, Any]) -> str:
        return rv_of(obj)

    def with_rv(self, obj: Mapping[str, Any], rv: str) -> Obj:
        return replace_rv(obj, rv)

    def bookmark_object(self, rv: str, *, initial_events_end: bool = False) -> Obj:
        return typed(
            {"metadata": bookmark_metadata(rv, initial_events_end)},
            self._api_version,
            self._kind,
        )

    def prepare(self, obj: Obj) -> Obj:
        """Normalise an upstream watch-event object before it is stored (learns the kind)."""
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if isinstance(kind, str) and isinstance(api_version, str):
            self._kind, self._api_version = kind, api_version
        return obj

    def encode_event(self, event_type: str, obj: Mapping[str, Any]) -> bytes:
        """``{"type":T,"object":{...}}\\n``, compact; pure."""
        return b'{"type":"' + event_type.encode() + b'","object":' + encode_json(obj) + b"}\n"

    def stream_line(self, event_type: str, obj: Mapping[str, Any]) -> bytes:
        """The line stored in history for an event (may announce changed Table columns)."""
        return self.encode_event(event_type, obj)

    def first_line_fixup(self, line: bytes) -> bytes:
        """The first line written to a client; only Tables change it (adds the columns)."""
        return line

    # What a watch cache keeps of each object of its current state: by default the object
    # itself; a representation may keep something smaller (see JsonRepresentation).

    def keep(self, event_type: str, obj: Obj, line: bytes) -> Any:
        """What to keep of ``obj``; ``line`` is ``encode_event(event_type, obj)``."""
        return obj

    def kept_added_line(self, kept: Any) -> bytes | None:
        """The ADDED event of a kept object, if keeping made it; else None (encode it)."""
        return None

    def kept_object(self, kept: Any) -> Obj:
        """The object back from what was kept."""
        result: Obj = kept
        return result

    def encode_kept_list(self, kept: list[Any], rv: str) -> bytes:
        """A LIST response body of the kept objects at ``rv``."""
        return self.encode_list([self.kept_object(k) for k in kept], rv)

    def encode_kept_page(
        self, kept: list[Any], rv: str, token: str, remaining: int | None
    ) -> bytes:
        """A LIST page that more follow: with its continue token and remainingItemCount."""
        return with_page_meta(self.encode_kept_list(kept, rv), rv, token, remaining)

    def kept_list_pieces(
        self,
        kept: list[Any],
        rv: str,
        page: tuple[str, int | None] | None = None,
        piece_bytes: int = LIST_PIECE_BYTES,
    ) -> Iterator[bytes]:
        """The body of :meth:`encode_kept_list` (or, with ``page`` = (token, remaining), of
        :meth:`encode_kept_page`) in pieces of about ``piece_bytes``, each encoded when it is
        asked for (``piece_bytes`` 0: one piece).

        Here for a JSON list whose entries are its last member (``items``; a Table's
        ``rows``): the head is the empty list's encoding, then each kept object's entries are
        encoded on their own, a piece at a time. Compact JSON of a document is the
        concatenation of its members' compact JSON, so the pieces join into
        :meth:`encode_kept_list`'s bytes, while a large answer is never one bytes object nor
        one parsed document (issue 43: a copy of the whole per slow client)."""
        empty = self.list_body([], rv)
        member = next(reversed(empty))
        if empty[member] != []:
            raise AssertionError(
                f"{type(self).__name__}: the list's last member is not its entries"
            )
        head = encode_json(empty)
        if page is not None:
            head = with_page_meta(head, rv, *page)
        parts: list[bytes] = [head[: -len(b"]}")]]
        size = len(parts[0])
        separator = b""
        # Objects are encoded a few at a time (one json.dumps per object was twice the time
        # of encoding the whole), as many as make about a quarter of a piece.
        at, count = 0, 8
        while at < len(kept):
            objects = [self.kept_object(one) for one in kept[at : at + count]]
            at += count
            entries = self.list_body(objects, rv)[member]
            if entries:
                encoded = encode_json(entries)[1:-1]  # the entries without their brackets
                parts.append(separator)
                parts.append(encoded)
                separator = b","
                size += len(encoded) + 1
                if piece_bytes:
                    share = max(1, len(encoded)) / (piece_bytes / 4)
                    count = min(1024, max(1, int(count / share)))
            if piece_bytes and size >= piece_bytes:
                yield b"".join(parts)
                parts = []
                size = 0
        parts.append(b"]}")
        yield b"".join(parts)


_ADDED_PREFIX = b'{"type":"ADDED","object":'
_Typing = tuple[str | None, str | None, bytes]  # the items' apiVersion, kind, line prefix


class JsonRepresentation(Representation):
    """The resource's own JSON: events carry full objects of the watched kind.

    A watch cache keeps each object as its ADDED event line (bytes), not as a dict: parsed
    JSON takes several times the bytes of its text in Python objects (bench.collection;
    bench/README.md, "Figures behind the code"). Initial syncs write the
    kept lines as they are; lists splice them; only a relist's DELETE parses one back.
    """

    identity = "json"
    list_accept_header = JSON
    watch_accept_header = JSON

    def list_page_reader(self, max_item_bytes: int) -> PageReader | None:
        return PageReader(self, max_item_bytes)

    def decode_list_page_lines(self, body: bytes) -> ListPage:
        # Each item's ADDED line is made from the item's own text in the page, not by
        # encoding the parsed item again: encoding was a large part of the hub's time to sync
        # a large collection (bench.collection), and the apiserver's bytes are kept as sent.
        # Items are yielded as they are parsed, so a page is never held as parsed objects.
        page = ListPage(iter(()))
        page.items = self._page_lines(body, page)
        return page

    def _page_lines(self, body: bytes, page: ListPage) -> Iterator[tuple[Obj, bytes]]:
        text = body.decode("utf-8")
        # ASCII (nearly every page): a character offset is a byte offset, so each line is
        # one join of the page's own bytes, with no slice, encode or concatenation between.
        source: str | memoryview = memoryview(body) if body.isascii() else text
        document: Obj = {}
        typing: _Typing | None = None
        pending: list[tuple[Obj, int, int]] = []  # items before the list's kind: typed last
        for key, value, start, end in walk_list(text):
            if key != "items":
                document[key] = value
            elif typing is None and not ("kind" in document and "apiVersion" in document):
                pending.append((value, start, end))
            else:
                if typing is None:
                    typing = self._typed_prefix(document)
                yield self._item_line(source, value, start, end, typing)
        if pending:
            typing = self._typed_prefix(document)
            for value, start, end in pending:
                yield self._item_line(source, value, start, end, typing)
        document["items"] = []
        _, page.rv = self.list_items(document)  # learns the kind, checks the RV
        metadata = document.get("metadata") or {}
        page.token = metadata.get("continue") or ""
        remaining = metadata.get("remainingItemCount")
        page.remaining = remaining if isinstance(remaining, int) and remaining >= 0 else None

    def _typed_prefix(self, document: Obj) -> _Typing:
        """The items' apiVersion and kind, and the start of their ADDED lines."""
        api_version, kind = self._learn_list_kind(document)
        if kind is None or api_version is None:
            return api_version, kind, b""
        head = encode_json({"kind": kind, "apiVersion": api_version})
        return api_version, kind, _ADDED_PREFIX + head[:-1] + b","

    def _item_line(
        self,
        source: str | memoryview,
        raw: Obj,
        start: int,
        end: int,
        typing: tuple[str | None, str | None, bytes],
    ) -> tuple[Obj, bytes]:
        api_version, kind, prefix = typing
        obj = typed(raw, api_version, kind)
        if not prefix or "kind" in raw or "apiVersion" in raw or not raw:
            return obj, self.encode_event("ADDED", obj)
        if isinstance(source, memoryview):
            return obj, b"".join((prefix, source[start + 1 : end], b"}\n"))
        return obj, prefix + source[start + 1 : end].encode() + b"}\n"

    def keep(self, event_type: str, obj: Obj, line: bytes) -> Any:
        if event_type == "ADDED":
            return line  # shared with the history's line
        prefix = len(b'{"type":"') + len(event_type) + len(b'","object":')
        return _ADDED_PREFIX + line[prefix:]

    def kept_added_line(self, kept: Any) -> bytes | None:
        line: bytes = kept
        return line

    def kept_object(self, kept: Any) -> Obj:
        obj: Obj = json.loads(kept[len(_ADDED_PREFIX) : -2])
        return obj

    def encode_kept_list(self, kept: list[Any], rv: str) -> bytes:
        return b"".join(self.kept_list_pieces(kept, rv, piece_bytes=0))

    def encode_kept_page(
        self, kept: list[Any], rv: str, token: str, remaining: int | None
    ) -> bytes:
        return b"".join(self.kept_list_pieces(kept, rv, (token, remaining), piece_bytes=0))

    def kept_list_pieces(
        self,
        kept: list[Any],
        rv: str,
        page: tuple[str, int | None] | None = None,
        piece_bytes: int = LIST_PIECE_BYTES,
    ) -> Iterator[bytes]:
        # piece_bytes 0: one piece. Each item is a view of its kept line, copied once, into
        # its piece: a list of a large collection is never one bytes object.
        head = self.list_body([], rv)
        del head["items"]
        if page is not None:  # the apiserver's ListMeta order: resourceVersion, continue, ...
            token, remaining = page
            head["metadata"]["continue"] = token
            if remaining is not None:
                head["metadata"]["remainingItemCount"] = remaining
        typed_prefix = b""
        if self._kind is not None and self._api_version is not None:
            typed_prefix = encode_json({"kind": self._kind, "apiVersion": self._api_version})
            typed_prefix = typed_prefix[:-1] + b","  # '{"kind":..,"apiVersion":..,'
        parts: list[bytes | memoryview] = [encode_json(head)[:-1], b',"items":[']
        size = 0
        start = len(_ADDED_PREFIX)
        cut = start + len(typed_prefix)
        separator = b"{"
        for line in kept:
            if typed_prefix and line.startswith(typed_prefix, start):
                # List items carry no kind and apiVersion (see list_body): cut them out.
                parts.append(separator)
                parts.append(memoryview(line)[cut:-2])
                size += len(line)
            else:
                item = encode_json(self.list_body([self.kept_object(line)], rv)["items"][0])
                parts.append(separator[:-1])
                parts.append(item)
                size += len(item)
            separator = b",{"
            if piece_bytes and size >= piece_bytes:
                yield b"".join(parts)
                parts = []
                size = 0
        parts.append(b"]}")
        yield b"".join(parts)

    def list_items(self, list_body: Mapping[str, Any]) -> tuple[list[Obj], str]:
        api_version, kind = self._learn_list_kind(list_body)
        items = [typed(item, api_version, kind) for item in list_of(list_body, "items")]
        return items, list_rv(list_body)

    def _learn_list_kind(self, list_body: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """The items' apiVersion and kind, from the list's (``PodList`` → ``Pod``)."""
        list_kind, api_version = list_body.get("kind"), list_body.get("apiVersion")
        kind: str | None = None
        if isinstance(list_kind, str) and list_kind.endswith("List") and len(list_kind) > 4:
            kind = list_kind[:-4]
        if not isinstance(api_version, str):
            api_version = None
        if kind is not None and api_version is not None:
            self._kind, self._api_version = kind, api_version
        return api_version, kind

    def list_body(self, objects: list[Obj], rv: str) -> Obj:
        body: Obj = {}
        if self._kind is not None:
            body["kind"] = self._kind + "List"
        if self._api_version is not None:
            body["apiVersion"] = self._api_version
        body["metadata"] = {"resourceVersion": rv}
        # Watch events carry kind and apiVersion on the object; the items of a list do not
        # (the apiserver's list encoder leaves them out): drop them to answer as it does.
        body["items"] = [
            {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in objects
        ]
        return body


class PartialMetadataRepresentation(Representation):
    """``as=PartialObjectMetadata``: events carry only kind, apiVersion and metadata."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self._api_version = f"{META_GROUP}/{version}"
        self._kind = "PartialObjectMetadata"
        self.identity = f"{self._api_version}:PartialObjectMetadata"
        self.list_accept_header = f"{JSON};as=PartialObjectMetadataList;g={META_GROUP};v={version}"
        self.watch_accept_header = f"{JSON};as=PartialObjectMetadata;g={META_GROUP};v={version}"

    def learn_kind(self, api_version: str, kind: str) -> None:
        """The kind is fixed: PartialObjectMetadata."""

    def prepare(self, obj: Obj) -> Obj:
        return obj

    def list_items(self, list_body: Mapping[str, Any]) -> tuple[list[Obj], str]:
        if list_body.get("kind") != "PartialObjectMetadataList":
            raise ValueError(f"expected a PartialObjectMetadataList, got {list_body.get('kind')}")
        items = [typed(item, self._api_version, self._kind) for item in list_of(list_body, "items")]
        return items, list_rv(list_body)

    def list_body(self, objects: list[Obj], rv: str) -> Obj:
        return {
            "kind": "PartialObjectMetadataList",
            "apiVersion": self._api_version,
            "metadata": {"resourceVersion": rv},
            "items": objects,
        }
