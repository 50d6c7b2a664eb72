"""Accept negotiation, list splitting, bookmarks and Table columns of kube.representation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchproxy.kube.jsonlist import walk_list
from watchproxy.kube.negotiation import representation_for
from watchproxy.kube.representation import (
    INITIAL_EVENTS_END_ANNOTATION,
    JsonRepresentation,
    PartialMetadataRepresentation,
    Representation,
)
from watchproxy.kube.tables import TableRepresentation

KUBECTL_GET_W = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
METADATA_PROTOBUF = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

TABLE_V1 = "meta.k8s.io/v1:Table:Metadata"
POM_V1 = "meta.k8s.io/v1:PartialObjectMetadata"

# (accept, includeObject, expected identity or None = pass through)
ACCEPT_CASES: list[tuple[str | None, str | None, str | None]] = [
    (None, None, "json"),
    ("", None, "json"),
    ("   ", None, "json"),
    ("application/json", None, "json"),
    ("*/*", None, "json"),
    ("application/*", None, "json"),
    ("application/json, */*", None, "json"),
    ("application/json;stream=watch", None, "json"),
    ("application/json;charset=utf-8", None, "json"),  # HTTP's own: no apiserver reads it
    ("text/html, application/json", None, "json"),  # text/html matches nothing: skipped
    ("application/json;AS=Table", None, None),  # case-sensitive: unknown, so passed through
    ("application/json;AS=Table;g=meta.k8s.io;v=v1", None, None),  # g/v without a kind
    (KUBECTL_GET_W, None, TABLE_V1),
    (KUBECTL_GET_W, "Metadata", TABLE_V1),
    (KUBECTL_GET_W, "", TABLE_V1),
    (KUBECTL_GET_W, "Object", "meta.k8s.io/v1:Table:Object"),
    (KUBECTL_GET_W, "None", None),  # rows without objects cannot be keyed
    (KUBECTL_GET_W, "bogus", None),  # the apiserver answers 400
    (
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
        None,
        "meta.k8s.io/v1beta1:Table:Metadata",
    ),
    (" application/json ; as=Table ; g=meta.k8s.io ; v=v1 ", None, TABLE_V1),
    ("application/json;g=meta.k8s.io;v=v1;as=Table", None, TABLE_V1),  # param order irrelevant
    ("*/*;as=Table;g=meta.k8s.io;v=v1", None, TABLE_V1),
    (METADATA_WATCH, None, POM_V1),
    (METADATA_WATCH, "Object", POM_V1),  # includeObject only matters for Tables
    (
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
        None,
        "meta.k8s.io/v1beta1:PartialObjectMetadata",
    ),
    # a watch asking for the List kind would fail in the apiserver's encoder
    (
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        None,
        None,
    ),
    ("application/vnd.kubernetes.protobuf", None, "protobuf"),
    ("application/vnd.kubernetes.protobuf, application/json", None, "protobuf"),
    ("application/vnd.kubernetes.protobuf;stream=watch", None, "protobuf"),
    ("application/vnd.kubernetes.protobuf;stream=other", None, None),
    (METADATA_PROTOBUF, None, None),
    ("application/json, application/vnd.kubernetes.protobuf", None, "json"),
    ("application/yaml", None, None),
    ("application/cbor", None, None),
    ("application/json;stream=other", None, None),
    ("application/json;pretty=1", None, None),
    # 1.37.2 ignores drop= (no such feature yet); a later apiserver may not: never shared
    ("application/json;drop=metadata.managedFields", None, None),
    ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1;drop=x", None, None),
    ("application/json;profile=local", None, None),
    ("application/cbor, application/json", None, None),  # CBOR first: the apiserver decides
    ("application/json, application/cbor", None, "json"),
    ("application/cbor-seq", None, None),
    ("application/json;as=Table", None, None),  # no group/version: the apiserver skips it
    ("application/json;as=Foo;g=meta.k8s.io;v=v1", None, None),
    ("application/json;as=Table;g=example.com;v=v1", None, None),
    ("application/json;as=Table;g=meta.k8s.io;v=v2", None, None),
    ("Application/JSON", None, None),  # the apiserver matches case-sensitively
    ("text/plain", None, None),  # nothing acceptable: 406 from the apiserver
    # q-values: the apiserver sorts by q, then by specificity
    ("application/vnd.kubernetes.protobuf;q=0.5, application/json", None, "json"),
    ("application/json;q=0.5, application/vnd.kubernetes.protobuf", None, "protobuf"),
    (f"application/json;q=0.9, {KUBECTL_GET_W.split(',')[0]}", None, TABLE_V1),
    ("application/json;q=1.0, application/json;as=Table;g=meta.k8s.io;v=v1;q=1", None, "json"),
    ("application/json;q=0.1, application/yaml;q=0.2", None, None),
    ("application/yaml;q=0, application/json", None, "json"),
    ("*/*;q=0.8, application/json;as=Table;g=meta.k8s.io;v=v1", None, TABLE_V1),
    ("*/*, application/json;as=Table;g=meta.k8s.io;v=v1", None, TABLE_V1),  # specific first
    ("application/*, application/json;as=Table;g=meta.k8s.io;v=v1", None, TABLE_V1),
    ("application/json;q=abc", None, None),  # Go reads it as q=0: too subtle to mimic
    ("application/json;q= 0.5", None, None),
    ("*/json", None, None),
    # goautoneg's comparator is inconsistent when a less specific type has a higher q
    ("application/json;q=0.5, */*;q=0.9", None, None),
]


@pytest.mark.parametrize(("accept", "include_object", "identity"), ACCEPT_CASES)
def test_accept_negotiation(
    accept: str | None, include_object: str | None, identity: str | None
) -> None:
    rep = representation_for(accept, include_object)
    assert (rep.identity if rep is not None else None) == identity


def test_equivalent_headers_share_an_identity_and_different_ones_do_not() -> None:
    same = [
        KUBECTL_GET_W,
        "application/json;as=Table;g=meta.k8s.io;v=v1",
        "application/json; as=Table; g=meta.k8s.io; v=v1",
        "application/json;as=Table;g=meta.k8s.io;v=v1;q=1, application/json;q=0.5",
    ]
    identities = {r.identity for a in same if (r := representation_for(a, None)) is not None}
    assert identities == {TABLE_V1}
    different = [
        "application/json",
        KUBECTL_GET_W,
        "application/json;as=Table;g=meta.k8s.io;v=v1beta1",
        METADATA_WATCH,
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
    ]
    found = [r.identity for a in different if (r := representation_for(a, None)) is not None]
    assert len(set(found)) == len(different)
    assert representation_for(KUBECTL_GET_W, "Object") is not None
    assert representation_for(KUBECTL_GET_W, "Object").identity != TABLE_V1  # type: ignore[union-attr]


def test_long_unsorted_accept_is_passed_through() -> None:
    header = ",".join(["text/plain"] * 7 + ["application/json;q=0.5", "application/json"])
    assert representation_for(header, None) is None
    sorted_header = ",".join(["application/json"] + ["text/plain"] * 8)
    assert representation_for(sorted_header, None) is not None
    assert representation_for(",".join(["application/json"] * 13), None) is None


@given(st.text(max_size=80))
def test_accept_parsing_never_raises(header: str) -> None:
    rep = representation_for(header, None)
    assert rep is None or isinstance(rep, Representation)


def test_upstream_accept_headers() -> None:
    table = representation_for(KUBECTL_GET_W, None)
    assert isinstance(table, TableRepresentation)
    assert table.list_accept_header == table.watch_accept_header == table.accept_header
    assert table.accept_header == "application/json;as=Table;g=meta.k8s.io;v=v1"
    assert table.query_params == {"includeObject": "Metadata"}
    pom = representation_for(METADATA_WATCH, None)
    assert isinstance(pom, PartialMetadataRepresentation)
    assert pom.list_accept_header == (
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
    )
    assert (
        pom.watch_accept_header
        == pom.accept_header
        == ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")
    )
    plain = representation_for(None, None)
    assert plain is not None
    assert plain.accept_header == plain.list_accept_header == "application/json"
    assert plain.query_params == {}


# --- lists ---------------------------------------------------------------------------------


def pod_item(name: str, rv: str, namespace: str | None = "default") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "spec": {"nodeName": "n1"}}


def test_json_list_items_get_kind_and_api_version() -> None:
    rep = JsonRepresentation()
    body: dict[str, Any] = {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "100"},
        "items": [pod_item("a", "5"), pod_item("b", "7")],
    }
    items, rv = rep.list_items(body)
    assert rv == "100"
    assert [list(i)[:2] for i in items] == [["kind", "apiVersion"]] * 2  # first, as upstream
    assert items[0] == {"kind": "Pod", "apiVersion": "v1", **pod_item("a", "5")}
    assert [rep.object_key(i) for i in items] == ["default/a", "default/b"]
    assert [rep.object_rv(i) for i in items] == ["5", "7"]
    assert body["items"][0] == pod_item("a", "5")  # input not mutated
    assert rep.bookmark_object("123") == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "123"},
    }
    assert rep.list_body(items, "100")["kind"] == "PodList"


def test_json_list_keeps_item_kind_of_custom_resources_and_handles_null_items() -> None:
    rep = JsonRepresentation()
    cr = {"kind": "Widget", "apiVersion": "example.com/v1", **pod_item("w", "3", None)}
    items, _ = rep.list_items(
        {
            "kind": "WidgetList",
            "apiVersion": "example.com/v1",
            "metadata": {"resourceVersion": "9"},
            "items": [cr],
        }
    )
    assert items == [cr]
    assert rep.object_key(items[0]) == "w"  # cluster-scoped
    assert rep.list_items(
        {
            "kind": "WidgetList",
            "apiVersion": "example.com/v1",
            "metadata": {"resourceVersion": "10"},
            "items": None,
        }
    ) == ([], "10")


def test_list_without_resource_version_is_rejected() -> None:
    with pytest.raises(ValueError):
        JsonRepresentation().list_items({"kind": "PodList", "apiVersion": "v1", "items": []})


def test_partial_metadata_list_items() -> None:
    rep = PartialMetadataRepresentation("v1")
    body = {
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "50"},
        "items": [{"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "4"}}],
    }
    items, rv = rep.list_items(body)
    assert rv == "50"
    assert items == [
        {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "4"},
        }
    ]
    assert rep.bookmark_object("60", initial_events_end=True) == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {
            "resourceVersion": "60",
            "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"},
        },
    }
    with pytest.raises(ValueError):
        rep.list_items({**body, "kind": "PodList"})


COLUMNS = [
    {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0},
    {"name": "Age", "type": "string", "format": "", "description": "", "priority": 0},
]


def table_row(name: str, rv: str, age: str = "1m") -> dict[str, Any]:
    return {
        "cells": [name, age],
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
        },
    }


def table_list(rv: str, *rows: dict[str, Any], columns: list[Any] = COLUMNS) -> dict[str, Any]:
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": columns,
        "rows": list(rows),
    }


def table_event_object(row: dict[str, Any], columns: list[Any] | None = None) -> dict[str, Any]:
    """A watch event's Table as the apiserver writes it: the columns in the first event of a
    stream, null in every later one."""
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": row["object"]["metadata"]["resourceVersion"]},
        "columnDefinitions": columns,
        "rows": [row],
    }


def table_rep(include_object: str = "Metadata") -> TableRepresentation:
    rep = representation_for(KUBECTL_GET_W, include_object)
    assert isinstance(rep, TableRepresentation)
    return rep


def test_table_list_is_split_into_one_row_tables_with_null_columns() -> None:
    rep = table_rep()
    items, rv = rep.list_items(table_list("90", table_row("a", "5"), table_row("b", "8")))
    assert rv == "90"
    assert items == [
        table_event_object(table_row("a", "5")),
        table_event_object(table_row("b", "8")),
    ]
    assert rep.columns == COLUMNS
    assert [rep.object_key(i) for i in items] == ["default/a", "default/b"]
    assert [rep.object_rv(i) for i in items] == ["5", "8"]
    back = rep.list_body(items, "90")
    assert back == table_list("90", table_row("a", "5"), table_row("b", "8"))


def test_table_first_line_gets_column_definitions_once() -> None:
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5")))
    line = rep.encode_event("ADDED", table_event_object(table_row("a", "5")))
    fixed = rep.first_line_fixup(line)
    event = json.loads(fixed)
    assert event["type"] == "ADDED"
    assert event["object"]["columnDefinitions"] == COLUMNS
    assert event["object"]["rows"] == [table_row("a", "5")]
    assert fixed.endswith(b"}\n") and b" " not in fixed.replace(b"1m", b"")
    assert rep.first_line_fixup(fixed) == fixed  # never twice
    assert json.loads(line)["object"].get("columnDefinitions") is None
    error = b'{"type":"ERROR","object":{"kind":"Status"}}\n'
    assert rep.first_line_fixup(error) == error


def test_a_table_line_without_the_key_gets_the_columns_before_its_rows() -> None:
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5")))
    line = b'{"type":"ADDED","object":{"kind":"Table","metadata":{},"rows":[]}}\n'
    fixed = json.loads(rep.first_line_fixup(line))["object"]
    assert list(fixed) == ["kind", "metadata", "columnDefinitions", "rows"]
    assert fixed["columnDefinitions"] == COLUMNS


def test_table_fixup_is_identity_until_columns_are_known_and_for_other_representations() -> None:
    line = b'{"type":"ADDED","object":{"kind":"Table"}}\n'
    assert table_rep().first_line_fixup(line) == line
    assert JsonRepresentation().first_line_fixup(line) == line


def test_table_upstream_events_are_stored_with_null_columns_in_the_apiservers_place() -> None:
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5")))
    upstream_first = table_event_object(table_row("a", "95"), COLUMNS)
    prepared = rep.prepare(upstream_first)
    assert prepared["columnDefinitions"] is None
    assert list(prepared) == ["kind", "apiVersion", "metadata", "columnDefinitions", "rows"]
    assert upstream_first["columnDefinitions"] == COLUMNS  # not mutated
    line = rep.stream_line("MODIFIED", prepared)
    assert b'"metadata":{"resourceVersion":"95"},"columnDefinitions":null,"rows":' in line
    # The first line written to a client has the columns where the null was.
    fixed = json.loads(rep.first_line_fixup(line))["object"]
    assert list(fixed) == ["kind", "apiVersion", "metadata", "columnDefinitions", "rows"]
    assert fixed["columnDefinitions"] == COLUMNS


def test_table_changed_columns_are_announced_in_the_next_stored_line() -> None:
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5")))
    new_columns = [
        *COLUMNS,
        {"name": "Ready", "type": "string", "format": "", "description": "", "priority": 0},
    ]
    prepared = rep.prepare(table_event_object(table_row("a", "95"), new_columns))
    line = rep.stream_line("MODIFIED", prepared)
    announced = json.loads(line)["object"]
    assert announced["columnDefinitions"] == new_columns
    assert list(announced) == ["kind", "apiVersion", "metadata", "columnDefinitions", "rows"]
    assert rep.first_line_fixup(line) == line
    later = rep.stream_line("MODIFIED", rep.prepare(table_event_object(table_row("a", "96"))))
    assert json.loads(later)["object"]["columnDefinitions"] is None
    assert json.loads(rep.first_line_fixup(later))["object"]["columnDefinitions"] == new_columns


def test_table_with_rv_and_bookmark() -> None:
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5")))
    obj = table_event_object(table_row("a", "5"))
    moved = rep.with_rv(obj, "99")
    assert rep.object_rv(moved) == "99"
    assert moved["metadata"]["resourceVersion"] == "99"
    assert rep.object_rv(obj) == "5"  # not mutated
    bookmark = rep.bookmark_object("120", initial_events_end=True)
    assert bookmark["kind"] == "Table"
    assert bookmark["metadata"] == {"resourceVersion": "120"}
    row_obj = bookmark["rows"][0]["object"]
    assert row_obj["kind"] == "PartialObjectMetadata"
    assert row_obj["metadata"]["annotations"] == {INITIAL_EVENTS_END_ANNOTATION: "true"}
    assert rep.object_rv(bookmark) == "120"


# The default table convertor's columns, as kube-apiserver 1.37 sends them for roles.
DEFAULT_CONVERTOR_COLUMNS = [
    {
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name must be unique.",
        "priority": 0,
    },
    {
        "name": "Created At",
        "type": "date",
        "format": "",
        "description": "CreationTimestamp.",
        "priority": 0,
    },
]


def test_a_table_bookmark_has_null_columns_and_the_default_convertors_empty_row() -> None:
    """The apiserver runs the table convertor on the bookmark's empty object: the default
    convertor prints an empty name and Go's zero time; no headers after the first event."""
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5"), columns=DEFAULT_CONVERTOR_COLUMNS))
    bookmark = rep.bookmark_object("120", initial_events_end=True)
    assert list(bookmark) == ["kind", "apiVersion", "metadata", "columnDefinitions", "rows"]
    assert bookmark["columnDefinitions"] is None
    assert bookmark["rows"][0]["cells"] == ["", "0001-01-01T00:00:00Z"]


