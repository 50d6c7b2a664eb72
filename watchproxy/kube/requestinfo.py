"""What the apiserver will do with a request: its request-info resolver, from values alone.

kube-apiserver decides a request's verb, API group and version, namespace, resource,
subresource and name (``k8s.io/apiserver/pkg/endpoints/request``, ``RequestInfoFactory``)
from its decoded path, its method and, for a GET or DELETE without a name, a few list options.
Its authorizer and audit act on that, never on the bytes of the path: so must watchproxy's
rules, or ``/api/v1/namespaces/default/%73ecrets`` and ``/api/v1/watch/namespaces/default/
secrets`` reach secrets past a rule written for ``/api/v1/namespaces/*/secrets*``.

:func:`request_info` follows the resolver step by step on the segments
:func:`~watchproxy.kube.apipath.parse_api_path` decoded (which already refuses what the
resolver cannot resolve, such as ``/api/v1/watch`` alone).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.fieldselectors import FieldSelector

# The subresources the apiserver serves by "connecting" the client to something else (a
# container's streams, a pod's or a service's port). A GET on one is no read.
CONNECT_SUBRESOURCES = frozenset({"exec", "attach", "portforward", "proxy"})
# Of those, the ones the apiserver (1.30+) authorizes as "create" whatever the method: kubectl
# opens them as a WebSocket GET.
_CREATE_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})
# The verbs that only read.
READ_VERBS = frozenset({"get", "list", "watch"})
# Every verb a resource request can resolve to, and what watchproxy adds ("connect").
RESOURCE_VERBS = frozenset(
    {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "proxy"}
)
# A non-resource request's verb is its method in lower case (RBAC's nonResourceURLs verbs).
NON_RESOURCE_VERBS = frozenset({"get", "head", "post", "put", "patch", "delete", "options"})

_API_PREFIXES = frozenset({"api", "apis"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the apiserver's resolver derives for one request.

    Guarantees: every text field is decoded (no escapes); ``namespace``, ``resource``,
    ``subresource``, ``name`` and ``api_group`` are "" where the request has none, as in the
    apiserver. ``path`` is the decoded path without a trailing slash; ``resource_path`` is
    the path of what is addressed: ``path`` without a ``/watch/`` or ``/proxy/`` verb segment,
    followed by the name a ``metadata.name`` field selector gave (``/api/v1/watch/namespaces/
    ns/secrets?fieldSelector=metadata.name=x`` addresses ``/api/v1/namespaces/ns/secrets/x``).
    ``verbs`` are the names an access rule may know the request by: ``verb``, plus
    ``connect`` on a connect subresource, plus ``create`` on exec, attach and portforward.
    """

    verb: str
    path: str
    resource_path: str
    resource_request: bool = False
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    verbs: frozenset[str] = frozenset()

    @property
    def reads_only(self) -> bool:
        """Whether the request only reads: get, list or watch of a resource that connects to
        nothing; a non-resource GET or HEAD."""
        if not self.resource_request:
            return self.verb in ("get", "head")
        return self.verb in READ_VERBS and self.subresource not in CONNECT_SUBRESOURCES


def selector_name(selector: FieldSelector) -> str:
    """The name a ``metadata.name=`` term of a field selector gives a list or watch, as the
    apiserver takes it (``RequiresExactMatch``), when it is a valid path segment name; else ""."""
    for requirement in selector.requirements:
        if requirement.field == "metadata.name" and requirement.operator == "=":
            value = requirement.value
            if value not in (".", "..") and "/" not in value and "%" not in value:
                return value
            return ""
    return ""


# A handful of paths and methods, asked again on every request where rules are configured.
@functools.lru_cache(maxsize=4096)
def request_info(
    method: str, api_path: ApiPath, watch: bool = False, name: str = ""
) -> RequestInfo:
    """The resolver's answer for ``method`` on ``api_path``. ``watch``: the decoded ``watch``
    list option (read only for a GET without a name); ``name``: :func:`selector_name` of its
    field selector (likewise)."""
    segments = api_path.segments
    path = api_path.decoded
    if len(segments) < 3 or segments[0] not in _API_PREFIXES:
        return _non_resource(method, path)
    parts = segments[1:]
    group = ""
    if segments[0] == "apis":
        if len(parts) < 3:
            return _non_resource(method, path)
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    resource_path = path
    if parts[0] in ("watch", "proxy"):
        # parse_api_path refuses a special verb with nothing after it, as the resolver does.
        verb, parts = parts[0], parts[1:]
        kept = len(segments) - len(parts) - 1
        resource_path = "/" + "/".join(segments[:kept] + segments[kept + 1 :])
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    item = parts[1] if len(parts) >= 2 else ""
    # The legacy proxy verb takes everything after the name as the proxied path.
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not item and verb == "get":
        verb = "watch" if watch else "list"
        item = name  # the apiserver names a list or watch by its field selector
    if name and not parts[1:] and verb in ("list", "watch"):
        # What it reads, also on a legacy /watch/ path (where the apiserver leaves the name
        # empty): a rule on the object's path holds for a selector that picks the object.
        resource_path = f"{resource_path}/{name}"
    if not item and verb == "delete":
        verb = "deletecollection"
    verbs = {verb}
    if subresource in CONNECT_SUBRESOURCES:
        verbs.add("connect")
    if subresource in _CREATE_SUBRESOURCES:
        verbs.add("create")
    return RequestInfo(
        verb=verb,
        path=path,
        resource_path=resource_path,
        resource_request=True,
        api_group=group,
        api_version=version,
        namespace=namespace,
        resource=resource,
        subresource=subresource,
        name=item,
        verbs=frozenset(verbs),
    )


def _non_resource(method: str, path: str) -> RequestInfo:
    verb = method.lower()
    return RequestInfo(verb=verb, path=path, resource_path=path, verbs=frozenset({verb}))
