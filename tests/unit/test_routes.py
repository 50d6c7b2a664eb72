"""What a request on the API port is (watchproxy.server.routes.classify), from plain values."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from watchproxy.config import AccessRule
from watchproxy.errors import BadRequest, ProxyError, UpstreamUnavailable
from watchproxy.kube.watchquery import InvalidListOptions
from watchproxy.policy.access import (
    AccessPolicy,
    HostNotAllowed,
    ImpersonationRefused,
    PolicyDenied,
    ReadOnlyRefused,
)
from watchproxy.server.http import decoded_query
from watchproxy.server.routes import (
    Refusal,
    Route,
    RouteKind,
    Routing,
    classify,
    page_shape,
    with_continue,
)

K = RouteKind
RULES = (AccessRule("deny", "/api/v1/namespaces/*/secrets*"), AccessRule("allow", "/*"))
POLICY = AccessPolicy(RULES)
FULL = Routing.of(
    ("localhost", "127.0.0.1", "[::1]"),
    POLICY,
    hub=True,
    consistent_lists=True,
    list_batching=True,
)
PODS = "/api/v1/namespaces/d/pods"


def route(
    method: str,
    target: str,
    routing: Routing = FULL,
    *,
    draining: bool = False,
    **headers: str,
) -> Route:
    """``headers`` by their Python names (Impersonate_User is Impersonate-User)."""
    sent = CIMultiDict({"Host": "localhost:8001"})
    for name, value in headers.items():
        sent[name.replace("_", "-")] = value
    query = dict(parse_qsl(urlsplit(target).query, keep_blank_values=True))
    return classify(method, target, query, sent, routing, draining=draining)


def with_services(**services: bool) -> Routing:
    return Routing.of(("localhost",), POLICY, **services)


# (method, target, routing, kinds, verb, streaming)
ROUTED = [
    # Watches: the hub's when it has one, else passed through as a stream.
    ("GET", f"{PODS}?watch=1", FULL, (K.HUB_WATCH, K.PASSTHROUGH_STREAM), "watch", True),
    ("GET", "/api/v1/watch/pods", FULL, (K.HUB_WATCH, K.PASSTHROUGH_STREAM), "watch", True),
    (
        "GET",
        f"{PODS}?watch=true&timeoutSeconds=0",
        FULL,
        (K.HUB_WATCH, K.PASSTHROUGH_STREAM),
        "watch",
        True,
    ),
    ("GET", f"{PODS}?watch=1&timeoutSeconds=-1", FULL, (K.PASSTHROUGH_STREAM,), "watch", True),
    ("GET", f"{PODS}?watch=1", with_services(), (K.PASSTHROUGH_STREAM,), "watch", True),
    # A legacy watch of a subresource: the apiserver reads no list options there.
    ("GET", "/api/v1/watch/namespaces/d/pods/p/log", FULL, (K.PASSTHROUGH_STREAM,), "watch", True),
    # watch=1 on one object is a plain GET.
    ("GET", f"{PODS}/p?watch=1&limit=abc", FULL, (K.PASSTHROUGH,), "get", False),
    # LISTs: resourceVersion=0 from the cache; none from the hub once current, else batched.
    ("GET", f"{PODS}?resourceVersion=0", FULL, (K.CACHED_LIST, K.PASSTHROUGH), "list", False),
    (
        "GET",
        f"{PODS}?resourceVersion=0",
        with_services(list_batching=True),
        (K.PASSTHROUGH,),
        "list",
        False,
    ),
    ("GET", f"{PODS}?resourceVersion=0&continue=x", FULL, (K.PASSTHROUGH,), "list", False),
    ("GET", PODS, FULL, (K.CONSISTENT_LIST, K.BATCHED_LIST, K.PASSTHROUGH), "list", False),
    (
        "GET",
        f"{PODS}?resourceVersion=",
        FULL,
        (K.CONSISTENT_LIST, K.BATCHED_LIST, K.PASSTHROUGH),
        "list",
        False,
    ),
    (
        "GET",
        f"{PODS}?limit=10",
        FULL,
        (K.CONSISTENT_LIST, K.BATCHED_LIST, K.PASSTHROUGH),
        "list",
        False,
    ),
    (
        "GET",
        f"{PODS}?limit=10&continue=abc",
        FULL,
        (K.CONSISTENT_LIST, K.PASSTHROUGH),
        "list",
        False,
    ),
    (
        "GET",
        PODS,
        with_services(hub=True, consistent_lists=True),
        (K.CONSISTENT_LIST, K.PASSTHROUGH),
        "list",
        False,
    ),
    (
        "GET",
        PODS,
        with_services(hub=True, list_batching=True),
        (K.BATCHED_LIST, K.PASSTHROUGH),
        "list",
        False,
    ),
    (
        "GET",
        PODS,
        with_services(list_batching=True),
        (K.BATCHED_LIST, K.PASSTHROUGH),
        "list",
        False,
    ),
    ("GET", PODS, with_services(hub=True), (K.PASSTHROUGH,), "list", False),
    (
        "GET",
        f"{PODS}?continue=abc",
        with_services(list_batching=True),
        (K.PASSTHROUGH,),
        "list",
        False,
    ),
    ("GET", f"{PODS}?resourceVersion=12", FULL, (K.PASSTHROUGH,), "list", False),
    (
        "GET",
        f"{PODS}?resourceVersion=12&resourceVersionMatch=NotOlderThan",
        FULL,
        (K.PASSTHROUGH,),
        "list",
        False,
    ),
    ("HEAD", PODS, FULL, (K.PASSTHROUGH,), "list", False),
    # Everything else passes through; logs -f as a stream.
    ("GET", f"{PODS}/p", FULL, (K.PASSTHROUGH,), "get", False),
    ("GET", f"{PODS}/p/log?follow=true", FULL, (K.PASSTHROUGH_STREAM,), "get", True),
    ("GET", f"{PODS}/p/log", FULL, (K.PASSTHROUGH,), "get", False),
    ("POST", PODS, FULL, (K.PASSTHROUGH,), "create", False),
    ("PUT", f"{PODS}/p", FULL, (K.PASSTHROUGH,), "update", False),
    ("PATCH", f"{PODS}/p?fieldManager=kubectl", FULL, (K.PASSTHROUGH,), "patch", False),
    ("DELETE", f"{PODS}/p", FULL, (K.PASSTHROUGH,), "delete", False),
    ("DELETE", f"{PODS}?labelSelector=a%3Db", FULL, (K.PASSTHROUGH,), "deletecollection", False),
    ("GET", "/apis", FULL, (K.PASSTHROUGH,), "get", False),
    ("GET", "/version/", FULL, (K.PASSTHROUGH,), "get", False),
    ("OPTIONS", "/api", FULL, (K.PASSTHROUGH,), "options", False),
    ("GET", f"{PODS}/p/proxy/a/b", FULL, (K.PASSTHROUGH,), "connect", False),
    # exec, attach, port-forward: relayed, with or without the Upgrade header.
    ("POST", f"{PODS}/p/exec?command=ls", FULL, (K.UPGRADE,), "connect", False),
    ("GET", f"{PODS}/p/portforward", FULL, (K.UPGRADE,), "connect", False),
]


@pytest.mark.parametrize(("method", "target", "routing", "kinds", "verb", "streaming"), ROUTED)
def test_each_request_gets_its_route(
    method: str, target: str, routing: Routing, kinds: tuple[K, ...], verb: str, streaming: bool
) -> None:
    got = route(method, target, routing)
    assert (got.kinds, got.verb, got.streaming) == (kinds, verb, streaming)
    assert got.refusal is None and got.error is None and got.unshared is None
    assert got.api_path is not None and got.api_path.raw == target.partition("?")[0]


# (method, target, headers, routing, refusal, error type, verb)
REFUSED = [
    ("GET", PODS, {"Host": "evil.example"}, FULL, Refusal.HOST, HostNotAllowed, "list"),
    (
        "GET",
        f"{PODS}?watch=1",
        {"Host": "localhost.evil:80"},
        FULL,
        Refusal.HOST,
        HostNotAllowed,
        "watch",
    ),
    ("GET", PODS, {"Host": ""}, FULL, Refusal.HOST, HostNotAllowed, "list"),
    ("GET", "/api/v1/namespaces/d/../secrets", {}, FULL, Refusal.PATH, BadRequest, "get"),
    ("GET", "/api/v1/namespaces/d%2Fx/pods", {}, FULL, Refusal.PATH, BadRequest, "get"),
    ("POST", "//api/v1/pods", {}, FULL, Refusal.PATH, BadRequest, "create"),
    ("GET", f"{PODS}?limit=abc", {}, FULL, Refusal.QUERY, BadRequest, "get"),
    (
        "GET",
        f"{PODS}?watch=1&resourceVersionMatch=Exact",
        {},
        FULL,
        Refusal.QUERY,
        InvalidListOptions,
        "get",
    ),
    ("GET", "/api/v1/namespaces/d/secrets", {}, FULL, Refusal.POLICY, PolicyDenied, "list"),
    ("GET", "/api/v1/namespaces/d/secrets/", {}, FULL, Refusal.POLICY, PolicyDenied, "list"),
    (
        "GET",
        "/api/v1/pods",
        {"Impersonate-User": "u"},
        FULL,
        Refusal.IMPERSONATION,
        ImpersonationRefused,
        "list",
    ),
    (
        "POST",
        f"{PODS}/p/log",
        {"Upgrade": "websocket"},
        FULL,
        Refusal.UPGRADE_NOT_RELAYED,
        BadRequest,
        "create",
    ),
    (
        "POST",
        f"{PODS}/p/exec",
        {"Upgrade": "SPDY/3.1"},
        with_services(upgrades=False),
        Refusal.UPGRADE_NOT_RELAYED,
        BadRequest,
        "connect",
    ),
]


@pytest.mark.parametrize(
    ("method", "target", "headers", "routing", "why", "error", "verb"), REFUSED
)
def test_a_refused_request_gets_a_named_refusal_and_its_error(
    method: str,
    target: str,
    headers: dict[str, str],
    routing: Routing,
    why: Refusal,
    error: type[ProxyError],
    verb: str,
) -> None:
    got = route(method, target, routing, **{k.replace("-", "_"): v for k, v in headers.items()})
    assert got.kinds == (K.REFUSED,)
    assert got.refusal is why
    assert type(got.error) is error
    assert got.verb == verb
    assert not got.streaming


def test_writes_are_refused_when_read_only() -> None:
    read_only = Routing.of(("localhost",), AccessPolicy((), read_only=True))
    got = route("DELETE", f"{PODS}/p", read_only)
    assert (got.refusal, type(got.error), got.verb) == (
        Refusal.READ_ONLY,
        ReadOnlyRefused,
        "delete",
    )
    assert route("GET", f"{PODS}/p", read_only).kinds == (K.PASSTHROUGH,)


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:8001", "127.0.0.1:1", "[::1]:8001", "[::1]"]
)
def test_allowed_hosts_match_without_port_and_case(host: str) -> None:
    assert route("GET", PODS, Host=host).refusal is None


def test_only_the_refusals_a_metric_counts_are_counted() -> None:
    counted = {why for why in Refusal if why.counted}
    assert {why.value for why in counted} == {
        "host",
        "path",
        "read-only",
        "policy",
        "impersonation",
        "upgrade-not-relayed",
    }


def test_while_draining_streams_and_upgrades_are_refused_and_one_shot_requests_are_not() -> None:
    for target, headers in ((f"{PODS}?watch=1", {}), (f"{PODS}/p/log?follow=true", {})):
        got = route("GET", target, draining=True, **headers)
        assert got.refusal is Refusal.DRAINING and type(got.error) is UpstreamUnavailable
        assert got.streaming  # counted as the stream it would have been
    got = route("POST", f"{PODS}/p/exec", draining=True, Upgrade="SPDY/3.1")
    assert got.refusal is Refusal.DRAINING
    assert route("GET", PODS, draining=True).kind is K.CONSISTENT_LIST
    assert route("PATCH", f"{PODS}/p", draining=True).kind is K.PASSTHROUGH


def test_someone_elses_view_is_never_served_from_the_hub() -> None:
    forwarding = Routing.of(
        ("localhost",),
        AccessPolicy(RULES, forward_impersonation=True),
        hub=True,
        consistent_lists=True,
        list_batching=True,
    )
    watch = route("GET", f"{PODS}?watch=1", forwarding, Impersonate_User="u")
    assert (watch.kinds, watch.unshared) == ((K.PASSTHROUGH_STREAM,), "impersonation")
    assert route("GET", f"{PODS}?resourceVersion=0", forwarding, Impersonate_Group="g").kinds == (
        K.PASSTHROUGH,
    )
    assert route("GET", PODS, forwarding, Impersonate_User="u").kinds == (
        K.BATCHED_LIST,
        K.PASSTHROUGH,
    )
    # Without a hub nothing was taken from it: no reason to count.
    no_hub = Routing.of(("localhost",), AccessPolicy(RULES, forward_impersonation=True))
    assert route("GET", f"{PODS}?watch=1", no_hub, Impersonate_User="u").unshared is None


def test_the_decoded_query_is_the_routes() -> None:
    got = route("GET", f"{PODS}?watch=1&labelSelector=app%3Dweb&allowWatchBookmarks=true")
    assert got.query is not None and got.query.watch and got.query.allow_watch_bookmarks
    assert got.api_path is not None and got.api_path.namespace == "d"
    assert route("GET", f"{PODS}/p").query is None


def test_routes_share_their_kind_sequences() -> None:
    # The hot path allocates the Route alone, never its kinds.
    assert route("GET", PODS).kinds is route("GET", "/api/v1/pods").kinds
    assert route("GET", "/api").kinds is route("POST", PODS).kinds


_METHODS = st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
_SEGMENT = st.sampled_from(
    ["api", "apis", "v1", "apps", "namespaces", "d", "pods", "p", "watch", "log", "exec",
     "status", "proxy", "secrets", "", "..", "%2F", "a%20b", "x"]
)  # fmt: skip
_PARAM = st.sampled_from(
    ["watch", "resourceVersion", "resourceVersionMatch", "timeoutSeconds", "limit", "continue",
     "labelSelector", "fieldSelector", "allowWatchBookmarks", "sendInitialEvents", "follow", "x"]
)  # fmt: skip
_VALUE = st.sampled_from(["", "0", "1", "-1", "12", "true", "abc", "NotOlderThan", "a=b"])
_ROUTINGS = st.builds(
    lambda hub, consistent, batching, upgrades: Routing.of(
        ("localhost",),
        POLICY,
        hub=hub,
        consistent_lists=consistent,
        list_batching=batching,
        upgrades=upgrades,
    ),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
_LAST = {K.REFUSED, K.UPGRADE, K.PASSTHROUGH, K.PASSTHROUGH_STREAM}


@given(
    method=_METHODS,
    segments=st.lists(_SEGMENT, max_size=8),
    params=st.dictionaries(_PARAM, _VALUE, max_size=4),
    routing=_ROUTINGS,
    draining=st.booleans(),
    upgrade=st.booleans(),
    impersonate=st.booleans(),
)
def test_every_request_gets_a_route_that_ends_in_an_answer(
    method: str,
    segments: list[str],
    params: dict[str, str],
    routing: Routing,
    draining: bool,
    upgrade: bool,
    impersonate: bool,
) -> None:
    target = "/" + "/".join(segments)
    if params:
        target += "?" + "&".join(f"{k}={v}" for k, v in params.items())
    headers = CIMultiDict({"Host": "localhost"})
    if upgrade:
        headers["Upgrade"] = "websocket"
    if impersonate:
        headers["Impersonate-User"] = "u"
    got = classify(method, target, params, headers, routing, draining=draining)
    assert got.kinds[-1] in _LAST and all(k not in _LAST for k in got.kinds[:-1])
    assert (got.kind is K.REFUSED) == (got.refusal is not None) == (got.error is not None)
    if got.kind is not K.REFUSED:
        assert got.api_path is not None
        shared = {K.HUB_WATCH, K.CACHED_LIST, K.CONSISTENT_LIST}
        assert not shared & set(got.kinds) or (routing.hub and not impersonate)
        assert K.CONSISTENT_LIST not in got.kinds or routing.consistent_lists
        assert K.BATCHED_LIST not in got.kinds or (routing.list_batching and method == "GET")
        assert not (draining and (got.streaming or upgrade))
        if got.verb == "watch":
            assert got.streaming and got.kinds[-1] is K.PASSTHROUGH_STREAM
        if got.kind is K.UPGRADE:
            assert got.api_path.subresource in ("exec", "attach", "portforward")
    if impersonate and got.kind is not K.REFUSED:
        assert routing.policy.forward_impersonation


# One paged LIST's pages differ in their continue token only: routed as one (api.RouteMemo's page
# memo), each with its own token.

TOKEN = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzLCJzdGFydCI6InAtMyJ9"


def test_a_pages_shape_is_its_target_without_the_tokens_value() -> None:
    first = page_shape(f"{PODS}?limit=2&continue={TOKEN}&labelSelector=app%3Dweb")
    assert first == (f"{PODS}?limit=2&continue=&labelSelector=app%3Dweb", TOKEN)
    assert page_shape(f"{PODS}?continue=other-token_2") == (f"{PODS}?continue=", "other-token_2")


@pytest.mark.parametrize(
    "target",
    [
        PODS,
        f"{PODS}?limit=2",
        f"{PODS}?limit=2&continue=",  # no token: a first page
        f"{PODS}?continue=a&continue=b",  # which one the apiserver reads is the decoder's call
        f"{PODS}?continue=abc%3D",  # a value that decoding changes
        f"{PODS}?continue=a+b",
        f"{PODS}?continue=a.b",
        f"{PODS}?contin%75e=x&continue=abc",  # an escaped name may be the first continue
    ],
)
def test_a_target_decoding_could_change_has_no_page_shape(target: str) -> None:
    assert page_shape(target) is None


_TOKENS = st.text(alphabet="ABCXYZabcxyz0189-_", min_size=1, max_size=12)


@given(
    method=_METHODS,
    path=st.sampled_from(
        [
            PODS,
            "/api/v1/pods",
            "/apis/apps/v1/namespaces/d/deployments",
            f"{PODS}/p",
            "/api/v1/namespaces/d/secrets",
            "/api/v1/watch/pods",
            "/api",
        ]
    ),
    params=st.lists(st.tuples(_PARAM, _VALUE), max_size=5),
    at=st.integers(min_value=0, max_value=5),
    tokens=st.tuples(_TOKENS, _TOKENS),
    routing=_ROUTINGS,
)
def test_another_page_of_a_shape_routes_as_classify_routes_it(
    method: str,
    path: str,
    params: list[tuple[str, str]],
    at: int,
    tokens: tuple[str, str],
    routing: Routing,
) -> None:
    """with_continue(route of one page, token) is what classify() says of the page with that
    token, wherever the continue parameter stands and whatever else the query holds."""
    routes = []
    for token in tokens:
        pairs = [f"{k}={v}" for k, v in params]
        pairs.insert(min(at, len(pairs)), f"continue={token}")
        target = f"{path}?{'&'.join(pairs)}"
        shape = page_shape(target)
        if shape is None:  # another continue in params: classify() decides each
            return
        assert shape[1] == token
        query = decoded_query(target.partition("?")[2])
        routes.append(
            (shape[0], classify(method, target, query, CIMultiDict(Host="localhost"), routing))
        )
    (shape, first), (other_shape, second) = routes
    assert shape == other_shape

    def comparable(route: Route) -> tuple[object, ...]:
        error = route.error
        return (
            *route._replace(error=None),
            None if error is None else (type(error), error.message),
        )

    assert comparable(with_continue(first, tokens[1])) == comparable(second)


WEBSOCKET = {"Upgrade": "websocket", "Connection": "Upgrade"}


def test_a_websocket_watch_is_served_by_the_hub_or_else_relayed_as_an_upgrade() -> None:
    target = f"{PODS}?watch=true&allowWatchBookmarks=true"
    shared = route("GET", target, **WEBSOCKET)
    assert (shared.kinds, shared.verb, shared.streaming) == (
        (K.HUB_WEBSOCKET_WATCH, K.UPGRADE),
        "watch",
        True,
    )
    assert shared.query is not None and shared.query.allow_watch_bookmarks
    legacy = route("GET", "/api/v1/watch/namespaces/d/pods", **WEBSOCKET)
    assert legacy.kinds == (K.HUB_WEBSOCKET_WATCH, K.UPGRADE)
    no_hub = Routing.of(("localhost",), POLICY)
    assert route("GET", target, no_hub, **WEBSOCKET).kinds == (K.UPGRADE,)
    # Someone else's view, or a negative timeout: the apiserver's to serve.
    impersonated = Routing.of(
        ("localhost",), AccessPolicy(RULES, forward_impersonation=True), hub=True
    )
    assert route("GET", target, impersonated, Impersonate_User="u", **WEBSOCKET).kinds == (
        K.UPGRADE,
    )
    assert route("GET", f"{target}&timeoutSeconds=-1", **WEBSOCKET).kinds == (K.UPGRADE,)


@pytest.mark.parametrize(
    ("method", "target", "headers", "routing"),
    [
        ("GET", f"{PODS}?watch=true", WEBSOCKET, with_services(upgrades=False)),
        ("GET", f"{PODS}?watch=true", {"Upgrade": "h2c", "Connection": "Upgrade"}, FULL),
        ("GET", f"{PODS}?watch=true", {"Upgrade": "websocket"}, FULL),  # no Connection: upgrade
        ("GET", f"{PODS}/p", WEBSOCKET, FULL),  # a GET of one object is no watch
    ],
    ids=["upgrades-off", "h2c", "no-connection-upgrade", "not-a-watch"],
)
def test_an_upgrade_that_is_neither_a_websocket_watch_nor_exec_is_refused_and_counted(
    method: str, target: str, headers: dict[str, str], routing: Routing
) -> None:
    got = route(method, target, routing, **headers)
    assert got.refusal is Refusal.UPGRADE_NOT_RELAYED and got.refusal.counted
