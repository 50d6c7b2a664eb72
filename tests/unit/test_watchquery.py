"""List/watch query decoding and the apiserver's ListOptions rules."""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import MultiDict, MultiDictProxy

from watchproxy.errors import BadRequest
from watchproxy.kube.fieldselectors import parse_field_selector
from watchproxy.kube.selectors import parse_label_selector
from watchproxy.kube.watchquery import (
    KNOWN_PARAMETERS,
    InvalidListOptions,
    WatchQuery,
    parse_watch_query,
)

WATCH_LIST = {
    "watch": "true",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
}

VALID: list[tuple[dict[str, str], dict[str, Any]]] = [
    ({}, {"watch": False, "resource_version": None, "unknown": ()}),
    ({"watch": "true"}, {"watch": True}),
    ({"watch": "1"}, {"watch": True}),
    ({"watch": "false"}, {"watch": False}),
    ({"watch": "FALSE"}, {"watch": False}),
    ({"watch": "0"}, {"watch": False}),
    ({"watch": ""}, {"watch": True}),  # apimachinery: any value but 0/false is true
    ({"watch": "yes"}, {"watch": True}),
    ({"allowWatchBookmarks": "true"}, {"allow_watch_bookmarks": True}),
    ({"allowWatchBookmarks": "0"}, {"allow_watch_bookmarks": False}),
    ({"allowWatchBookmarks": ""}, {"allow_watch_bookmarks": True}),
    ({"resourceVersion": ""}, {"resource_version": "", "resource_version_number": None}),
    ({"resourceVersion": "0"}, {"resource_version": "0", "resource_version_number": 0}),
    ({"resourceVersion": "12345"}, {"resource_version": "12345"}),
    ({"resourceVersion": str(2**64 - 1)}, {"resource_version_number": 2**64 - 1}),
    ({"resourceVersion": "007"}, {"resource_version": "007", "resource_version_number": 7}),
    ({"timeoutSeconds": "0"}, {"timeout_seconds": 0}),
    ({"timeoutSeconds": "300"}, {"timeout_seconds": 300}),
    ({"timeoutSeconds": "+5"}, {"timeout_seconds": 5}),
    # Valid for the apiserver: a list ignores it, a watch ends at once (kube-apiserver v1.34).
    ({"timeoutSeconds": "-1"}, {"timeout_seconds": -1}),
    ({"watch": "1", "resourceVersion": "7", "continue": "x"}, {"continue_token": "x"}),
    ({"limit": "500", "continue": "abc"}, {"limit": 500, "continue_token": "abc"}),
    ({"labelSelector": "c!=d, a==b"}, {"label_selector_canonical": "a=b,c!=d"}),
    ({"fieldSelector": "metadata.name==x"}, {"field_selector_canonical": "metadata.name=x"}),
    ({"includeObject": "Metadata"}, {"include_object": "Metadata"}),
    ({"includeObject": "None"}, {"include_object": "None"}),
    ({"includeObject": "Object"}, {"include_object": "Object"}),
    ({"includeObject": ""}, {"include_object": None, "unknown": ()}),
    ({"includeObject": "Bogus"}, {"include_object": None, "unknown": ("includeObject",)}),
    ({"pretty": "true"}, {"pretty": True}),
    ({"pretty": "1"}, {"pretty": True}),
    ({"pretty": "false"}, {"pretty": False}),
    ({"pretty": "nope"}, {"pretty": False}),
    ({"pretty": ""}, {"pretty": None}),
    ({"timeout": "32s"}, {"timeout": "32s", "unknown": ()}),
    ({"foo": "1", "watch": "1", "dryRun": "All"}, {"unknown": ("foo", "dryRun")}),
    (WATCH_LIST, {"send_initial_events": True, "resource_version_match": "NotOlderThan"}),
    ({**WATCH_LIST, "sendInitialEvents": "false"}, {"send_initial_events": False}),
    ({**WATCH_LIST, "resourceVersion": "100"}, {"resource_version": "100"}),
    ({"resourceVersion": "5", "resourceVersionMatch": "Exact"}, {"watch": False}),
    ({"resourceVersion": "0", "resourceVersionMatch": "NotOlderThan"}, {"watch": False}),
    ({"resourceVersionMatch": ""}, {"resource_version_match": ""}),
    # The apiserver accepts sendInitialEvents without bookmarks (backward compatibility).
    ({**WATCH_LIST, "allowWatchBookmarks": "false"}, {"allow_watch_bookmarks": False}),
]


