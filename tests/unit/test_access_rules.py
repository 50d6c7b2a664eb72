"""Access rules and read-only mode judge what the apiserver will do with a request.

Rules name verbs, API groups, resources and namespaces as RBAC does, or glob a path; either way
a request is judged on the path the apiserver decodes and resolves, never on its bytes: an
escape of an ordinary letter (``%73ecrets``), an escaped ``api`` or a legacy ``/watch/`` path
gets the verdict of the plain path, and what goes upstream decodes to exactly the path judged.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from watchproxy.config import AccessRule
from watchproxy.hub.watchkey import watch_key
from watchproxy.kube.apipath import canonical_target, parse_api_path
from watchproxy.kube.watchquery import parse_watch_query
from watchproxy.policy.access import AccessPolicy, PolicyDenied, ReadOnlyRefused
from watchproxy.server.routes import Refusal, Route, RouteKind, Routing, classify

HOSTS = ("localhost",)
SECRETS_PATH = "/api/v1/namespaces/*/secrets*"
WRITES = ["POST", "PUT", "PATCH", "DELETE"]

# The documented example (config.example.yaml): writes to secrets by verb, any spelling.
SECRET_WRITES = AccessRule(
    "deny",
    verbs=("create", "update", "patch", "delete", "deletecollection"),
    resources=("secrets",),
)
ROUTINGS: dict[str, Routing] = {
    "verbs": Routing.of(HOSTS, AccessPolicy([SECRET_WRITES])),
    "path-writes": Routing.of(HOSTS, AccessPolicy([AccessRule("deny", SECRETS_PATH, WRITES)])),
    "path-reads": Routing.of(HOSTS, AccessPolicy([AccessRule("deny", SECRETS_PATH, ["GET"])])),
    "resource-reads": Routing.of(
        HOSTS,
        AccessPolicy([AccessRule("deny", verbs=("get", "list", "watch"), resources=("secrets",))]),
    ),
    "namespace": Routing.of(HOSTS, AccessPolicy([AccessRule("deny", namespaces=("kube-system",))])),
    "read-only": Routing.of(HOSTS, AccessPolicy((), read_only=True)),
    "read-only+exec": Routing.of(
        HOSTS,
        AccessPolicy(
            [AccessRule("allow", verbs=("create",), resources=("pods/exec",))], read_only=True
        ),
    ),
    "read-only+broad-allow": Routing.of(
        HOSTS, AccessPolicy([AccessRule("allow", "/*")], read_only=True)
    ),
    "read-only+allow-get": Routing.of(
        HOSTS, AccessPolicy([AccessRule("allow", verbs=("get", "*"))], read_only=True)
    ),
}

# Every request the rule tests below judge: (method, target, extra headers).
WS = {"Upgrade": "websocket", "Connection": "Upgrade"}
REQUESTS: list[tuple[str, str, dict[str, str]]] = [
    ("POST", "/api/v1/namespaces/default/secrets", {}),
    ("PATCH", "/api/v1/namespaces/default/secrets/s1", {}),
    ("PUT", "/api/v1/namespaces/default/secrets/s1", {}),
    ("DELETE", "/api/v1/namespaces/default/secrets/s1", {}),
    ("DELETE", "/api/v1/namespaces/default/secrets", {}),
    ("GET", "/api/v1/namespaces/default/secrets", {}),
    ("GET", "/api/v1/namespaces/default/secrets/s1", {}),
    ("GET", "/api/v1/watch/namespaces/default/secrets", {}),
    ("GET", "/api/v1/namespaces/default/secrets?watch=1", {}),
    ("GET", "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name=c", {}),
    ("GET", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt", {}),
    ("POST", "/api/v1/namespaces/default/pods/p/exec?command=ls", {}),
    ("GET", "/api/v1/namespaces/default/pods/p/exec?command=ls&stdout=1", WS),
    ("GET", "/api/v1/namespaces/default/pods/p/attach?stdout=1", WS),
    ("GET", "/api/v1/namespaces/default/pods/p/portforward?ports=80", WS),
    ("GET", "/api/v1/namespaces/default/services/web:80/proxy/index.html", {}),
    ("GET", "/api/v1/namespaces/default/pods/p/log", {}),
    ("POST", "/apis/apps/v1/namespaces/default/deployments", {}),
    ("GET", "/apis/apps/v1/namespaces/default/deployments/web/scale", {}),
    ("GET", "/version", {}),
    ("POST", "/api/v1/namespaces/default/configmaps", {}),
]


def route(method: str, target: str, routing: Routing, headers: dict[str, str]) -> Route:
    sent = CIMultiDict({"Host": "localhost:8001", **headers})
    query = dict(parse_qsl(urlsplit(target).query, keep_blank_values=True))
    return classify(method, target, query, sent, routing)


def verdicts(method: str, target: str, headers: dict[str, str]) -> dict[str, object]:
    """Each routing's verdict on the request: its refusal (None: it goes on) and route kinds."""
    out: dict[str, object] = {}
    for name, routing in ROUTINGS.items():
        got = route(method, target, routing, headers)
        out[name] = (got.refusal, got.kinds, got.verb)
    return out