def test_a_table_bookmark_takes_the_cells_of_the_apiservers_own_bookmarks() -> None:
    """A kind with its own printer (secrets: name, type, data, age) prints what only the
    server knows for an empty object: none until an upstream bookmark shows them."""
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5")))
    assert rep.bookmark_object("120")["rows"][0]["cells"] == []
    upstream = rep.bookmark_object("130")
    upstream["rows"] = [{**upstream["rows"][0], "cells": ["", "", 0, "<unknown>"]}]
    rep.learn_bookmark(upstream)
    assert rep.bookmark_object("140")["rows"][0]["cells"] == ["", "", 0, "<unknown>"]
    # Learned cells win over the default convertor's guess.
    rep.list_items(table_list("150", table_row("a", "5"), columns=DEFAULT_CONVERTOR_COLUMNS))
    assert rep.bookmark_object("160")["rows"][0]["cells"] == ["", "", 0, "<unknown>"]


def test_a_bookmark_as_a_streams_first_line_gets_the_columns_in_place_of_null() -> None:
    rep = table_rep()
    rep.list_items(table_list("90", table_row("a", "5")))
    line = rep.encode_event("BOOKMARK", rep.bookmark_object("120", initial_events_end=True))
    assert b'"columnDefinitions":null' in line
    fixed = rep.first_line_fixup(line)
    assert fixed.count(b"columnDefinitions") == 1
    obj = json.loads(fixed)["object"]
    assert list(obj) == ["kind", "apiVersion", "metadata", "columnDefinitions", "rows"]
    assert obj["columnDefinitions"] == COLUMNS
    assert rep.first_line_fixup(fixed) == fixed


