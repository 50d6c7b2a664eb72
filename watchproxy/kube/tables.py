"""``as=Table`` watches and lists (``kubectl get -w``), served from a shared watch.

Table watches, as the apiserver sends them: every event's object is a ``Table`` with exactly one
row (the apiserver converts each event's object alone), ``metadata.resourceVersion`` = that
object's RV, and ``columnDefinitions`` ONLY in the first event of a stream
(``watchEmbeddedEncoder.doEncode`` sets ``tableOptions.NoHeaders = true`` after the first event,
in ``k8s.io/apiserver/pkg/endpoints/handlers/response.go``). kubectl's table printer keeps the
columns of the last table that had them ("This is done when receiving tables in watch events to
save bandwidth") and prints no cell beyond ``len(columnDefinitions)``, so a client whose first
event lacks them prints nothing useful. A shared upstream stream carries the columns only in
its first event, so :class:`TableRepresentation` stores events with ``columnDefinitions: null``
(as the apiserver writes every later event: the Go field has no ``omitempty``), in the Table's
key order (kind, apiVersion, metadata, columnDefinitions, rows), remembers the columns (from the
LIST and from upstream events) and puts them in place of the null in the first line written to
each client with :meth:`Representation.first_line_fixup`. When the columns change mid-stream
(a CRD's printer columns, an apiserver upgrade) the next stored event carries the new columns,
which kubectl handles as a new header.

Bookmarks. The apiserver converts a bookmark's object to a Table like any other (``asTable``
runs the resource's table convertor on it): one row whose object carries the RV (and the
initial-events-end annotation), whose cells are what the convertor prints for an *empty* object
of the kind, and ``columnDefinitions: null`` (no headers after the first event; the Go field has
no ``omitempty``). The cells depend on the convertor:

- the default table convertor (``rest.NewDefaultTableConvertor``: roles, clusterroles,
  limitranges, csistoragecapacities, and any aggregated API that uses it) prints the name and
  the creation time in RFC 3339, UTC: ``["", "0001-01-01T00:00:00Z"]`` for an empty object. It
  is recognised by its two columns (``Name``, ``Created At``) and computed;
- kinds with their own printers (pods, secrets, configmaps, ...; secrets' empty row is
  ``["", "", 0, "<unknown>"]``) and custom resources print what only the server knows. These
  are learned from the apiserver's own bookmarks on the shared upstream watch (periodic, about
  once a minute: :meth:`TableRepresentation.learn_bookmark`); until the first one arrives the
  hub's bookmarks carry no cells (``cells: []``). kubectl prints no bookmark, and clients that
  ask for Table bookmarks read the row's object, not its cells.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from watchproxy.kube.jsonobjects import (
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
from watchproxy.kube.representation import Representation


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
        # The cells of a bookmark's row as the apiserver printed them (learn_bookmark).
        self._bookmark_cells: list[Any] | None = None

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
        return key_of(self._row_object(obj))

    def object_rv(self, obj: Mapping[str, Any]) -> str:
        return rv_of(self._row_object(obj))

    def with_rv(self, obj: Mapping[str, Any], rv: str) -> Obj:
        rows = obj["rows"]
        row = {**rows[0], "object": replace_rv(self._row_object(obj), rv)}
        out = replace_rv(obj, rv) if isinstance(obj.get("metadata"), Mapping) else dict(obj)
        out["rows"] = [row, *rows[1:]]
        return out

    def _single(self, row: Mapping[str, Any]) -> Obj:
        row_obj = row.get("object")
        if not isinstance(row_obj, Mapping):
            raise ValueError("Table row has no object (includeObject=None is not shared)")
        return {
            "kind": "Table",
            "apiVersion": self._table_api_version,
            "metadata": {"resourceVersion": rv_of(row_obj)},
            "columnDefinitions": None,
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
        rows = list_of(list_body, "rows")
        if rows:
            self._learn_row_kind(rows[-1])
        return [self._single(row) for row in rows], list_rv(list_body)

    def list_body(self, objects: list[Obj], rv: str) -> Obj:
        rows = [row for obj in objects for row in list_of(obj, "rows")]
        return {
            "kind": "Table",
            "apiVersion": self._table_api_version,
            "metadata": {"resourceVersion": rv},
            "columnDefinitions": self._columns or [],
            "rows": rows,
        }

    def prepare(self, obj: Obj) -> Obj:
        self._learn_columns(obj.get("columnDefinitions"))
        obj = with_columns(obj, None)
        rows = obj.get("rows")
        if isinstance(rows, list) and rows:
            self._learn_row_kind(rows[0])
        return obj

    def learn_bookmark(self, obj: Mapping[str, Any]) -> None:
        rows = obj.get("rows")
        if isinstance(rows, list) and rows and isinstance(rows[0], Mapping):
            cells = rows[0].get("cells")
            if isinstance(cells, list):
                self._bookmark_cells = cells

    def bookmark_cells(self) -> list[Any]:
        """The cells the apiserver gives a bookmark's row: learned from its own bookmarks,
        else those of the default table convertor when its columns are the default's, else
        none (see the module's docstring)."""
        if self._bookmark_cells is not None:
            return self._bookmark_cells
        if self._columns is not None and default_convertor_columns(self._columns):
            return ["", ZERO_TIME]
        return []

    def bookmark_object(self, rv: str, *, initial_events_end: bool = False) -> Obj:
        meta = bookmark_metadata(rv, initial_events_end)
        if self.include_object == "Object":
            row_obj = typed({"metadata": meta}, self._api_version, self._kind)
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
            "columnDefinitions": None,
            "rows": [{"cells": self.bookmark_cells(), "object": row_obj}],
        }

    def stream_line(self, event_type: str, obj: Mapping[str, Any]) -> bytes:
        if self._announce and self._columns is not None:
            self._announce = False
            return self.encode_event(event_type, with_columns(obj, self._columns))
        return self.encode_event(event_type, obj)

    def first_line_fixup(self, line: bytes) -> bytes:
        if not self._columns_json or line.startswith(b'{"type":"ERROR"'):
            return line
        marker = b'","object":{'
        at = line.find(marker)
        if at < 0:
            return line
        at += len(marker)
        # Stored lines say "columnDefinitions":null, as the apiserver's do after the first
        # event: the first line of a stream has the columns in its place. The Table's own keys
        # come before its rows, and its metadata holds only list metadata, so a key found
        # before the rows is the Table's.
        rows = line.find(b'"rows":', at)
        key = line.find(b'"columnDefinitions":', at, rows if rows >= 0 else len(line))
        if key >= 0:
            if not line.startswith(_NULL_COLUMNS, key):
                return line  # it has them (an announcing line, or fixed already)
            rest = line[key + len(_NULL_COLUMNS) :]
            return line[:key] + b'"columnDefinitions":' + self._columns_json + rest
        if rows >= 0:  # a line without the key: before the rows, where the apiserver has it
            return line[:rows] + b'"columnDefinitions":' + self._columns_json + b"," + line[rows:]
        sep = b"" if line.startswith(b"}", at) else b","
        return line[:at] + b'"columnDefinitions":' + self._columns_json + sep + line[at:]


