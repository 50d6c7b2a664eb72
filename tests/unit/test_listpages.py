"""Pages of a hub LIST: the apiserver's continue tokens, the page arithmetic over a snapshot,
the list metadata a page adds, and the bounds on the snapshots kept for continuations."""

from __future__ import annotations

import base64
import json

from watchproxy.kube import protowire as pw
from watchproxy.kube.jsonlist import with_page_meta
from watchproxy.kube.protobuf import ProtobufRepresentation, envelope
from watchproxy.kube.representation import JsonRepresentation, PartialMetadataRepresentation
from watchproxy.kube.tables import TableRepresentation
from watchproxy.lists.pages import (
    Snapshot,
    Snapshots,
    decode_continue,
    encode_continue,
    page_of,
)


def snapshot(keys: list[str], rv: int = 42) -> Snapshot:
    return Snapshot(rv, str(rv), keys, [f"<{key}>" for key in keys])


def test_tokens_are_the_apiservers_unpadded_base64url_json() -> None:
    token = encode_continue(123, "ns/name\x00")
    assert "=" not in token
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    # Go's encoding/json of the apiserver's continueToken struct, field for field.
    assert raw == b'{"v":"meta.k8s.io/v1","rv":123,"start":"ns/name\\u0000"}'
    assert decode_continue(token) == (123, "ns/name\x00")


def test_tokens_the_hub_cannot_judge_are_left_to_the_apiserver() -> None:
    def token_of(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()

    for bad in (
        "not base64!",
        token_of(["a list"]),
        token_of({"v": "meta.k8s.io/v2", "rv": 1, "start": "a"}),
        token_of({"v": "meta.k8s.io/v1", "rv": 0, "start": "a"}),
        token_of({"v": "meta.k8s.io/v1", "rv": True, "start": "a"}),
        token_of({"v": "meta.k8s.io/v1", "rv": "7", "start": "a"}),
        token_of({"v": "meta.k8s.io/v1", "rv": 7}),
    ):
        assert decode_continue(bad) is None, bad


def test_pages_walk_the_snapshot_once_each_in_key_order() -> None:
    keys = [f"ns/{name}" for name in ("a", "b", "c", "d", "e")]
    snap = snapshot(keys)
    seen: list[str] = []
    start: str | None = None
    pages = 0
    while True:
        page = page_of(snap, start, 2, "ns/")
        seen += page.kept
        pages += 1
        if page.token is None:
            assert page.remaining is None
            break
        rv, start = decode_continue(page.token) or (0, "")
        assert rv == 42 and start.endswith("\x00") and not start.startswith("ns/")
        assert page.remaining == len(keys) - len(seen)
    assert seen == [f"<{key}>" for key in keys] and pages == 3


def test_cluster_wide_tokens_carry_the_namespace_and_a_limit_of_zero_is_the_rest() -> None:
    snap = snapshot(["a/x", "b/y", "c/z"])
    page = page_of(snap, None, 1, "")
    assert page.token is not None
    assert decode_continue(page.token) == (42, "a/x\x00")
    rest = page_of(snap, "a/x\x00", 0, "")
    assert list(rest.kept) == ["<b/y>", "<c/z>"] and rest.token is None


def test_page_metadata_goes_into_the_lists_own_metadata_in_the_apiservers_order() -> None:
    body = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42"},"items":[]}'
    paged = with_page_meta(body, "42", "TOKEN", 3)
    assert json.loads(paged)["metadata"] == {
        "resourceVersion": "42",
        "continue": "TOKEN",
        "remainingItemCount": 3,
    }
    assert paged.index(b'"continue"') < paged.index(b'"remainingItemCount"')


def test_snapshots_are_bounded_by_age_and_by_references() -> None:
    now = [0.0]
    kept = Snapshots(lambda: now[0], max_age=10.0, max_items=5)
    owner = object()
    kept.put(owner, None, snapshot(["a", "b"], rv=1))
    kept.put(owner, None, snapshot(["a", "b", "c"], rv=2))
    assert kept.get(owner, None, 1) is not None and kept.get(owner, "ns", 1) is None
    kept.put(owner, None, snapshot(["a"], rv=3))  # 6 references: the oldest goes
    assert kept.get(owner, None, 1) is None and kept.get(owner, None, 2) is not None
    now[0] = 10.5
    assert kept.get(owner, None, 2) is None and len(kept) == 0


def test_every_representation_encodes_a_page_with_the_apiservers_list_metadata() -> None:
    """JSON, PartialObjectMetadata and Table splice it into their encoded list; protobuf writes
    it into the envelope's ListMeta (continue, then remainingItemCount as a varint)."""
    for rep in (
        JsonRepresentation(),
        PartialMetadataRepresentation("v1"),
        TableRepresentation("v1", "Metadata"),
    ):
        meta = json.loads(rep.encode_kept_page([], "7", "TOKEN", 1))["metadata"]
        assert meta == {"resourceVersion": "7", "continue": "TOKEN", "remainingItemCount": 1}, rep
    protobuf = ProtobufRepresentation()
    # It learns the list's kind from the apiserver's first LIST, as the hub's does.
    protobuf.decode_list_page(envelope("v1", "ConfigMapList", pw.length_field(1, b"\x12\x015")))
    page = protobuf.encode_kept_page([], "7", "TOKEN", 300)
    items, rv, token = protobuf.decode_list_page(page)
    assert (items, rv, token) == ([], "7", "TOKEN")
    assert b"\x1a\x05TOKEN\x20\xac\x02" in page  # continue, then field 4: varint 300
