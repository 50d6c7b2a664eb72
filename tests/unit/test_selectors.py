"""Label and field selectors: apiserver syntax, validation, matching and canonical keys."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchproxy.errors import BadRequest
from watchproxy.kube.fieldselectors import (
    FieldRequirement,
    escape_field_value,
    parse_field_selector,
)
from watchproxy.kube.selectors import LabelRequirement, parse_label_selector

# --- label selectors: accepted, and their canonical form ---------------------------------------

VALID_LABEL = [
    ("", ""),
    ("   ", ""),
    ("a=b", "a=b"),
    ("a==b", "a=b"),
    ("a = b", "a=b"),
    ("a!=b", "a!=b"),
    ("a", "a"),
    ("!a", "!a"),
    ("! a", "!a"),
    ("a=", "a="),
    ("a=,b", "a=,b"),
    ("a in (x,y)", "a in (x,y)"),
    ("a in (y, x, y)", "a in (x,y)"),
    ("a in (x)", "a=x"),
    ("a notin (x)", "a!=x"),
    ("a notin (x,y)", "a notin (x,y)"),
    ("a in ()", "a="),
    ("a in (,x)", "a in (,x)"),
    ("a in (x,)", "a in (,x)"),
    ("a in (x,,y)", "a in (,x,y)"),
    ("a>5", "a>5"),
    ("a < 10", "a<10"),
    ("a=b,c!=d", "a=b,c!=d"),
    ("c!=d, a==b", "a=b,c!=d"),
    ("a=b,a=b", "a=b"),
    ("b,a", "a,b"),
    ("!b,a=x,a", "a,a=x,!b"),
    ("example.com/key=v", "example.com/key=v"),
    ("app.kubernetes.io/name in (web, api)", "app.kubernetes.io/name in (api,web)"),
    ("in=notin", "in=notin"),
    ("a in (in,notin)", "a in (in,notin)"),
    ("A_b.c-D=Value_1.x-Y", "A_b.c-D=Value_1.x-Y"),
    ("\ta\t=\tb\n", "a=b"),
    ("k" * 63 + "=" + "v" * 63, "k" * 63 + "=" + "v" * 63),
    ("environment in (production, qa),tier notin (frontend)", None),
]


@pytest.mark.parametrize(("selector", "canonical"), VALID_LABEL)
def test_valid_label_selectors_parse_to_their_canonical_form(
    selector: str, canonical: str | None
) -> None:
    parsed = parse_label_selector(selector)
    if canonical is not None:
        assert parsed.canonical() == canonical
    assert parse_label_selector(parsed.canonical()) == parsed


INVALID_LABEL = [
    "=b",
    "a b",
    "a=b c",
    "a=b=c",
    "a,",
    ",a",
    "a,,b",
    "!",
    "!a=b",
    "!!a",
    "a in x",
    "a in (x",
    "a in (x y)",
    "a in (x,y",
    "a in x,y)",
    "a notin",
    "a in",
    "a (x)",
    "a=(x)",
    "a>b",
    "a>",
    "a<-1",
    "a>99999999999999999999",
    "a=b!",
    "a=-b",
    "a=b-",
    "a=" + "v" * 64,
    "k" * 64 + "=v",
    "-a=b",
    "a/b/c=d",
    "/a=b",
    "Example.com/a=b",
    "example.com/=b",
    "a..b/c=d",
    "a=b\x00",
    "ключ=b",
]


@pytest.mark.parametrize("selector", INVALID_LABEL)
def test_invalid_label_selectors_are_bad_requests(selector: str) -> None:
    with pytest.raises(BadRequest):
        parse_label_selector(selector)


def test_double_equals_with_no_value_is_the_empty_value() -> None:
    # As in apimachinery: "a==" is key a, operator ==, value "".
    assert parse_label_selector("a==").canonical() == "a="


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        ("a,", "expected: identifier after ','"),
        ("=b", "found '=', expected: !, identifier, or 'end of string'"),
        ("a in x", "unable to parse requirement: found 'x' expected: '('"),
        ("a=b!", "found '!', expected: ',' or 'end of string'"),
        ("a in (,,)", "found ')', expected: ',', or identifier"),
        ("a>b", "must be an integer"),
        ("-a=b", "unable to parse requirement: key: Invalid value: '-a'"),
    ],
)
def test_label_errors_read_like_the_apiservers(selector: str, fragment: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_label_selector(selector)
    assert fragment in caught.value.message


# --- label selectors: matching -----------------------------------------------------------------

MATCHES = [
    ("", {}, True),
    ("", {"a": "b"}, True),
    ("a=b", {"a": "b"}, True),
    ("a=b", {"a": "c"}, False),
    ("a=b", {}, False),
    ("a!=b", {}, True),
    ("a!=b", {"a": "b"}, False),
    ("a!=b", {"a": "c"}, True),
    ("a", {"a": ""}, True),
    ("a", {"b": "x"}, False),
    ("!a", {}, True),
    ("!a", {"a": "x"}, False),
    ("a=", {"a": ""}, True),
    ("a=", {}, False),
    ("a in (x,y)", {"a": "y"}, True),
    ("a in (x,y)", {"a": "z"}, False),
    ("a in (x,y)", {}, False),
    ("a notin (x,y)", {}, True),
    ("a notin (x,y)", {"a": "x"}, False),
    ("a notin (x,y)", {"a": "z"}, True),
    ("a>5", {"a": "6"}, True),
    ("a>5", {"a": "5"}, False),
    ("a>5", {"a": "x"}, False),
    ("a>5", {}, False),
    ("a<5", {"a": "-7"}, True),
    ("a<5", {"a": "07"}, False),
    ("a=b,c!=d", {"a": "b"}, True),
    ("a=b,c!=d", {"a": "b", "c": "d"}, False),
    ("a,!b", {"a": "1"}, True),
    ("a,!b", {"a": "1", "b": "2"}, False),
]


@pytest.mark.parametrize(("selector", "labels", "expected"), MATCHES)
def test_label_selector_matching(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is expected


def test_requirements_are_exposed_sorted_and_folded() -> None:
    parsed = parse_label_selector("z in (b,a), a==x, m")
    assert parsed.requirements == (
        LabelRequirement("a", "=", ("x",)),
        LabelRequirement("m", "exists"),
        LabelRequirement("z", "in", ("a", "b")),
    )
    assert not parsed.matches_everything
    assert parse_label_selector("").matches_everything


# --- field selectors ---------------------------------------------------------------------------

VALID_FIELD = [
    ("", ""),
    (",", ""),
    ("metadata.name=foo", "metadata.name=foo"),
    ("metadata.name==foo", "metadata.name=foo"),
    ("metadata.name!=foo", "metadata.name!=foo"),
    ("b=1,a=2", "a=2,b=1"),
    ("a=1,,b=2,", "a=1,b=2"),
    ("a=1,a=1", "a=1"),
    ("a=", "a="),
    ("a=x!y", "a=x!y"),
    ("a=!y", "a=!y"),
    (r"a=x\,y", r"a=x\,y"),
    (r"a=x\=y", r"a=x\=y"),
    (r"a=x\\y", r"a=x\\y"),
    ("spec.nodeName=node-1,status.phase!=Running", "spec.nodeName=node-1,status.phase!=Running"),
    ("a b=c d", "a b=c d"),
    ("=x", "=x"),
]


@pytest.mark.parametrize(("selector", "canonical"), VALID_FIELD)
def test_valid_field_selectors_parse_to_their_canonical_form(selector: str, canonical: str) -> None:
    parsed = parse_field_selector(selector)
    assert parsed.canonical() == canonical
    assert parse_field_selector(parsed.canonical()) == parsed


def test_field_escapes_are_unescaped_in_values() -> None:
    parsed = parse_field_selector(r"a=x\,y\=z\\w")
    assert parsed.requirements == (FieldRequirement("a", "=", "x,y=z\\w"),)
    assert parsed.matches({"a": "x,y=z\\w"})


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ("a", "can't understand 'a'"),
        ("a=b,c", "can't understand 'c'"),
        ("a=b=c", "unescaped character in value: ="),
        (r"a=b\!", r"invalid escape sequence: \!"),
        (r"a=b\x", r"invalid escape sequence: \x"),
        ("a=b\\", "invalid escape sequence: \\"),
        ("a!b", "can't understand"),
        ("a=b==c", "unescaped character"),
    ],
)
def test_invalid_field_selectors_are_bad_requests(selector: str, fragment: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_field_selector(selector)
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("selector", "fields", "expected"),
    [
        ("", {}, True),
        ("metadata.name=foo", {"metadata.name": "foo"}, True),
        ("metadata.name=foo", {"metadata.name": "bar"}, False),
        ("metadata.name!=foo", {"metadata.name": "bar"}, True),
        ("metadata.name!=foo", {}, True),
        ("a=", {}, True),  # a missing field reads as ""
        ("a!=", {}, False),
        ("a=1,b=2", {"a": "1", "b": "2"}, True),
        ("a=1,b=2", {"a": "1", "b": "3"}, False),
    ],
)
def test_field_selector_matching(selector: str, fields: dict[str, str], expected: bool) -> None:
    assert parse_field_selector(selector).matches(fields) is expected


# --- properties ----------------------------------------------------------------------------

KEYS = ["a", "b", "x.io/c"]
VALUES = ["", "1", "7", "v", "w"]
spaces = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def label_requirements(draw: st.DrawFn) -> str:
    key = draw(st.sampled_from(KEYS))
    kind = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!", ">", "<"]))
    s1, s2 = draw(spaces), draw(spaces)
    if kind == "exists":
        return f"{s1}{key}{s2}"
    if kind == "!":
        return f"{s1}!{s2}{key}"
    if kind in ("in", "notin"):
        # apimachinery refuses two empty entries in a row before ")", e.g. "(,,)".
        values = draw(st.lists(st.sampled_from(VALUES[1:]), min_size=1, max_size=4))
        inner = ",".join(f"{draw(spaces)}{value}{draw(spaces)}" for value in values)
        if draw(st.booleans()):
            inner = "," + inner  # a leading empty value
        return f"{s1}{key} {kind}{s2}({inner})"
    if kind in (">", "<"):
        return f"{s1}{key}{s2}{kind}{draw(spaces)}{draw(st.sampled_from(['0', '1', '7']))}"
    return f"{s1}{key}{s2}{kind}{draw(spaces)}{draw(st.sampled_from(VALUES))}"


label_selectors = st.lists(label_requirements(), max_size=5).map(",".join)
label_sets = st.dictionaries(st.sampled_from(KEYS), st.sampled_from([*VALUES, "-3", "x"]))
ALL_LABEL_SETS = [
    {key: value for key, value in zip(KEYS, combo, strict=True) if value is not None}
    for combo in itertools.product([None, "", "1", "7", "v"], repeat=len(KEYS))
]


@given(label_selectors)
def test_label_canonical_is_idempotent(selector: str) -> None:
    canonical = parse_label_selector(selector).canonical()
    assert parse_label_selector(canonical).canonical() == canonical


@given(label_selectors)
def test_label_canonical_selects_exactly_the_same_label_sets(selector: str) -> None:
    original = parse_label_selector(selector)
    reparsed = parse_label_selector(original.canonical())
    for labels in ALL_LABEL_SETS:
        assert original.matches(labels) == reparsed.matches(labels)


@given(st.lists(label_requirements(), min_size=1, max_size=5), st.randoms())
def test_label_canonical_ignores_requirement_order(parts: list[str], rng: random.Random) -> None:
    shuffled = list(parts)
    rng.shuffle(shuffled)
    assert (
        parse_label_selector(",".join(parts)).canonical()
        == parse_label_selector(",".join(shuffled)).canonical()
    )


@given(label_selectors, label_sets)
def test_label_matching_is_the_and_of_requirements(selector: str, labels: dict[str, str]) -> None:
    parsed = parse_label_selector(selector)
    assert parsed.matches(labels) == all(r.matches(labels) for r in parsed.requirements)


@given(st.text(max_size=30))
def test_arbitrary_label_text_is_refused_or_canonicalizes_stably(text: str) -> None:
    try:
        parsed = parse_label_selector(text)
    except BadRequest:
        return
    assert parse_label_selector(parsed.canonical()) == parsed


field_values = st.text(alphabet="ab,=\\! ", max_size=6)
field_terms = st.tuples(
    st.sampled_from(["metadata.name", "spec.nodeName", "a"]),
    st.sampled_from(["=", "==", "!="]),
    field_values,
).map(lambda t: f"{t[0]}{t[1]}{escape_field_value(t[2])}")


@given(st.lists(field_terms, max_size=5).map(",".join))
def test_field_canonical_is_idempotent_and_equivalent(selector: str) -> None:
    original = parse_field_selector(selector)
    canonical = original.canonical()
    reparsed = parse_field_selector(canonical)
    assert reparsed == original
    assert reparsed.canonical() == canonical


@given(field_values)
def test_escaped_field_values_round_trip(value: str) -> None:
    parsed = parse_field_selector("a=" + escape_field_value(value))
    assert parsed.requirements == (FieldRequirement("a", "=", value),)


@given(st.text(max_size=30))
def test_arbitrary_field_text_is_refused_or_canonicalizes_stably(text: str) -> None:
    try:
        parsed = parse_field_selector(text)
    except BadRequest:
        return
    assert parse_field_selector(parsed.canonical()) == parsed
