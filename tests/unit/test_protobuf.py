"""The protobuf wire codec and the protobuf representation, on messages built field by field.

The layouts are the apiserver's (checked against a real kube-apiserver in
``tests/realapi/test_protobuf.py``): ``k8s\\0`` + ``runtime.Unknown``, length-prefixed
``WatchEvent`` frames, ``ObjectMeta`` as field 1 of every object.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchproxy.hub.watchcache import WatchCache
from watchproxy.kube import protowire as pw
from watchproxy.kube.negotiation import representation_for
from watchproxy.kube.protobuf import MAGIC, ProtobufRepresentation, envelope, frame
from watchproxy.kube.representation import INITIAL_EVENTS_END_ANNOTATION

L = pw.length_field


def configmap(name: str, rv: str, *, namespace: str = "ns", data: str = "v") -> bytes:
    """A ConfigMap's own message: ObjectMeta (name, generateName, namespace, uid, rv, labels)
    and one data entry, laid out as the apiserver marshals it."""
    meta = (
        L(1, name.encode())
        + L(2, b"")
        + L(3, namespace.encode())
        + L(5, b"uid-" + name.encode())
        + L(6, rv.encode())
        + pw.varint_field(7, 0)
        + L(11, L(1, b"app") + L(2, b"web"))
    )
    return L(1, meta) + L(2, L(1, b"k") + L(2, data.encode()))


def configmap_list(rv: str, items: list[bytes], token: str = "") -> bytes:
    meta = L(1, b"") + L(2, rv.encode()) + L(3, token.encode())
    body = L(1, meta) + b"".join(L(2, item) for item in items)
    return envelope("v1", "ConfigMapList", body)


def test_varints_round_trip_and_match_the_spec_example() -> None:
    assert pw.encode_varint(300) == b"\xac\x02"  # the protobuf documentation's example
    for value in (0, 1, 127, 128, 2**32, 2**63):
        assert pw.read_varint(pw.encode_varint(value), 0) == (value, len(pw.encode_varint(value)))


@pytest.mark.parametrize(
    "bad",
    [b"\x80", b"\x0a\x05ab", b"\x00", b"\x0b", b"\x09\x01", b"\xff" * 11],
)
def test_malformed_messages_raise_value_error(bad: bytes) -> None:
    with pytest.raises(ValueError):
        list(pw.fields(bad))


def test_replace_keeps_every_other_field_and_inserts_in_field_order() -> None:
    message = L(1, b"a") + pw.varint_field(4, 9) + L(7, b"z")
    assert pw.replace(message, 4 + 0, b"x") == L(1, b"a") + L(4, b"x") + L(7, b"z")
    assert pw.replace(message, 5, b"x") == message[:-3] + L(5, b"x") + L(7, b"z")
    assert pw.replace(message, 9, b"x") == message + L(9, b"x")
    assert pw.replace(message, 1, b"bb") == L(1, b"bb") + pw.varint_field(4, 9) + L(7, b"z")


def test_negotiation_shares_only_the_kinds_own_protobuf() -> None:
    rep = representation_for("application/vnd.kubernetes.protobuf, application/json", None)
    assert isinstance(rep, ProtobufRepresentation)
    as_metadata = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    assert representation_for(as_metadata, None) is None


def test_a_list_is_read_into_keyed_objects_and_written_back() -> None:
    rep = ProtobufRepresentation()
    items = [configmap("a", "5"), configmap("b", "7")]
    objects, rv, token = rep.decode_list_page(configmap_list("9", items, token="more"))
    assert (rv, token) == ("9", "more")
    assert [rep.object_key(o) for o in objects] == ["ns/a", "ns/b"]
    assert [rep.object_rv(o) for o in objects] == ["5", "7"]
    assert [o["raw"] for o in objects] == items
    assert rep.encode_list(objects, "9") == configmap_list("9", items)


def test_a_watch_frame_decodes_and_re_encodes_byte_for_byte() -> None:
    rep = ProtobufRepresentation()
    record = frame("MODIFIED", envelope("v1", "ConfigMap", configmap("a", "12")))
    assert record[:4] == (len(record) - 4).to_bytes(4, "big")
    event_type, obj = rep.decode_event(record)
    assert event_type == "MODIFIED"
    assert obj["metadata"] == {"name": "a", "namespace": "ns", "resourceVersion": "12"}
    assert rep.encode_event(event_type, rep.prepare(obj)) == record


def test_a_frame_whose_prefix_lies_is_refused() -> None:
    record = frame("ADDED", envelope("v1", "ConfigMap", configmap("a", "1")))
    with pytest.raises(ValueError):
        ProtobufRepresentation().decode_event(record[:-1])
    with pytest.raises(ValueError):
        ProtobufRepresentation().decode_event(record[:4] + b"json" + record[8:])


def test_a_relist_delete_gets_the_list_rv_and_nothing_else_changes() -> None:
    rep = ProtobufRepresentation()
    [obj], _, _ = rep.decode_list_page(configmap_list("9", [configmap("a", "5")]))
    moved = rep.with_rv(obj, "30")
    assert moved["raw"] == configmap("a", "30")
    assert rep.object_rv(moved) == "30" and obj["raw"] == configmap("a", "5")


def test_bookmarks_and_errors_are_frames_a_client_can_decode() -> None:
    rep = ProtobufRepresentation()
    rep.decode_list_page(configmap_list("9", []))
    kind, obj = rep.decode_event(rep.encode_event("BOOKMARK", rep.bookmark_object("42")))
    assert (kind, obj["kind"], obj["metadata"]["resourceVersion"]) == (
        "BOOKMARK",
        "ConfigMap",
        "42",
    )
    end = rep.bookmark_object("42", initial_events_end=True)
    meta = pw.first(end["raw"], 1) or b""
    entry = pw.first(meta, 12) or b""
    assert (pw.text(entry, 1), pw.text(entry, 2)) == (INITIAL_EVENTS_END_ANNOTATION, "true")
    status = {"status": "Failure", "message": "too old", "reason": "Expired", "code": 410}
    kind, obj = rep.decode_event(rep.error_line(status))
    assert kind == "ERROR" and obj["code"] == 410 and obj["message"] == "too old"
    upstream_body = envelope("v1", "Status", pw.varint_field(6, 410))
    assert rep.error_event_from_body(upstream_body) == frame("ERROR", upstream_body)
    assert upstream_body.startswith(MAGIC)


def test_a_watch_cache_of_protobuf_objects_relists_with_decodable_deletes() -> None:
    rep = ProtobufRepresentation()
    cache = WatchCache(rep, capacity=100, max_age=1e9, clock=lambda: 0.0)
    first, rv, _ = rep.decode_list_page(configmap_list("10", [configmap("a", "5")]))
    cache.replace(first, rv)
    _, added = rep.decode_event(frame("ADDED", envelope("v1", "ConfigMap", configmap("b", "11"))))
    event = cache.apply("ADDED", added)
    assert event is not None and rep.decode_event(event.line)[1]["metadata"]["name"] == "b"
    relist, rv, _ = rep.decode_list_page(configmap_list("20", [configmap("b", "15", data="w")]))
    group = cache.replace(relist, rv)
    decoded = [rep.decode_event(e.line) for e in group]
    assert [(t, o["metadata"]["name"], o["metadata"]["resourceVersion"]) for t, o in decoded] == [
        ("MODIFIED", "b", "15"),
        ("DELETED", "a", "20"),
    ]
    initial = cache.plan(None).initial
    assert [rep.decode_event(line)[1]["metadata"]["name"] for line in initial] == ["b"]
    assert rep.decode_event(cache.expired_line("12"))[1]["code"] == 410


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 199))
def test_any_bytes_decode_or_raise_value_error(data: bytes, cut: int) -> None:
    rep = ProtobufRepresentation()
    real = frame("ADDED", envelope("v1", "ConfigMap", configmap("a", "1")))
    for record in (data, len(data).to_bytes(4, "big") + data, real[:cut] + data):
        with contextlib.suppress(ValueError):
            rep.decode_event(record)
        with contextlib.suppress(ValueError):
            rep.decode_list_page(record)


@pytest.mark.parametrize("page", [None, ("more", 3), ("more", None)])
def test_a_list_from_the_cache_comes_in_pieces_that_join_into_the_whole_encoding(
    page: tuple[str, int | None] | None,
) -> None:
    """The envelope's length is summed from the items first, so the list can be written piece
    by piece (issue 43); joined, the pieces are the apiserver's own list, byte for byte."""
    rep = ProtobufRepresentation()
    items = [configmap(f"cm-{i:02}", str(i + 1), data="x" * (i * 300)) for i in range(40)]
    objects, _, _ = rep.decode_list_page(configmap_list("99", items))
    token, remaining = page or ("", None)
    whole = rep.encode_list(objects, "99", token, remaining)
    if page is None:
        assert whole == configmap_list("99", items)
    pieces = list(rep.kept_list_pieces(objects, "99", page, piece_bytes=4096))
    assert len(pieces) > 5 and max(len(p) for p in pieces) < 4096 + 12_000 + 64
    assert b"".join(pieces) == whole
    assert list(rep.kept_list_pieces(objects, "99", page, piece_bytes=0)) == [whole]
    back, rv, more = rep.decode_list_page(whole)
    assert (rv, more) == ("99", token) and [o["raw"] for o in back] == items