def test_table_include_object_learns_the_watched_kind_for_bookmarks() -> None:
    rep = table_rep("Object")
    row = {
        "cells": ["a", "1m"],
        "object": {"kind": "Pod", "apiVersion": "v1", **pod_item("a", "5")},
    }
    rep.list_items(table_list("90", row))
    assert rep.bookmark_object("91")["rows"][0]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "91"},
    }


def test_table_rows_without_objects_are_rejected() -> None:
    with pytest.raises(ValueError):
        table_rep().list_items(table_list("90", {"cells": ["a", "1m"], "object": None}))


def test_json_learns_kind_from_events_and_can_be_seeded() -> None:
    rep = JsonRepresentation()
    assert rep.bookmark_object("1") == {"metadata": {"resourceVersion": "1"}}
    rep.learn_kind("apps/v1", "Deployment")
    assert rep.bookmark_object("1")["kind"] == "Deployment"
    rep.prepare({"kind": "ReplicaSet", "apiVersion": "apps/v1", **pod_item("x", "2")})
    assert rep.bookmark_object("2")["kind"] == "ReplicaSet"


def test_encoding_is_compact_and_utf8() -> None:
    rep = JsonRepresentation()
    line = rep.encode_event("ADDED", {"metadata": {"name": "ü", "resourceVersion": "1"}})
    assert (
        line
        == '{"type":"ADDED","object":{"metadata":{"name":"ü","resourceVersion":"1"}}}\n'.encode()
    )
    lone = rep.encode_event("ADDED", {"x": "\ud800"})
    assert json.loads(lone)["object"]["x"] == "\ud800"


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(st.dictionaries(st.text(max_size=6), _JSON_VALUES, max_size=4), max_size=4),
    extra=st.dictionaries(st.sampled_from(["kind", "apiVersion", "x"]), _JSON_VALUES, max_size=2),
    indent=st.sampled_from([None, 1]),
)
def test_a_list_is_walked_into_exactly_what_json_parses(
    items: list[dict[str, Any]], extra: dict[str, Any], indent: int | None
) -> None:
    document = {**extra, "metadata": {"resourceVersion": "5"}, "items": items}
    text = json.dumps(document, indent=indent, ensure_ascii=False)
    members = list(walk_list(text))
    others = {k: v for k, v in json.loads(text).items() if k != "items"}
    assert {k: v for k, v, _, _ in members if k != "items"} == others
    walked = [(v, text[start:end]) for k, v, start, end in members if k == "items"]
    assert [v for v, _ in walked] == items
    assert [json.loads(raw) for _, raw in walked] == items