@pytest.mark.parametrize(("query", "expected"), VALID)
def test_valid_queries_decode_like_the_apiserver(
    query: dict[str, str], expected: dict[str, Any]
) -> None:
    parsed = parse_watch_query(query)
    for field, value in expected.items():
        assert getattr(parsed, field) == value, field


BAD_VALUES = [
    {"resourceVersion": "abc"},
    {"resourceVersion": "-1"},
    {"resourceVersion": "+1"},
    {"resourceVersion": "1.5"},
    {"resourceVersion": " 1"},
    {"resourceVersion": str(2**64)},
    {"resourceVersion": "١٢"},
    {"timeoutSeconds": "abc"},
    {"timeoutSeconds": "1.5"},
    {"timeoutSeconds": ""},
    {"timeoutSeconds": str(2**63)},
    {"limit": "ten"},
    {"labelSelector": "a=b c"},
    {"fieldSelector": "a"},
]


@pytest.mark.parametrize("query", BAD_VALUES)
def test_undecodable_values_are_400(query: dict[str, str]) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_watch_query(query)
    assert caught.value.code == 400
    assert not isinstance(caught.value, InvalidListOptions)
    [name] = query
    assert name in caught.value.message  # the client is told which parameter it was


FORBIDDEN: list[tuple[dict[str, str], str]] = [
    ({"resourceVersionMatch": "NotOlderThan"}, "forbidden unless resourceVersion is provided"),
    ({"resourceVersionMatch": "Exact", "resourceVersion": ""}, "unless resourceVersion"),
    (
        {"resourceVersionMatch": "Exact", "resourceVersion": "0"},
        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
    ),
    (
        {"resourceVersionMatch": "Newest", "resourceVersion": "1"},
        'Unsupported value: "Newest": supported values: "Exact", "NotOlderThan", ""',
    ),
    (
        {"resourceVersionMatch": "Exact", "resourceVersion": "1", "continue": "x"},
        "forbidden when continue is provided",
    ),
    ({"sendInitialEvents": "true"}, "sendInitialEvents is forbidden for list"),
    # The WatchList defaults make a watch from "now" one with initial events and NotOlderThan.
    ({"watch": "1", "continue": "x"}, "forbidden when continue is provided"),
    ({"watch": "1", "resourceVersion": "0", "continue": "x"}, "forbidden when continue"),
    (
        {"watch": "1", "sendInitialEvents": "true"},
        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
    ),
    (
        {"watch": "1", "sendInitialEvents": "false", "resourceVersionMatch": "Exact"},
        'Unsupported value: "Exact": supported values: "NotOlderThan"',
    ),
    (
        {"watch": "1", "resourceVersionMatch": "NotOlderThan"},
        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
    ),
    ({**WATCH_LIST, "continue": "abc"}, "forbidden when continue is provided"),
]


@pytest.mark.parametrize(("query", "fragment"), FORBIDDEN)
def test_forbidden_combinations_are_the_apiservers_422(
    query: dict[str, str], fragment: str
) -> None:
    with pytest.raises(InvalidListOptions) as caught:
        parse_watch_query(query)
    assert isinstance(caught.value, BadRequest)
    assert fragment in caught.value.message
    status = caught.value.status()
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert status["details"]["kind"] == "ListOptions"
    assert status["details"]["causes"]
    assert caught.value.message.startswith('ListOptions.meta.k8s.io "" is invalid: ')


def test_several_violations_are_all_reported() -> None:
    with pytest.raises(InvalidListOptions) as caught:
        parse_watch_query({"watch": "1", "sendInitialEvents": "1", "resourceVersionMatch": "X"})
    assert len(caught.value.causes) == 2
    assert caught.value.message.count("resourceVersionMatch:") == 2


def test_bookmarks_can_be_required_for_initial_events() -> None:
    query = {**WATCH_LIST, "allowWatchBookmarks": "false"}
    with pytest.raises(InvalidListOptions, match="allowWatchBookmarks to true"):
        parse_watch_query(query, require_bookmarks_for_initial_events=True)
    assert parse_watch_query(WATCH_LIST, require_bookmarks_for_initial_events=True)


def test_repeated_parameters_take_the_first_value() -> None:
    query = MultiDict(
        [
            ("watch", "false"),
            ("watch", "true"),
            ("resourceVersion", "10"),
            ("resourceVersion", "bogus"),
            ("labelSelector", "a=b"),
            ("labelSelector", "((("),
            ("x", "1"),
            ("x", "2"),
        ]
    )
    parsed = parse_watch_query(MultiDictProxy(query))
    assert parsed.watch is False
    assert parsed.resource_version == "10"
    assert parsed.label_selector_canonical == "a=b"
    assert parsed.unknown == ("x",)