def go_decoded(path: str) -> str:
    """The path as the apiserver's Go server decodes it (url.URL.Path)."""
    return unquote_to_bytes(path).decode("utf-8")


@st.composite
def encodings(draw: st.DrawFn) -> tuple[int, str]:
    """One of REQUESTS, its path with any subset of its characters (slashes aside)
    percent-encoded, each escape in upper, lower or mixed-case hex."""
    index = draw(st.integers(0, len(REQUESTS) - 1))
    path, mark, query = REQUESTS[index][1].partition("?")
    out = []
    for ch in path:
        how = draw(st.sampled_from(["plain", "upper", "lower", "mixed"])) if ch != "/" else "plain"
        if how == "plain":
            out.append(ch)
            continue
        for byte in ch.encode("utf-8"):
            hexed = f"{byte:02x}"
            if how == "upper":
                hexed = hexed.upper()
            elif how == "mixed":
                hexed = hexed[0].upper() + hexed[1]
            out.append("%" + hexed)
    return index, "".join(out) + mark + query


@settings(max_examples=300, deadline=None)
@given(encodings())
def test_every_encoding_of_a_path_gets_the_plain_paths_verdict(case: tuple[int, str]) -> None:
    index, encoded = case
    method, plain, headers = REQUESTS[index]
    assert verdicts(method, encoded, headers) == verdicts(method, plain, headers)
    # What goes upstream decodes to the path judged, with the query as it came.
    forwarded = canonical_target(encoded)
    path, _, query = forwarded.partition("?")
    assert go_decoded(path) == plain.partition("?")[0]
    assert query == plain.partition("?")[2]
    # ... and it is the plain path itself: one canonical form, whatever the spelling.
    assert forwarded == plain


@settings(deadline=None)
@given(encodings(), st.data())
def test_an_encoded_slash_is_refused_never_judged(
    case: tuple[int, str], data: st.DataObject
) -> None:
    index, encoded = case
    method, _, headers = REQUESTS[index]
    path, mark, query = encoded.partition("?")
    slashes = [i for i, ch in enumerate(path) if ch == "/" and i > 0]
    assume(slashes)
    at = data.draw(st.sampled_from(slashes))
    spelled = path[:at] + data.draw(st.sampled_from(["%2F", "%2f"])) + path[at + 1 :]
    for routing in ROUTINGS.values():
        assert route(method, spelled + mark + query, routing, headers).refusal is Refusal.PATH


def refusal(routing: str, method: str, target: str, **headers: str) -> Refusal | None:
    return route(method, target, ROUTINGS[routing], headers).refusal


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/api/v1/namespaces/default/%73ecrets"),
        ("PATCH", "/api/v1/namespaces/default/secret%73/s1"),
        ("DELETE", "/api/v1/namespaces/default/%73ecrets/s1"),
        ("DELETE", "/api/v1/namespaces/default/secrets"),
        ("PUT", "/%61pi/v1/namespaces/default/secrets/s1"),
    ],
)
def test_the_issues_writes_to_secrets_are_denied_by_verb_and_by_path(
    method: str, target: str
) -> None:
    assert refusal("verbs", method, target) is Refusal.POLICY
    assert refusal("path-writes", method, target) is Refusal.POLICY