@pytest.mark.parametrize(
    "bad", ['{"items":[1]}', '{"items":[{}', '{"a":1 "b":2}', "[]", '{"items":[]} x', "{"]
)
def test_a_broken_list_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        list(walk_list(bad))


def test_list_lines_are_the_items_own_bytes_typed_in_any_member_order() -> None:
    rep = JsonRepresentation()
    body = (
        b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":['
        b'{"metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"x":"\\u003c"}]}'
    )
    page = rep.decode_list_page_lines(body)
    [(obj, line)] = list(page.items)
    assert (page.rv, page.token) == ("7", "")
    assert obj["kind"] == "Pod" and obj["x"] == "<"
    assert line == (
        b'{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1",'
        b'"metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"x":"\\u003c"}}\n'
    )
    assert json.loads(line)["object"] == obj
    # Items before the list's kind (not the apiserver's order) are typed once it is known.
    as_sent = json.loads(body)
    late = rep.decode_list_page_lines(json.dumps({"items": as_sent["items"], **as_sent}).encode())
    [(late_obj, _)] = list(late.items)
    assert late_obj == obj and late.rv == "7"


def partial_item(name: str, rv: str) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": rv, "x": "é" * 50},
    }


@pytest.mark.parametrize("page", [None, ("tok", 7), ("tok", None)])
@pytest.mark.parametrize("kind", ["table", "partial"])
def test_table_and_partial_metadata_lists_come_in_pieces_that_join_into_the_whole(
    kind: str, page: tuple[str, int | None] | None
) -> None:
    """A LIST from the cache in these representations is encoded entry by entry (issue 43: it
    was one bytes object per answer); joined, the pieces are the whole encoding."""
    rep: Representation
    if kind == "table":
        rep = table_rep()
        rep.list_items(table_list("90"))  # learns the columns
        kept: list[Any] = [
            table_event_object(table_row(f"p-{i:03}", str(i + 1), "x" * i)) for i in range(120)
        ]
    else:
        rep = PartialMetadataRepresentation("v1")
        kept = [partial_item(f"p-{i:03}", str(i + 1)) for i in range(120)]
    whole = (
        rep.encode_kept_list(kept, "200")
        if page is None
        else rep.encode_kept_page(kept, "200", *page)
    )
    pieces = list(rep.kept_list_pieces(kept, "200", page, piece_bytes=2048))
    assert len(pieces) > 5
    assert b"".join(pieces) == whole
    assert list(rep.kept_list_pieces(kept, "200", page, piece_bytes=0)) == [whole]
    document = json.loads(whole)
    entries = document["rows" if kind == "table" else "items"]
    assert len(entries) == 120
    if page is not None:
        assert document["metadata"]["continue"] == "tok"


