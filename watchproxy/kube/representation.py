"""Which representation of a watched resource a client asked for, and how to serve it faithfully.

A shared watch carries ONE representation: plain JSON, ``PartialObjectMetadata`` or ``Table``.
:func:`watchproxy.kube.negotiation.representation_for` picks one from a client's ``Accept``
header (and ``includeObject``) as the apiserver's content negotiation does, and returns ``None``
whenever the proxy could not be sure to answer byte-for-byte what the apiserver would (protobuf,
YAML or CBOR chosen first, unknown ``as=``, ``pretty``/``sv``/``export``, unknown ``stream=``,
media types that only match case-insensitively, unparsable q-values, an ordering that Go's sort
might not reproduce). Such requests are passed through unchanged.

Table watches, as the apiserver sends them: every event's object is a ``Table`` with exactly one
row (the apiserver converts each event's object alone), ``metadata.resourceVersion`` = that
object's RV, and ``columnDefinitions`` ONLY in the first event of a stream
(``watchEmbeddedEncoder.doEncode`` sets ``tableOptions.NoHeaders = true`` after the first event,
in ``k8s.io/apiserver/pkg/endpoints/handlers/response.go``). kubectl's table printer keeps the
columns of the last table that had them ("This is done when receiving tables in watch events to
save bandwidth") and prints no cell beyond ``len(columnDefinitions)``, so a client whose first
event lacks them prints nothing useful. A shared upstream stream carries the columns only in
its first event, so :class:`TableRepresentation` stores events WITHOUT columns, remembers the
columns (from the LIST and from upstream events) and adds them back to the first line written
to each client with :meth:`Representation.first_line_fixup`. When the columns change mid-stream
(a CRD's printer columns, an apiserver upgrade) the next stored event carries the new columns,
which kubectl handles as a new header.

Representations are stateful (they learn the kind and the columns): one instance per shared
watch. Object dicts handed in are never mutated; dicts handed out must not be mutated either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "INITIAL_EVENTS_END_ANNOTATION",
    "JsonRepresentation",
    "PartialMetadataRepresentation",
    "Representation",
    "TableRepresentation",
    "encode_json",
]

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")
JSON = "application/json"

Obj = dict[str, Any]


def encode_json(value: Any) -> bytes:
    """Compact JSON (no spaces), UTF-8 like the apiserver; ASCII-escaped if not encodable."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # lone surrogates decoded from \\ud800-style escapes
        return json.dumps(value, separators=(",", ":")).encode()


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValueError("object has no metadata")
    return meta


