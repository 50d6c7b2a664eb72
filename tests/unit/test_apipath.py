"""API path checking: canonical paths are classified, anything ambiguous is a 400."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from watchproxy.errors import BadRequest
from watchproxy.kube.apipath import ApiPath, canonical_target, encode_segment, parse_api_path

VALID: list[tuple[str, dict[str, Any]]] = [
    ("/", {"kind": "other"}),
    ("/version", {"kind": "other"}),
    ("/healthz", {"kind": "other"}),
    ("/openapi/v2", {"kind": "other"}),
    ("/openapi/v3/apis/apps/v1", {"kind": "other"}),
    ("/.well-known/openid-configuration", {"kind": "other"}),
    ("/api", {"kind": "discovery"}),
    ("/api/v1", {"kind": "discovery", "version": "v1"}),
    ("/apis", {"kind": "discovery"}),
    ("/apis/apps", {"kind": "discovery", "group": "apps"}),
    ("/apis/apps/v1", {"kind": "discovery", "group": "apps", "version": "v1"}),
    (
        "/apis/rbac.authorization.k8s.io/v1",
        {"kind": "discovery", "group": "rbac.authorization.k8s.io", "version": "v1"},
    ),
    ("/api/v1/pods", {"kind": "core", "version": "v1", "resource": "pods"}),
    ("/api/v1/nodes/n1", {"kind": "core", "version": "v1", "resource": "nodes", "name": "n1"}),
    (
        "/api/v1/nodes/n1/status",
        {"resource": "nodes", "name": "n1", "subresource": "status"},
    ),
    ("/api/v1/namespaces", {"kind": "core", "resource": "namespaces", "namespace": None}),
    ("/api/v1/namespaces/foo", {"resource": "namespaces", "name": "foo", "namespace": None}),
    (
        "/api/v1/namespaces/foo/status",
        {"resource": "namespaces", "name": "foo", "subresource": "status", "namespace": None},
    ),
    (
        "/api/v1/namespaces/foo/finalize",
        {"resource": "namespaces", "name": "foo", "subresource": "finalize"},
    ),
    ("/api/v1/namespaces/foo/pods", {"namespace": "foo", "resource": "pods", "name": None}),
    (
        "/api/v1/namespaces/foo/pods/bar",
        {"namespace": "foo", "resource": "pods", "name": "bar"},
    ),
    (
        "/api/v1/namespaces/foo/pods/bar/log",
        {"namespace": "foo", "resource": "pods", "name": "bar", "subresource": "log"},
    ),
    (
        "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
        {"namespace": "default", "resource": "configmaps", "name": "kube-root-ca.crt"},
    ),
    (
        "/api/v1/namespaces/foo/services/https:web:8443/proxy/",
        {"name": "https:web:8443", "subresource": "proxy", "tail": ("",)},
    ),
    (
        "/api/v1/namespaces/foo/pods/p:8080/proxy/metrics/x",
        {"name": "p:8080", "subresource": "proxy", "tail": ("metrics", "x")},
    ),
    (
        "/api/v1/namespaces/foo/pods/p:8080/proxy/metrics/",
        {"subresource": "proxy", "tail": ("metrics", ""), "trailing_slash": True},
    ),
    (
        "/apis/apps/v1/deployments",
        {"kind": "group", "group": "apps", "version": "v1", "resource": "deployments"},
    ),
    (
        "/apis/apps/v1/namespaces/ns/deployments/web/scale",
        {
            "kind": "group",
            "namespace": "ns",
            "resource": "deployments",
            "name": "web",
            "subresource": "scale",
        },
    ),
    (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:controller:job-controller",
        {"resource": "clusterroles", "name": "system:controller:job-controller"},
    ),
    (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aaggregate-to-edit",
        {"resource": "clusterroles", "name": "system:aggregate-to-edit"},
    ),
    (
        "/api/v1/watch/pods",
        {"kind": "core", "resource": "pods", "legacy_watch": True, "namespace": None},
    ),
    (
        "/api/v1/watch/namespaces/foo/pods",
        {"namespace": "foo", "resource": "pods", "legacy_watch": True},
    ),
    (
        "/api/v1/watch/namespaces/foo/pods/bar",
        {"namespace": "foo", "resource": "pods", "name": "bar", "legacy_watch": True},
    ),
    (
        "/apis/apps/v1/watch/namespaces/ns/deployments",
        {"kind": "group", "namespace": "ns", "resource": "deployments", "legacy_watch": True},
    ),
    ("/api/v1/watch/namespaces", {"resource": "namespaces", "legacy_watch": True}),
    ("/api/v1/namespaces/..foo", {"resource": "namespaces", "name": "..foo"}),
    ("/api/v1/namespaces/%2e.x", {"resource": "namespaces", "name": "..x"}),
    ("/api/v1/namespaces/caf%C3%A9", {"resource": "namespaces", "name": "café"}),
    # A trailing slash: the apiserver serves these exactly as without it (checked against
    # kube-apiserver v1.34); the path is forwarded as sent.
    ("/version/", {"kind": "other", "trailing_slash": True}),
    ("/healthz/", {"kind": "other", "trailing_slash": True}),
    ("/api/", {"kind": "discovery", "version": "", "trailing_slash": True}),
    ("/apis/", {"kind": "discovery", "group": "", "trailing_slash": True}),
    ("/api/v1/", {"kind": "discovery", "version": "v1", "trailing_slash": True}),
    ("/apis/apps/", {"kind": "discovery", "group": "apps", "version": ""}),
    ("/apis/apps/v1/", {"kind": "discovery", "group": "apps", "version": "v1"}),
    (
        "/api/v1/namespaces/default/pods/",
        {"namespace": "default", "resource": "pods", "name": None, "trailing_slash": True},
    ),
    ("/api/v1/pods/", {"resource": "pods", "namespace": None, "name": None}),
    ("/api/v1/namespaces/", {"resource": "namespaces", "namespace": None, "name": None}),
    ("/api/v1/namespaces/default/", {"resource": "namespaces", "name": "default"}),
    (
        "/api/v1/namespaces/foo/pods/p/log/",
        {"namespace": "foo", "name": "p", "subresource": "log", "tail": ()},
    ),
    (
        "/api/v1/watch/namespaces/foo/pods/",
        {"namespace": "foo", "resource": "pods", "legacy_watch": True, "name": None},
    ),
    (
        "/apis/apps/v1/namespaces/ns/deployments/",
        {"kind": "group", "namespace": "ns", "resource": "deployments", "name": None},
    ),
    ("/api/v1/pods", {"resource": "pods", "trailing_slash": False}),
]


@pytest.mark.parametrize(("path", "expected"), VALID, ids=[path for path, _ in VALID])
def test_canonical_paths_are_classified(path: str, expected: dict[str, Any]) -> None:
    parsed = parse_api_path(path)
    assert parsed.raw == path
    for field, value in expected.items():
        assert getattr(parsed, field) == value, field


INVALID = [
    "",
    "api/v1/pods",
    "*",
    "/api/v1/..",
    "/api/v1/../../secrets",
    "/api/v1/namespaces/foo/../bar/pods",
    "/api/v1/./pods",
    "/api/v1/pods/.",
    "/api/v1/%2e%2e/secrets",
    "/api/v1/%2E%2E/secrets",
    "/api/v1/.%2e/secrets",
    "/api/v1/%2e/pods",
    "/api//v1/pods",
    "//api/v1/pods",
    "/api/v1/namespaces//pods",
    # One trailing slash is what the apiserver serves; two are an empty segment in the middle.
    "/api//",
    "/api/v1//",
    "/apis//",
    "/version//",
    "/api/v1/namespaces/default/pods//",
    "/api/v1/namespaces/default/pods/p//",
    "/api/v1/namespaces/foo%2fbar/pods",
    "/api/v1/namespaces/foo%2Fbar/pods",
    "/api/v1/namespaces/foo%5cbar/pods",
    "/api/v1/namespaces/foo%5Cbar/pods",
    "/api/v1/namespaces/foo\\bar/pods",
    "/api/v1/namespaces/foo%00/pods",
    "/api/v1/namespaces/foo\x00/pods",
    "/api/v1/namespaces/foo%0a/pods",
    "/api/v1/namespaces/foo\r\n/pods",
    "/api/v1/namespaces/foo%7f/pods",
    "/api/v1/namespaces/foo%c2%85/pods",
    "/api/v1/namespaces/foo%/pods",
    "/api/v1/namespaces/foo%2/pods",
    "/api/v1/namespaces/foo%zz/pods",
    "/api/v1/namespaces/foo%252e%252e/pods",
    "/api/v1/namespaces/%ff/pods",
    "/api/v1/namespaces/foo bar/pods",
    "/api/v1/namespaces/café/pods",
    "/api/v1/pods?watch=true",
    "/api/v1/pods#frag",
    "/api/v1/namespaces/foo/pods/p:80/proxy//x",
    "/api/v1/namespaces/foo/pods/p:80/proxy//",
    "/api/v1/namespaces/foo/pods/p:80/proxy/x//",
    "/api/v1/namespaces/foo/pods/p:80/proxy/../../../secrets",
    "/api/v1/namespaces/foo/pods/p:80/proxy/a%2f..%2f..",
]


@pytest.mark.parametrize("path", INVALID)
def test_non_canonical_paths_are_refused(path: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_api_path(path)
    assert caught.value.code == 400
    assert "invalid request path" in caught.value.message


def test_is_collection_only_for_a_resource_without_name() -> None:
    assert parse_api_path("/api/v1/namespaces/foo/pods").is_collection
    assert parse_api_path("/api/v1/namespaces").is_collection
    assert not parse_api_path("/api/v1/namespaces/foo").is_collection
    assert not parse_api_path("/api/v1/namespaces/foo/pods/bar").is_collection
    assert not parse_api_path("/apis/apps/v1").is_collection


def test_error_message_is_bounded_for_huge_paths() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_api_path("/api/v1/" + "a" * 10_000 + "/..")
    assert len(caught.value.message) < 300


# --- properties ------------------------------------------------------------------------------

names = st.from_regex(r"[a-z0-9]([a-z0-9\-.:]{0,20}[a-z0-9])?", fullmatch=True).filter(
    lambda name: name not in (".", "..")
)


@st.composite
def api_paths(draw: st.DrawFn) -> tuple[str, ApiPath]:
    """A canonical path built from parts, with some characters percent-encoded."""
    core = draw(st.booleans())
    group = "" if core else draw(names)
    version = draw(st.sampled_from(["v1", "v1beta1", "v2alpha3"]))
    legacy_watch = draw(st.booleans())
    resource = draw(names.filter(lambda r: r not in ("namespaces", "watch")))
    namespace = draw(st.none() | names)
    name = draw(st.none() | names)
    subresource = draw(st.none() | names) if name is not None else None

    def encode(segment: str) -> str:
        return quote(segment, safe="") if draw(st.booleans()) else segment

    parts = ["api"] if core else ["apis", encode(group)]
    parts.append(version)
    if legacy_watch:
        parts.append("watch")
    if namespace is not None:
        parts += ["namespaces", encode(namespace)]
    parts.append(encode(resource))
    if name is not None:
        parts.append(encode(name))
    if subresource is not None:
        parts.append(subresource)
    raw = "/" + "/".join(parts)
    expected = ApiPath(
        raw=raw,
        kind="core" if core else "group",
        group=group,
        version=version,
        namespace=namespace,
        resource=resource,
        name=name,
        subresource=subresource,
        legacy_watch=legacy_watch,
    )
    return raw, expected


@given(api_paths())
def test_built_paths_round_trip(case: tuple[str, ApiPath]) -> None:
    raw, expected = case
    assert parse_api_path(raw) == expected


@given(
    case=api_paths(),
    where=st.integers(min_value=1),
    dots=st.sampled_from([".", "..", "%2e", "%2E%2e", ".%2E", "", "a%2Fb", "%5C"]),
)
def test_inserting_a_traversal_segment_anywhere_is_refused(
    case: tuple[str, ApiPath], where: int, dots: str
) -> None:
    segments = case[0].split("/")
    # An empty segment inserted last is a trailing slash, which the apiserver serves.
    index = 1 + where % (len(segments) - 1 if dots == "" else len(segments))
    segments.insert(index, dots)
    with pytest.raises(BadRequest):
        parse_api_path("/".join(segments))


@given(st.text(max_size=60))
def test_arbitrary_input_is_either_refused_or_kept_as_received(text: str) -> None:
    try:
        parsed = parse_api_path(text)
    except BadRequest:
        return
    assert parsed.raw == text
    decoded = [parsed.group, parsed.version, parsed.namespace, parsed.resource, parsed.name]
    for value in decoded:
        assert value is None or (value not in (".", "..") and "/" not in value)


@given(st.text(alphabet="/.%2eEfF5cC", max_size=30))
def test_dot_and_escape_soup_never_yields_a_dot_segment(text: str) -> None:
    path = "/api/v1/" + text
    assume(path != "/api/v1/")
    try:
        parsed = parse_api_path(path)
    except BadRequest:
        return
    for value in (parsed.resource, parsed.name, parsed.subresource, *parsed.tail):
        assert value not in (".", "..")


@pytest.mark.parametrize(
    ("path", "canonical"),
    [
        ("/api/v1/namespaces/default/%73ecrets", "/api/v1/namespaces/default/secrets"),
        ("/%61pi/v1/pods/", "/api/v1/pods/"),
        ("/api/v1/namespaces/caf%c3%a9", "/api/v1/namespaces/caf%C3%A9"),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/a%3ab",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/a:b",
        ),
        ("/api/v1/namespaces/a%20b/pods", "/api/v1/namespaces/a%20b/pods"),
        ("/api/v1/namespaces/d/pods/p%3Fx", "/api/v1/namespaces/d/pods/p%3Fx"),
        ("/api/v1/namespaces/d/pods/p%23x", "/api/v1/namespaces/d/pods/p%23x"),
        (
            "/api/v1/namespaces/d/services/s/proxy/a%2b%2Bb/",
            "/api/v1/namespaces/d/services/s/proxy/a++b/",
        ),
    ],
)
def test_the_canonical_path_writes_each_decoded_character_one_way(
    path: str, canonical: str
) -> None:
    assert parse_api_path(path).canonical == canonical


def test_a_path_without_escapes_is_its_own_canonical_form() -> None:
    path = "/api/v1/namespaces/default/configmaps/kube-root-ca.crt"
    assert parse_api_path(path).canonical is path
    target = path + "?watch=1&fieldSelector=metadata.name%3Dx"
    assert canonical_target(target) is target


@given(st.text(max_size=60))
def test_what_goes_upstream_decodes_to_what_was_judged(text: str) -> None:
    try:
        parsed = parse_api_path(text)
    except BadRequest:
        return
    canonical = parse_api_path(parsed.canonical)
    # The apiserver decodes the forwarded path to the judged one, and it is a fixed point.
    assert unquote_to_bytes(parsed.canonical).decode() == unquote_to_bytes(text).decode()
    assert canonical.canonical == parsed.canonical
    assert dataclasses.replace(canonical, raw=text) == parsed
    assert canonical.segments == parsed.segments


# A segment's characters: no separator or escape, no control character (C0, DEL, C1: the
# category Cc) and no lone surrogate (Cs). Drawn so, not filtered out of any text with
# assume(): the filters rejected most lists of six segments, and Hypothesis's health check
# failed one run in three ("filtering out a lot of inputs"; CI's derandomized profile hid it).
SEGMENT_CHARACTERS = st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="/\\%")


@given(st.lists(st.text(SEGMENT_CHARACTERS, min_size=1, max_size=8), min_size=1, max_size=6))
def test_any_decoded_segments_survive_encoding(segments: list[str]) -> None:
    assume(all(s not in (".", "..") for s in segments))
    # Under a non-API prefix, so that no segment has a meaning that could refuse the path.
    path = "/x/" + "/".join(encode_segment(s) for s in segments)
    assert parse_api_path(path).segments == ("x", *segments)
