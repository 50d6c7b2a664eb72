"""What a request on the API port is, decided from values alone: :func:`classify`.

The answer is a :class:`Route`: the request's Kubernetes verb, its checked path and query, and
the route kinds to try in order. A kind that cannot serve the request (the hub has no shared
state for it, a batched answer too big to share) declines, and the next kind in the route
serves it; the last is always a pass-through, which never declines. A request that is refused
gets one route kind, :attr:`RouteKind.REFUSED`, with a named :class:`Refusal` and the error
that becomes its ``Status``.

No I/O and no aiohttp: the method, the raw request target, the decoded query and the headers go
in, so every rule is tested with plain values. What depends on state that changes per request
(rate limits, the hub's caches) is for the route's handlers to judge.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from watchproxy.errors import BadRequest, ProxyError, UpstreamUnavailable
from watchproxy.kube.apipath import ApiPath, parse_api_path
from watchproxy.kube.headers import Headers, impersonates
from watchproxy.kube.requestinfo import RequestInfo, request_info, selector_name
from watchproxy.kube.watchquery import WatchQuery, parse_watch_query
from watchproxy.kube.websocket import is_websocket_request
from watchproxy.policy.access import (
    AccessPolicy,
    HostNotAllowed,
    ImpersonationRefused,
    PolicyDenied,
    ReadOnlyRefused,
    host_name,
)

# The characters of a continue token as the apiserver issues it (base64url without padding):
# none of them is changed by a query's decoding, so the raw value is the decoded one.
_TOKEN_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")

UPGRADE_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})
_METHOD_VERBS = {"HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}


class RouteKind(enum.Enum):
    REFUSED = "refused"
    UPGRADE = "upgrade"  # exec, attach, port-forward: relayed as raw bytes after the 101
    HUB_WATCH = "hub-watch"  # a watch the hub may share
    HUB_WEBSOCKET_WATCH = "hub-websocket-watch"  # the same, asked for over WebSocket
    CACHED_LIST = "cached-list"  # resourceVersion=0: any state, the hub's if it has one
    CONSISTENT_LIST = "consistent-list"  # no resourceVersion: the hub's once it is current
    BATCHED_LIST = "batched-list"  # identical LISTs in flight together share one
    PASSTHROUGH_STREAM = "passthrough-stream"  # an unshared watch, logs -f
    PASSTHROUGH = "passthrough"

    # Members are singletons compared by identity: hashed by it too (``Enum.__hash__`` is a
    # Python function, and the handler looks a kind up in a dict for every request).
    __hash__ = object.__hash__


class Refusal(enum.Enum):
    """Why a request is refused before anything is sent upstream. ``counted`` ones are the
    ``reason`` label of ``watchproxy_rejected_requests``."""

    HOST = "host"
    PATH = "path"
    QUERY = "query"
    READ_ONLY = "read-only"
    POLICY = "policy"
    IMPERSONATION = "impersonation"
    DRAINING = "draining"
    UPGRADE_NOT_RELAYED = "upgrade-not-relayed"

    @property
    def counted(self) -> bool:
        return self in _COUNTED


_COUNTED = frozenset(
    {
        Refusal.HOST,
        Refusal.PATH,
        Refusal.READ_ONLY,
        Refusal.POLICY,
        Refusal.IMPERSONATION,
        Refusal.UPGRADE_NOT_RELAYED,
    }
)

# The routes' kind sequences: constants, so that classifying allocates none.
Kinds = tuple[RouteKind, ...]
_REFUSED: Kinds = (RouteKind.REFUSED,)
_UPGRADE: Kinds = (RouteKind.UPGRADE,)
_HUB_WATCH: Kinds = (RouteKind.HUB_WATCH, RouteKind.PASSTHROUGH_STREAM)
# A WebSocket watch the hub declines is relayed as the upgrade it is.
_HUB_WEBSOCKET_WATCH: Kinds = (RouteKind.HUB_WEBSOCKET_WATCH, RouteKind.UPGRADE)
_CACHED_LIST: Kinds = (RouteKind.CACHED_LIST, RouteKind.PASSTHROUGH)
_CONSISTENT_LIST: Kinds = (RouteKind.CONSISTENT_LIST, RouteKind.PASSTHROUGH)
_CONSISTENT_OR_BATCHED_LIST: Kinds = (
    RouteKind.CONSISTENT_LIST,
    RouteKind.BATCHED_LIST,
    RouteKind.PASSTHROUGH,
)
_BATCHED_LIST: Kinds = (RouteKind.BATCHED_LIST, RouteKind.PASSTHROUGH)
_PASSTHROUGH_STREAM: Kinds = (RouteKind.PASSTHROUGH_STREAM,)
_PASSTHROUGH: Kinds = (RouteKind.PASSTHROUGH,)


class Route(NamedTuple):
    """One request's route. ``kinds`` are tried in order; the last never declines.

    ``api_path`` and ``query`` are None when they were not parsed (a refusal before them;
    ``query`` also where the apiserver does not read list options). ``refusal`` and ``error``
    are set on a refused route only. ``unshared`` names why a watch the hub would otherwise
    serve passes through (for ``watchproxy_passthrough_watches``)."""

    kinds: Kinds
    verb: str
    api_path: ApiPath | None
    query: WatchQuery | None
    streaming: bool
    refusal: Refusal | None = None
    error: ProxyError | None = None
    unshared: str | None = None

    @property
    def kind(self) -> RouteKind:
        return self.kinds[0]


@dataclass(frozen=True, slots=True)
class Routing:
    """What the port is configured to do: the rules and which shared services exist."""

    allowed_hosts: frozenset[str]  # lower case, without ports
    policy: AccessPolicy
    hub: bool = False
    consistent_lists: bool = False
    list_batching: bool = False
    upgrades: bool = True

    @classmethod
    def of(cls, allowed_hosts: tuple[str, ...], policy: AccessPolicy, **services: bool) -> Routing:
        return cls(frozenset(h.lower() for h in allowed_hosts), policy, **services)


def reads_list_options(method: str, api_path: ApiPath) -> bool:
    """Whether the apiserver decodes this request's query as ListOptions (list, watch,
    deletecollection, the legacy ``/watch/`` paths). Elsewhere it ignores those parameters:
    ``GET .../configmaps/NAME?watch=1&limit=abc`` is a plain GET, answered 200."""
    if api_path.resource is None or api_path.subresource is not None:
        return False
    if method == "GET":
        return api_path.is_collection or api_path.legacy_watch
    return method == "DELETE" and api_path.is_collection and not api_path.legacy_watch


def verb_of(method: str, api_path: ApiPath, watch: bool) -> str:
    """The Kubernetes verb of a request, as the apiserver's audit and metrics name it.

    ``watch`` is the decoded ``watch`` parameter; it matters only on a collection."""
    if api_path.kind in ("discovery", "other") or api_path.resource is None:
        return "get" if method in ("GET", "HEAD") else method.lower()
    if api_path.subresource in UPGRADE_SUBRESOURCES or api_path.subresource == "proxy":
        return "connect"
    if method in ("GET", "HEAD"):
        if api_path.legacy_watch or (watch and api_path.is_collection):
            return "watch"
        return "list" if api_path.is_collection else "get"
    if method == "DELETE":
        return "deletecollection" if api_path.is_collection else "delete"
    return _METHOD_VERBS.get(method) or method.lower()


def resolve(method: str, api_path: ApiPath, list_query: WatchQuery | None) -> RequestInfo:
    """What the apiserver resolves the request to, as the access rules judge it: the decoded
    path, a legacy ``/watch/`` path as the resource it watches, a LIST's ``metadata.name``
    field selector as the name it reads. ``list_query``: the decoded list options where
    :func:`reads_list_options` (else None)."""
    if list_query is None:
        return request_info(method, api_path)
    name = selector_name(list_query.field_selector)
    return request_info(method, api_path, list_query.watch, name)


def refused_verb(method: str, raw_path: str, query: Mapping[str, str]) -> str:
    """The verb of a refused request (for the metrics' labels): from its path and query when
    they parse, else from its method alone."""
    try:
        api_path = parse_api_path(raw_path)
        watch = reads_list_options(method, api_path) and parse_watch_query(query).watch
    except ProxyError:
        return _METHOD_VERBS.get(method, method.lower())
    return verb_of(method, api_path, watch)


def is_streaming(verb: str, api_path: ApiPath, raw_query: str) -> bool:
    if verb == "watch":
        return True
    return api_path.subresource == "log" and "follow=true" in raw_query


def _refused(
    why: Refusal, error: ProxyError, method: str, raw_path: str, query: Mapping[str, str]
) -> Route:
    return Route(_REFUSED, refused_verb(method, raw_path, query), None, None, False, why, error)


def classify(
    method: str,
    target: str,
    query: Mapping[str, str],
    headers: Headers,
    routing: Routing,
    *,
    draining: bool = False,
) -> Route:
    """The route of one request: ``target`` is the raw request target (path and query; what is
    forwarded is :func:`~watchproxy.kube.apipath.canonical_target` of it, which decodes to the
    path judged here), ``query`` its decoded parameters. Never raises a
    :class:`~watchproxy.errors.ProxyError`: a refusal is a route."""
    host = host_name(headers.get("Host"))
    raw_path, _, raw_query = target.partition("?")
    if host is None or host not in routing.allowed_hosts:
        stranger = HostNotAllowed(f"Host {headers.get('Host')!r} is not allowed")
        return _refused(Refusal.HOST, stranger, method, raw_path, query)
    try:
        api_path = parse_api_path(raw_path)
    except BadRequest as error:
        return _refused(Refusal.PATH, error, method, raw_path, query)
    list_query: WatchQuery | None = None
    if reads_list_options(method, api_path):
        try:
            list_query = parse_watch_query(query)
        except BadRequest as error:
            return _refused(Refusal.QUERY, error, method, raw_path, query)
    watch = list_query is not None and list_query.watch
    verb = verb_of(method, api_path, watch)
    impersonating = impersonates(headers)
    try:
        policy = routing.policy
        if policy.active:
            policy.check(method, resolve(method, api_path, list_query))
        if impersonating:
            routing.policy.check_impersonation(headers.keys())
    except ReadOnlyRefused as error:
        return Route(_REFUSED, verb, api_path, list_query, False, Refusal.READ_ONLY, error)
    except ImpersonationRefused as error:
        return Route(_REFUSED, verb, api_path, list_query, False, Refusal.IMPERSONATION, error)
    except PolicyDenied as error:
        return Route(_REFUSED, verb, api_path, list_query, False, Refusal.POLICY, error)
    streaming = is_streaming(verb, api_path, raw_query)
    upgrade = bool(headers.get("Upgrade"))
    if draining and (streaming or upgrade):
        closing = UpstreamUnavailable("watchproxy is shutting down", retry_after=1)
        return Route(_REFUSED, verb, api_path, list_query, streaming, Refusal.DRAINING, closing)
    # Someone else's view (impersonation forwarded): the hub's state is not theirs to serve.
    hub = routing.hub and not impersonating
    # Whether the hub may serve this request if it is a watch. A negative timeoutSeconds is
    # valid and ends the watch at once: the apiserver's call.
    hub_watch = hub and list_query is not None and (list_query.timeout_seconds or 0) >= 0
    if upgrade and verb == "watch" and is_websocket_request(headers):
        # A watch over WebSocket (fabric8's default): served as any watch, else relayed.
        if hub_watch:
            return Route(_HUB_WEBSOCKET_WATCH, verb, api_path, list_query, True)
        if routing.upgrades:
            return Route(_UPGRADE, verb, api_path, list_query, True)
    if upgrade or api_path.subresource in UPGRADE_SUBRESOURCES:
        if not routing.upgrades or api_path.subresource not in UPGRADE_SUBRESOURCES:
            refused = BadRequest(f"watchproxy does not relay upgrades on {raw_path}")
            why = Refusal.UPGRADE_NOT_RELAYED
            return Route(_REFUSED, verb, api_path, list_query, streaming, why, refused)
        return Route(_UPGRADE, verb, api_path, list_query, streaming)
    if verb == "watch":
        if hub_watch:
            return Route(_HUB_WATCH, verb, api_path, list_query, True)
        unshared = "impersonation" if routing.hub and impersonating else None
        return Route(_PASSTHROUGH_STREAM, verb, api_path, list_query, True, None, None, unshared)
    if verb == "list" and list_query is not None:
        rv = list_query.resource_version
        if hub and rv == "0" and not list_query.continue_token:
            return Route(_CACHED_LIST, verb, api_path, list_query, False)
        batched = routing.list_batching and not rv and not list_query.continue_token
        if hub and routing.consistent_lists and not rv and not list_query.resource_version_match:
            kinds = _CONSISTENT_OR_BATCHED_LIST if batched else _CONSISTENT_LIST
            return Route(kinds, verb, api_path, list_query, False)
        if batched:
            return Route(_BATCHED_LIST, verb, api_path, list_query, False)
    kinds = _PASSTHROUGH_STREAM if streaming else _PASSTHROUGH
    return Route(kinds, verb, api_path, list_query, streaming)


def page_shape(target: str) -> tuple[str, str] | None:
    """``(target without its continue token's value, the token)`` for a request target whose
    query has one ``continue`` parameter with a token the apiserver could have issued, else
    None.

    Every page of one paged LIST has the same shape, and :func:`classify` reads the token only
    for being there, so one page's route is every page's route with its own token
    (:func:`with_continue`): a paging client's targets differ in nothing else, and deciding each
    anew cost a tenth of the proxy's CPU per request. None where the decoded query could hold
    a different first ``continue`` than the raw one seen here: a value that decoding changes,
    or a parameter name with an escape in it (``contin%75e``).
    """
    path, mark, query = target.partition("?")
    if not mark:
        return None
    at = -1
    start = 0
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "continue":
            if at >= 0 or not value or not _TOKEN_CHARACTERS.issuperset(value):
                return None
            at = start + len(name) + 1
            token = value
        elif "%" in name:
            return None
        start += len(part) + 1
    if at < 0:
        return None
    shape = f"{path}?{query[:at]}{query[at + len(token) :]}"
    return shape, token


def with_continue(route: Route, token: str) -> Route:
    """``route`` (a route :func:`classify` gave one page of a :func:`page_shape`) for the page
    of the same shape that carries ``token``."""
    query = route.query
    if query is None or query.continue_token == token:
        return route
    return route._replace(query=query.with_continue_token(token))