@pytest.mark.parametrize(
    "target",
    [
        "/%61pi/v1/namespaces/default/secrets",
        "/api/v1/watch/namespaces/default/secrets",
        "/api/v1/watch/namespaces/default/secrets/s1",
        "/api/%76%31/namespaces/default/secrets?watch=true",
        "/api/v1/namespaces/default/secrets/",
    ],
)
def test_reads_of_secrets_are_denied_in_every_spelling(target: str) -> None:
    assert refusal("path-reads", "GET", target) is Refusal.POLICY
    assert refusal("resource-reads", "GET", target) is Refusal.POLICY


def test_a_list_naming_an_object_by_field_selector_is_judged_on_the_objects_path() -> None:
    rule = AccessRule("deny", "/api/v1/namespaces/*/configmaps/private", ["GET"])
    routing = Routing.of(HOSTS, AccessPolicy([rule]))
    private = "/api/v1/namespaces/d/configmaps?fieldSelector=metadata.name%3Dprivate"
    assert route("GET", private, routing, {}).refusal is Refusal.POLICY
    legacy = "/api/v1/watch/namespaces/d/configmaps?fieldSelector=metadata.name=private"
    assert route("GET", legacy, routing, {}).refusal is Refusal.POLICY
    other = "/api/v1/namespaces/d/configmaps?fieldSelector=metadata.name=public"
    assert route("GET", other, routing, {}).refusal is None


def test_rules_match_rbac_style_resources_groups_and_namespaces() -> None:
    rules = [
        AccessRule("deny", resources=("*/scale",)),
        AccessRule("deny", api_groups=("batch",), verbs=("create",)),
        AccessRule("allow", namespaces=("team-a",), verbs=("*",)),
        AccessRule("deny", resources=("configmaps",), verbs=("*",)),
    ]
    routing = Routing.of(HOSTS, AccessPolicy(rules))
    scale = "/apis/apps/v1/namespaces/team-a/deployments/web/scale"
    assert route("GET", scale, routing, {}).refusal is Refusal.POLICY
    assert route("POST", "/apis/batch/v1/namespaces/team-a/jobs", routing, {}).refusal is (
        Refusal.POLICY
    )
    assert route("POST", "/apis/apps/v1/namespaces/x/deployments", routing, {}).refusal is None
    # First match wins: team-a's configmaps are allowed, everybody else's denied.
    assert route("GET", "/api/v1/namespaces/team-a/configmaps", routing, {}).refusal is None
    assert route("GET", "/api/v1/namespaces/b/configmaps", routing, {}).refusal is Refusal.POLICY
    # "configmaps" is not "configmaps/<subresource>", as in RBAC; groups, resources and
    # namespaces hold for resource requests only.
    assert route("GET", "/version", routing, {}).refusal is None
    core_only = Routing.of(HOSTS, AccessPolicy([AccessRule("deny", api_groups=("",))]))
    assert route("GET", "/api/v1/pods", core_only, {}).refusal is Refusal.POLICY
    assert route("GET", "/apis/apps/v1/deployments", core_only, {}).refusal is None
    assert route("GET", "/api/v1", core_only, {}).refusal is None


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("GET", "/api/v1/namespaces/d/pods/p/exec?command=ls&stdout=1", WS),
        ("GET", "/api/v1/namespaces/d/pods/p/exec?command=ls&stdout=1", {}),
        ("POST", "/api/v1/namespaces/d/pods/p/exec?command=ls", {"Upgrade": "SPDY/3.1"}),
        ("GET", "/api/v1/namespaces/d/pods/p/attach?stdout=1", WS),
        ("GET", "/api/v1/namespaces/d/pods/p/portforward?ports=80", WS),
        ("GET", "/api/v1/namespaces/d/pods/p:80/proxy/", {}),
        ("GET", "/api/v1/namespaces/d/services/web:80/proxy/admin", {}),
        ("GET", "/api/v1/proxy/namespaces/d/pods/p", {}),
        ("OPTIONS", "/api/v1/namespaces/d/pods", {}),
        ("POST", "/api/v1/namespaces/d/configmaps", {}),
        ("DELETE", "/api/v1/namespaces/d/configmaps", {}),
        ("POST", "/version", {}),
    ],
)
def test_read_only_refuses_every_verb_but_get_list_and_watch(
    method: str, target: str, headers: dict[str, str]
) -> None:
    got = route(method, target, ROUTINGS["read-only"], headers)
    assert (got.kinds, got.refusal, type(got.error)) == (
        (RouteKind.REFUSED,),
        Refusal.READ_ONLY,
        ReadOnlyRefused,
    )
    assert got.error is not None and got.error.code == 403
    # A broad allow rule does not lift read_only, nor one that names "get" (a WebSocket exec is
    # a GET) or "*"; one that names the verb does.
    assert refusal("read-only+broad-allow", method, target, **headers) is Refusal.READ_ONLY
    assert refusal("read-only+allow-get", method, target, **headers) is Refusal.READ_ONLY