def test_every_known_parameter_is_understood() -> None:
    query = {name: "" for name in KNOWN_PARAMETERS} | {
        "timeoutSeconds": "1",
        "limit": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "watch": "true",
    }
    assert parse_watch_query(query).unknown == ()


def test_watch_query_is_hashable_for_keying() -> None:
    first = parse_watch_query({"watch": "1", "labelSelector": "b,a"})
    second = parse_watch_query({"watch": "true", "labelSelector": "a, b"})
    assert first == second
    assert hash(first) == hash(second)
    assert WatchQuery() == parse_watch_query({})


# --- properties ------------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_any_decimal_resource_version_is_kept_verbatim(number: int) -> None:
    parsed = parse_watch_query({"watch": "1", "resourceVersion": str(number)})
    assert parsed.resource_version == str(number)
    assert parsed.resource_version_number == number


@given(st.text(max_size=12))
def test_resource_version_is_decimal_or_refused(text: str) -> None:
    try:
        parsed = parse_watch_query({"resourceVersion": text})
    except BadRequest:
        assert text != "" and not (text.isascii() and text.isdigit() and int(text) < 2**64)
        return
    assert parsed.resource_version == text


@given(st.text(max_size=8))
def test_booleans_are_false_only_for_zero_and_false(text: str) -> None:
    parsed = parse_watch_query({"watch": text, "allowWatchBookmarks": text})
    expected = not (text == "0" or text.lower() == "false")
    assert parsed.watch is expected
    assert parsed.allow_watch_bookmarks is expected


@given(
    st.dictionaries(
        st.sampled_from([*sorted(KNOWN_PARAMETERS), "other", "dryRun"]),
        st.sampled_from(["", "0", "1", "true", "false", "NotOlderThan", "Exact", "a=b", "-1"]),
    )
)
def test_any_query_either_decodes_or_is_a_bad_request(query: dict[str, str]) -> None:
    try:
        parsed = parse_watch_query(query)
    except BadRequest:
        return
    assert set(parsed.unknown) <= set(query)
    assert parsed.resource_version_match in ("", "NotOlderThan", "Exact")
    assert parsed.timeout_seconds is None or -(2**63) <= parsed.timeout_seconds < 2**63


@pytest.mark.parametrize(
    ("query", "watch_list"),
    [
        ("watch=1", False),
        ("watch=1&resourceVersion=0", False),
        ("watch=1&allowWatchBookmarks=true", True),
        ("watch=1&resourceVersion=0&allowWatchBookmarks=true", True),
        ("watch=1&resourceVersion=&allowWatchBookmarks=true", True),
        ("watch=1&resourceVersion=5&allowWatchBookmarks=true", False),
        (
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
            "&allowWatchBookmarks=true",
            True,
        ),
        (
            "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
            "&allowWatchBookmarks=true",
            False,
        ),
        ("allowWatchBookmarks=true", False),
    ],
)
def test_a_watch_from_now_with_bookmarks_is_a_watch_list(query: str, watch_list: bool) -> None:
    """As kube-apiserver 1.34 and 1.37 answer (tests/realapi/test_watch_from_now.py)."""
    parsed = parse_watch_query(MultiDict(urllib.parse.parse_qsl(query, keep_blank_values=True)))
    assert parsed.watch_list is watch_list


def test_another_pages_query_differs_in_its_token_alone() -> None:
    """with_continue_token spells every field out: with each one set to a value other than its
    default, a field it forgot (or swapped) shows here against dataclasses.replace."""
    defaults = WatchQuery()
    full = WatchQuery(
        watch=True,
        resource_version="7",
        resource_version_match="NotOlderThan",
        timeout_seconds=30,
        allow_watch_bookmarks=True,
        send_initial_events=True,
        label_selector=parse_label_selector("app=web"),
        field_selector=parse_field_selector("metadata.name=p"),
        limit=2,
        continue_token="first",
        include_object="Metadata",
        pretty=True,
        timeout="5s",
        unknown=("x",),
    )
    for item in dataclasses.fields(WatchQuery):
        assert getattr(full, item.name) != getattr(defaults, item.name), item.name
    assert full.with_continue_token("next") == dataclasses.replace(full, continue_token="next")
