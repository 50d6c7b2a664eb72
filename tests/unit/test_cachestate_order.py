"""A shared watch's state answers LISTs and initial syncs in the apiserver's order: by key.

etcd and the apiserver's watch cache list objects sorted by key, and ``kubectl get`` prints the
LIST as it comes. The order is kept in place as objects come and go; these tests drive the real
CacheState through random changes and compare with a sort done from scratch.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from watchproxy.hub.cachestate import CacheState, Entry
from watchproxy.kube.representation import JsonRepresentation

# Characters either side of "/" in byte order ("-" and "." sort before it, "0" right after):
# the places where sorting "namespace/name" keys goes wrong first.
NAMESPACES = ["a", "a-b", "a.b", "a0", "b", "ab"]
NAMES = ["x", "x-1", "x.1", "x0", "y", "0"]


def configmap(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"}}


def put(state: CacheState, rep: JsonRepresentation, namespace: str, name: str) -> None:
    obj = configmap(namespace, name)
    line = rep.encode_event("ADDED", obj)
    state.put(f"{namespace}/{name}", Entry(rep.keep("ADDED", obj, line), 1, len(line)))


def names_in(body: bytes) -> list[str]:
    return [
        f"{item['metadata']['namespace']}/{item['metadata']['name']}"
        for item in json.loads(body)["items"]
    ]


operations = st.lists(
    st.tuples(st.booleans(), st.sampled_from(NAMESPACES), st.sampled_from(NAMES), st.booleans()),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_lists_and_initial_syncs_are_in_key_order_through_any_changes(
    ops: list[tuple[bool, str, str, bool]],
) -> None:
    rep = JsonRepresentation()
    state = CacheState(rep)
    for add, namespace, name, look in ops:
        if add:
            put(state, rep, namespace, name)
        else:
            state.pop(f"{namespace}/{name}")
        if look:  # the order is built here, then kept in place by the next changes
            assert list(state.ordered_keys()) == sorted(state)
    want = sorted(state)
    assert names_in(state.list_body("9")) == want
    assert [json.loads(line)["object"]["metadata"]["name"] for line in state.added_lines()] == [
        key.split("/", 1)[1] for key in want
    ]
    for namespace in NAMESPACES:
        mine = [key for key in want if key.startswith(namespace + "/")]
        assert names_in(state.list_body("9", namespace)) == mine
        assert state.count_in(namespace) == len(mine)


def test_objects_created_after_the_first_list_take_their_place_by_key() -> None:
    rep = JsonRepresentation()
    state = CacheState(rep)
    put(state, rep, "ns", "m")
    assert names_in(state.list_body("1")) == ["ns/m"]
    for name in ("z", "a", "q"):
        put(state, rep, "ns", name)
    assert names_in(state.list_body("4")) == ["ns/a", "ns/m", "ns/q", "ns/z"]