@pytest.mark.parametrize(
    "target",
    [
        "/api/v1/namespaces/d/pods",
        "/api/v1/namespaces/d/pods?watch=1",
        "/api/v1/watch/namespaces/d/pods",
        "/api/v1/namespaces/d/pods/p/log?follow=true",
        "/version",
        "/apis/apps/v1",
    ],
)
def test_read_only_lets_reads_through(target: str) -> None:
    assert refusal("read-only", "GET", target) is None
    assert refusal("read-only", "HEAD", target.partition("?")[0]) is None


def test_an_allow_rule_naming_the_verb_lets_exec_through_read_only() -> None:
    exec_ws = "/api/v1/namespaces/d/pods/p/exec?command=ls&stdout=1"
    got = route("GET", exec_ws, ROUTINGS["read-only+exec"], WS)
    assert got.kinds == (RouteKind.UPGRADE,)
    # Only exec: attach and writes stay refused.
    attach = "/api/v1/namespaces/d/pods/p/attach?stdout=1"
    assert refusal("read-only+exec", "GET", attach, **WS) is Refusal.READ_ONLY
    assert refusal("read-only+exec", "POST", "/api/v1/namespaces/d/pods") is Refusal.READ_ONLY


def test_a_deny_rule_is_a_policy_refusal_even_under_read_only() -> None:
    policy = AccessPolicy([AccessRule("deny", resources=("secrets",))], read_only=True)
    got = route("GET", "/api/v1/namespaces/d/secrets", Routing.of(HOSTS, policy), {})
    assert (got.refusal, type(got.error)) == (Refusal.POLICY, PolicyDenied)


def test_methods_are_matched_in_upper_case() -> None:
    policy = AccessPolicy([AccessRule("deny", "/api/*", ("post",))])
    got = route("POST", "/api/v1/namespaces/d/configmaps", Routing.of(HOSTS, policy), {})
    assert got.refusal is Refusal.POLICY


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/api/v1/namespaces/%64efault/pods", "/api/v1/namespaces/default/pods"),
        ("/api/v1/namespaces/a%3Fb/pods", "/api/v1/namespaces/a%3Fb/pods"),
        (
            "/apis/%61pps/v1/namespaces/a%20b/deployments",
            "/apis/apps/v1/namespaces/a%20b/deployments",
        ),
    ],
)
def test_a_shared_watch_goes_upstream_on_the_path_its_clients_were_judged_on(
    raw: str, expected: str
) -> None:
    # The hub builds its own upstream path from the decoded fields: they are encoded again, so
    # a decoded "?" or space cannot end the path early or break the request line.
    keyed = watch_key(
        parse_api_path(raw), parse_watch_query({"watch": "1"}), accept=None, identity=""
    )
    assert isinstance(keyed, tuple), keyed
    assert keyed[0].collection_path == expected