def page_read_in_pieces(rep: JsonRepresentation, body: bytes, size: int) -> Any:
    """A page fed to its reader ``size`` bytes at a time: its (object, line) pairs and page."""
    reader = rep.list_page_reader(1 << 20)
    assert reader is not None
    items = []
    for at in range(0, len(body), size):
        items += reader.feed(body[at : at + size])
    last, page = reader.finish()
    return items + last, page


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_a_page_read_in_pieces_of_any_size_is_the_page_read_whole(size: int) -> None:
    rep = JsonRepresentation()
    items = [
        {"metadata": {"name": f"p{i}", "namespace": "ns", "resourceVersion": str(10 + i)},
         "spec": {"n": i * 1234567, "ok": True, "none": None, "s": "é\\u003c" * i}}
        for i in range(12)
    ]  # fmt: skip
    body = json.dumps(
        {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "99", "continue": "c", "remainingItemCount": 12345},
            "items": items,
        },
        ensure_ascii=False,
    ).encode()
    whole = rep.decode_list_page_lines(body)
    expected = list(whole.items)
    got, page = page_read_in_pieces(JsonRepresentation(), body, size)
    assert got == expected
    assert (page.rv, page.token, page.remaining) == ("99", "c", 12345)
    # Items before the list's kind (not the apiserver's order) are typed at the end.
    late = json.dumps({"items": items, "kind": "PodList", "apiVersion": "v1",
                       "metadata": {"resourceVersion": "99"}}).encode()  # fmt: skip
    late_whole = list(JsonRepresentation().decode_list_page_lines(late).items)
    assert page_read_in_pieces(JsonRepresentation(), late, size)[0] == late_whole
    assert [obj for obj, _ in late_whole] == [obj for obj, _ in expected]


@pytest.mark.parametrize(
    "bad", ['{"items":[1]}', '{"items":[{}', '{"a":1 "b":2}', "[]", '{"items":[]} x', "{"]
)
def test_a_broken_page_read_in_pieces_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        page_read_in_pieces(JsonRepresentation(), bad.encode(), 2)


def test_a_page_item_over_the_limit_raises_value_error_before_it_is_all_read() -> None:
    reader = JsonRepresentation().list_page_reader(1000)
    assert reader is not None
    reader.feed(b'{"kind":"PodList","apiVersion":"v1","items":[{"x":"')
    with pytest.raises(ValueError, match="over 1000"):
        for _ in range(10):
            reader.feed(b"y" * 500)


def test_whitespace_between_the_members_of_a_page_read_in_pieces_is_not_kept() -> None:
    reader = JsonRepresentation().list_page_reader(1000)
    assert reader is not None
    reader.feed(b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"3"},')
    reader.feed(b'"items":[]')
    for _ in range(100):
        reader.feed(b" " * 500)  # 50 KB of it, against a limit of 1,000 bytes pending
    reader.feed(b"}")
    items, page = reader.finish()
    assert (items, page.rv) == ([], "3")
