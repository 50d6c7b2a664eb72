"""``application/vnd.kubernetes.protobuf`` watches and lists, shared without generated types.

What the apiserver sends (checked against kube-apiserver 1.33 in
``tests/realapi/test_protobuf.py``):

- an object or list is ``k8s\\0`` followed by a ``runtime.Unknown``: ``typeMeta`` (1:
  apiVersion 1, kind 2), ``raw`` (2: the object's own message, without TypeMeta),
  ``contentEncoding`` (3) and ``contentType`` (4);
- a watch stream is frames of a 4-byte big-endian length and a ``metav1.WatchEvent``: ``type``
  (1) and ``object`` (2: a ``RawExtension`` whose field 1 is an enveloped object as above);
- every object's field 1 is its ``ObjectMeta``: name 1, namespace 3, resourceVersion 6,
  annotations 12 (map entries: key 1, value 2); a list's field 1 is its ``ListMeta``
  (resourceVersion 2, continue 3) and field 2 its items, each an object's own message.

A stored object is a small dict (``apiVersion``, ``kind``, ``metadata`` with name, namespace
and resourceVersion, and ``raw``: the object's message as received), so the watch cache keys,
orders and diffs it like a JSON object; every line the hub writes re-uses those bytes. The only
rewrite is a relist DELETE's resourceVersion (field 6 of field 1; every other field is copied).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from watchproxy.kube import protowire as pw
from watchproxy.kube.representation import (
    INITIAL_EVENTS_END_ANNOTATION,
    LIST_PIECE_BYTES,
    Representation,
)

PROTOBUF = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
Obj = dict[str, Any]

# runtime.Unknown, metav1.WatchEvent, RawExtension, ObjectMeta, ListMeta, Status
_TYPE_META, _RAW, _ENCODING, _CONTENT_TYPE = 1, 2, 3, 4
_EVENT_TYPE, _EVENT_OBJECT, _EXTENSION_RAW = 1, 2, 1
_METADATA, _ITEMS = 1, 2
_NAME, _NAMESPACE, _RV, _ANNOTATIONS = 1, 3, 6, 12
_LIST_RV, _LIST_CONTINUE, _LIST_REMAINING = 2, 3, 4
_STATUS_META, _STATUS, _MESSAGE, _REASON, _CODE = 1, 2, 3, 4, 6


# What follows an enveloped object's raw bytes: its contentEncoding and contentType, empty.
_ENVELOPE_TAIL = pw.length_field(_ENCODING, b"") + pw.length_field(_CONTENT_TYPE, b"")


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    return envelope_head(api_version, kind, len(raw)) + raw + _ENVELOPE_TAIL


def envelope_head(api_version: str, kind: str, raw_size: int) -> bytes:
    """An envelope up to its raw bytes, ``raw_size`` of them: written before them, so that
    the raw bytes (a list's items) need not be one bytes object."""
    type_meta = pw.length_field(1, api_version.encode()) + pw.length_field(2, kind.encode())
    return (
        MAGIC
        + pw.length_field(_TYPE_META, type_meta)
        + pw.encode_varint(_RAW << 3 | pw.LENGTH)
        + pw.encode_varint(raw_size)
    )


def open_envelope(data: bytes) -> tuple[str, str, bytes]:
    """(apiVersion, kind, raw) of an enveloped object; ``ValueError`` if it is not one."""
    if not data.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf object (no k8s\\0 prefix)")
    body = data[len(MAGIC) :]
    if pw.text(body, _ENCODING) or pw.text(body, _CONTENT_TYPE):
        raise ValueError("an encoded or nested content type is not supported")
    type_meta = pw.first(body, _TYPE_META) or b""
    return pw.text(type_meta, 1), pw.text(type_meta, 2), pw.first(body, _RAW) or b""


def frame(event_type: str, enveloped: bytes) -> bytes:
    """One watch-stream frame: length prefix and WatchEvent."""
    event = pw.length_field(_EVENT_TYPE, event_type.encode()) + pw.length_field(
        _EVENT_OBJECT, pw.length_field(_EXTENSION_RAW, enveloped)
    )
    return len(event).to_bytes(4, "big") + event


def _metadata_of(raw: bytes) -> Obj:
    meta = pw.first(raw, _METADATA) or b""
    metadata: Obj = {"name": pw.text(meta, _NAME), "resourceVersion": pw.text(meta, _RV)}
    namespace = pw.text(meta, _NAMESPACE)
    if namespace:
        metadata["namespace"] = namespace
    return metadata


def _stored(api_version: str, kind: str, raw: bytes) -> Obj:
    return {"apiVersion": api_version, "kind": kind, "metadata": _metadata_of(raw), "raw": raw}


def _status_message(status: Mapping[str, Any]) -> bytes:
    return (
        pw.length_field(_STATUS_META, b"")
        + pw.length_field(_STATUS, str(status.get("status", "Failure")).encode())
        + pw.length_field(_MESSAGE, str(status.get("message", "")).encode())
        + pw.length_field(_REASON, str(status.get("reason", "")).encode())
        + pw.varint_field(_CODE, int(status.get("code", 500)))
    )


def _status_of(raw: bytes) -> Obj:
    code = 0
    for number, wire, value, _ in pw.fields(raw):
        if number == _CODE and wire == pw.VARINT:
            assert isinstance(value, int)
            code = value
    return {
        "kind": "Status",
        "status": pw.text(raw, _STATUS),
        "message": pw.text(raw, _MESSAGE),
        "reason": pw.text(raw, _REASON),
        "code": code,
    }


class ProtobufRepresentation(Representation):
    """The resource's own protobuf (built-in kinds; the apiserver answers 406 for others)."""

    identity = "protobuf"
    list_accept_header = PROTOBUF
    watch_accept_header = PROTOBUF
    framed = True

    @property
    def content_type(self) -> str:
        return PROTOBUF

    @property
    def stream_content_type(self) -> str:
        return PROTOBUF + ";stream=watch"

    def decode_list_page(self, body: bytes) -> tuple[list[Obj], str, str]:
        api_version, list_kind, raw = open_envelope(body)
        if not list_kind.endswith("List") or len(list_kind) <= 4:
            raise ValueError(f"not a list: {list_kind!r}")
        kind = list_kind[:-4]
        self._api_version, self._kind = api_version, kind
        meta = pw.first(raw, _METADATA) or b""
        rv = pw.text(meta, _LIST_RV)
        if not rv:
            raise ValueError("list has no metadata.resourceVersion")
        items = [
            _stored(api_version, kind, value)
            for number, wire, value, _ in pw.fields(raw)
            if number == _ITEMS and wire == pw.LENGTH and isinstance(value, bytes)
        ]
        return items, rv, pw.text(meta, _LIST_CONTINUE)

    def decode_event(self, record: bytes) -> tuple[str, Obj]:
        if len(record) < 4 or int.from_bytes(record[:4], "big") != len(record) - 4:
            raise ValueError("a watch frame whose length prefix does not match")
        event = record[4:]
        event_type = pw.text(event, _EVENT_TYPE)
        extension = pw.first(event, _EVENT_OBJECT) or b""
        api_version, kind, raw = open_envelope(pw.first(extension, _EXTENSION_RAW) or b"")
        if event_type == "ERROR":
            return event_type, _status_of(raw)
        return event_type, _stored(api_version, kind, raw)

    def encode_event(self, event_type: str, obj: Mapping[str, Any]) -> bytes:
        api_version = obj.get("apiVersion") or self._api_version or ""
        kind = obj.get("kind") or self._kind or ""
        return frame(event_type, envelope(api_version, kind, obj["raw"]))

    def with_rv(self, obj: Mapping[str, Any], rv: str) -> Obj:
        raw: bytes = obj["raw"]
        meta = pw.replace(pw.first(raw, _METADATA) or b"", _RV, rv.encode())
        return {
            **obj,
            "metadata": {**obj["metadata"], "resourceVersion": rv},
            "raw": pw.replace(raw, _METADATA, meta),
        }

    def bookmark_object(self, rv: str, *, initial_events_end: bool = False) -> Obj:
        meta = pw.length_field(_RV, rv.encode())
        if initial_events_end:
            entry = pw.length_field(1, INITIAL_EVENTS_END_ANNOTATION.encode()) + pw.length_field(
                2, b"true"
            )
            meta += pw.length_field(_ANNOTATIONS, entry)
        raw = pw.length_field(_METADATA, meta)
        return {
            "apiVersion": self._api_version or "",
            "kind": self._kind or "",
            "metadata": {"resourceVersion": rv},
            "raw": raw,
        }

    def error_line(self, status: Mapping[str, Any]) -> bytes:
        return frame("ERROR", envelope("v1", "Status", _status_message(status)))

    def error_event_from_body(self, body: bytes) -> bytes:
        if body.startswith(MAGIC):
            return frame("ERROR", body)
        return self.error_line(json.loads(body))

    def encode_list(
        self, objects: list[Obj], rv: str, token: str = "", remaining: int | None = None
    ) -> bytes:
        return b"".join(self._list_pieces(objects, rv, token, remaining, 0))

    def kept_list_pieces(
        self,
        kept: list[Any],
        rv: str,
        page: tuple[str, int | None] | None = None,
        piece_bytes: int = LIST_PIECE_BYTES,
    ) -> Iterator[bytes]:
        token, remaining = page if page is not None else ("", None)
        return self._list_pieces(kept, rv, token, remaining, piece_bytes)

    def _list_pieces(
        self,
        objects: list[Obj],
        rv: str,
        token: str,
        remaining: int | None,
        piece_bytes: int,
    ) -> Iterator[bytes]:
        """The enveloped list in pieces of about ``piece_bytes`` (0: one). The envelope's
        ``raw`` field is length-prefixed, so its length is summed from the items' first (no
        copy); then each item's message is copied once, into its piece."""
        # ListMeta as the apiserver marshals it: every string field, empty or not, and
        # remainingItemCount (a pointer in Go) only when set.
        meta = (
            pw.length_field(1, b"")
            + pw.length_field(_LIST_RV, rv.encode())
            + pw.length_field(_LIST_CONTINUE, token.encode())
        )
        if remaining is not None:
            meta += pw.varint_field(_LIST_REMAINING, remaining)
        meta_field = pw.length_field(_METADATA, meta)
        item_tag = pw.encode_varint(_ITEMS << 3 | pw.LENGTH)
        raw_size = len(meta_field) + sum(
            len(item_tag) + len(pw.encode_varint(len(obj["raw"]))) + len(obj["raw"])
            for obj in objects
        )
        kind = (self._kind or "") + "List"
        parts = [envelope_head(self._api_version or "", kind, raw_size), meta_field]
        size = 0
        for obj in objects:
            raw: bytes = obj["raw"]
            parts += (item_tag, pw.encode_varint(len(raw)), raw)
            size += len(raw)
            if piece_bytes and size >= piece_bytes:
                yield b"".join(parts)
                parts = []
                size = 0
        parts.append(_ENVELOPE_TAIL)
        yield b"".join(parts)

    def encode_kept_page(
        self, kept: list[Any], rv: str, token: str, remaining: int | None
    ) -> bytes:
        return self.encode_list([self.kept_object(k) for k in kept], rv, token, remaining)