def _key_of(obj: Mapping[str, Any]) -> str:
    meta = _metadata(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("object has no metadata.name")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def _rv_of(obj: Mapping[str, Any]) -> str:
    rv = _metadata(obj).get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise ValueError("object has no metadata.resourceVersion")
    return rv


def _replace_rv(obj: Mapping[str, Any], rv: str) -> Obj:
    out = dict(obj)
    out["metadata"] = {**_metadata(obj), "resourceVersion": rv}
    return out


def _typed(obj: Mapping[str, Any], api_version: str | None, kind: str | None) -> Obj:
    """``obj`` with kind and apiVersion first (list items omit them; events carry them)."""
    head: Obj = {}
    kind = obj.get("kind", kind)
    api_version = obj.get("apiVersion", api_version)
    if kind is not None:
        head["kind"] = kind
    if api_version is not None:
        head["apiVersion"] = api_version
    head.update((k, v) for k, v in obj.items() if k not in ("kind", "apiVersion"))
    return head


def _bookmark_metadata(rv: str, initial_events_end: bool) -> Obj:
    meta: Obj = {"resourceVersion": rv}
    if initial_events_end:
        meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
    return meta


def _list_of(body: Mapping[str, Any], field: str) -> list[Any]:
    items = body.get(field)
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError(f"list body has no {field} array")
    return items


def _list_rv(body: Mapping[str, Any]) -> str:
    rv = _metadata(body).get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise ValueError("list has no metadata.resourceVersion")
    return rv


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

    def learn_kind(self, api_version: str, kind: str) -> None:
        """Seed the watched kind (used by BOOKMARK objects) before any list or event."""
        self._api_version, self._kind = api_version, kind

    def list_items(self, list_body: Mapping[str, Any]) -> tuple[list[Obj], str]:
        """One LIST page → (watch-event objects, the list's metadata.resourceVersion)."""
        raise NotImplementedError

    def list_body(self, objects: list[Obj], rv: str) -> Obj:
        """The inverse of :meth:`list_items`: a LIST response of ``objects`` at ``rv``."""
        raise NotImplementedError

    def object_key(self, obj: Mapping[str, Any]) -> str:
        return _key_of(obj)

    def object_rv(self, obj: Mapping[str, Any]) -> str:
        return _rv_of(obj)

    def with_rv(self, obj: Mapping[str, Any], rv: str) -> Obj:
        return _replace_rv(obj, rv)

    def bookmark_object(self, rv: str, *, initial_events_end: bool = False) -> Obj:
        return _typed(
            {"metadata": _bookmark_metadata(rv, initial_events_end)},
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


class JsonRepresentation(Representation):
    """The resource's own JSON: events carry full objects of the watched kind."""

    identity = "json"
    list_accept_header = JSON
    watch_accept_header = JSON

    def list_items(self, list_body: Mapping[str, Any]) -> tuple[list[Obj], str]:
        list_kind, api_version = list_body.get("kind"), list_body.get("apiVersion")
        kind: str | None = None
        if isinstance(list_kind, str) and list_kind.endswith("List") and len(list_kind) > 4:
            kind = list_kind[:-4]
        if not isinstance(api_version, str):
            api_version = None
        if kind is not None and api_version is not None:
            self._kind, self._api_version = kind, api_version
        items = [_typed(item, api_version, kind) for item in _list_of(list_body, "items")]
        return items, _list_rv(list_body)

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
        items = [
            _typed(item, self._api_version, self._kind) for item in _list_of(list_body, "items")
        ]
        return items, _list_rv(list_body)

    def list_body(self, objects: list[Obj], rv: str) -> Obj:
        return {
            "kind": "PartialObjectMetadataList",
            "apiVersion": self._api_version,
            "metadata": {"resourceVersion": rv},
            "items": objects,
        }


class TableRepresentation(Representation):
    """``as=Table``: each event is a one-row Table; columns go to each client's first event.

    Stored objects never carry ``columnDefinitions`` except in a history line that announces
    changed columns; :meth:`first_line_fixup` adds the current columns to a line without them.
    """

    def __init__(self, version: str, include_object: str) -> None:
        super().__init__()
        self._table_api_version = f"{META_GROUP}/{version}"
        self.include_object = include_object
        self.identity = f"{self._table_api_version}:Table:{include_object}"
        header = f"{JSON};as=Table;g={META_GROUP};v={version}"
        self.list_accept_header = header
        self.watch_accept_header = header
        self._columns: list[Any] | None = None
        self._columns_json = b""
        self._announce = False

    @property
    def query_params(self) -> Mapping[str, str]:
        return {"includeObject": self.include_object}

    @property
    def columns(self) -> list[Any] | None:
        return self._columns

    def _learn_columns(self, columns: Any) -> None:
        if not isinstance(columns, list) or not columns or columns == self._columns:
            return
        if self._columns is not None:
            self._announce = True
        self._columns = columns
        self._columns_json = encode_json(columns)

    def _row_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        rows = obj.get("rows")
        if not isinstance(rows, list) or not rows or not isinstance(rows[0], Mapping):
            raise ValueError("Table has no rows")
        row_obj = rows[0].get("object")
        if not isinstance(row_obj, Mapping):
            raise ValueError("Table row has no object")
        return row_obj

    def object_key(self, obj: Mapping[str, Any]) -> str:
        return _key_of(self._row_object(obj))

    def object_rv(self, obj: Mapping[str, Any]) -> str:
        return _rv_of(self._row_object(obj))

    def with_rv(self, obj: Mapping[str, Any], rv: str) -> Obj:
        rows = obj["rows"]
        row = {**rows[0], "object": _replace_rv(self._row_object(obj), rv)}
        out = _replace_rv(obj, rv) if isinstance(obj.get("metadata"), Mapping) else dict(obj)
        out["rows"] = [row, *rows[1:]]
        return out

    def _single(self, row: Mapping[str, Any]) -> Obj:
        row_obj = row.get("object")
        if not isinstance(row_obj, Mapping):
            raise ValueError("Table row has no object (includeObject=None is not shared)")
        return {
            "kind": "Table",
            "apiVersion": self._table_api_version,
            "metadata": {"resourceVersion": _rv_of(row_obj)},
            "rows": [row],
        }

    def _learn_row_kind(self, row: Any) -> None:
        if self.include_object == "Object" and isinstance(row, Mapping):
            row_obj = row.get("object")
            if isinstance(row_obj, Mapping):
                kind, api_version = row_obj.get("kind"), row_obj.get("apiVersion")
                if isinstance(kind, str) and isinstance(api_version, str):
                    self._kind, self._api_version = kind, api_version

    def list_items(self, list_body: Mapping[str, Any]) -> tuple[list[Obj], str]:
        if list_body.get("kind") != "Table":
            raise ValueError(f"expected a Table, got {list_body.get('kind')}")
        self._learn_columns(list_body.get("columnDefinitions"))
        rows = _list_of(list_body, "rows")
        if rows:
            self._learn_row_kind(rows[-1])
        return [self._single(row) for row in rows], _list_rv(list_body)

    def list_body(self, objects: list[Obj], rv: str) -> Obj:
        rows = [row for obj in objects for row in _list_of(obj, "rows")]
        return {
            "kind": "Table",
            "apiVersion": self._table_api_version,
            "metadata": {"resourceVersion": rv},
            "columnDefinitions": self._columns or [],
            "rows": rows,
        }

    def prepare(self, obj: Obj) -> Obj:
        if "columnDefinitions" in obj:
            self._learn_columns(obj["columnDefinitions"])
            obj = {k: v for k, v in obj.items() if k != "columnDefinitions"}
        rows = obj.get("rows")
        if isinstance(rows, list) and rows:
            self._learn_row_kind(rows[0])
        return obj

    def bookmark_object(self, rv: str, *, initial_events_end: bool = False) -> Obj:
        # The apiserver converts the bookmark's empty object to a Table too: one row whose
        # object carries the RV (and the initial-events-end annotation). Its cells depend on
        # the server's printer for an empty object, which we cannot know: we send none.
        meta = _bookmark_metadata(rv, initial_events_end)
        if self.include_object == "Object":
            row_obj = _typed({"metadata": meta}, self._api_version, self._kind)
        else:
            row_obj = {
                "kind": "PartialObjectMetadata",
                "apiVersion": self._table_api_version,
                "metadata": meta,
            }
        return {
            "kind": "Table",
            "apiVersion": self._table_api_version,
            "metadata": {"resourceVersion": rv},
            "rows": [{"cells": [], "object": row_obj}],
        }

    def stream_line(self, event_type: str, obj: Mapping[str, Any]) -> bytes:
        if self._announce and self._columns is not None:
            self._announce = False
            return self.encode_event(event_type, {"columnDefinitions": self._columns, **obj})
        return self.encode_event(event_type, obj)

    def first_line_fixup(self, line: bytes) -> bytes:
        if not self._columns_json or line.startswith(b'{"type":"ERROR"'):
            return line
        marker = b'","object":{'
        at = line.find(marker)
        if at < 0:
            return line
        at += len(marker)
        if line.startswith(b'"columnDefinitions":', at):
            return line
        sep = b"" if line.startswith(b"}", at) else b","
        return line[:at] + b'"columnDefinitions":' + self._columns_json + sep + line[at:]