_NULL_COLUMNS = b'"columnDefinitions":null'


def with_columns(obj: Mapping[str, Any], columns: list[Any] | None) -> Obj:
    """A copy of the Table ``obj`` whose ``columnDefinitions`` is ``columns``, where the
    apiserver puts the key: in its place, or else just before the rows."""
    out: Obj = {}
    for name, value in obj.items():
        if name == "columnDefinitions":
            continue
        if name == "rows":
            out["columnDefinitions"] = columns
        out[name] = value
    if "columnDefinitions" not in out:
        out["columnDefinitions"] = columns
    return out


# The default table convertor's columns (k8s.io/apiserver pkg/registry/rest/table.go) and what
# it prints for an empty object's creation time (Go's zero time, RFC 3339 in UTC).
_DEFAULT_COLUMNS = (("Name", "string", "name"), ("Created At", "date", ""))
ZERO_TIME = "0001-01-01T00:00:00Z"


def default_convertor_columns(columns: list[Any]) -> bool:
    """Whether ``columns`` are the default table convertor's (name, created at)."""
    if len(columns) != len(_DEFAULT_COLUMNS):
        return False
    for column, (name, kind, fmt) in zip(columns, _DEFAULT_COLUMNS, strict=True):
        if not isinstance(column, Mapping):
            return False
        if (column.get("name"), column.get("type"), column.get("format") or "") != (
            name,
            kind,
            fmt,
        ):
            return False
    return True
