"""The request-info resolver: what kube-apiserver derives from a request, case by case.

The cases cover the ground of the apiserver's own table (k8s.io/apiserver
pkg/endpoints/request/requestinfo_test.go): verbs by method, the special ``watch`` and ``proxy``
path verbs, namespaces and their own subresources, groups, collections turning ``get`` into
``list``/``watch`` and ``delete`` into ``deletecollection``, a ``metadata.name`` field selector
naming a list, and non-resource paths. Written for watchproxy, not copied.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import pytest

from watchproxy.errors import BadRequest
from watchproxy.kube.apipath import parse_api_path
from watchproxy.kube.requestinfo import RequestInfo
from watchproxy.kube.watchquery import parse_watch_query
from watchproxy.server.routes import reads_list_options, resolve


def info_of(method: str, target: str) -> RequestInfo:
    """As the router resolves it: the path decoded, list options read where the apiserver
    reads them."""
    path, _, query = target.partition("?")
    api_path = parse_api_path(path)
    options = None
    if reads_list_options(method, api_path):
        options = parse_watch_query(dict(parse_qsl(query, keep_blank_values=True)))
    return resolve(method, api_path, options)


NS = "/api/v1/namespaces/other"
R = True  # a resource request

CASES: list[tuple[str, str, dict[str, Any]]] = [
    # method, target, expected fields (group/version/namespace/resource/subresource/name/verb)
    ("GET", "/api/v1/namespaces", {"verb": "list", "resource": "namespaces", "namespace": ""}),
    ("GET", NS, {"verb": "get", "resource": "namespaces", "name": "other", "namespace": "other"}),
    ("GET", f"{NS}/pods", {"verb": "list", "resource": "pods", "namespace": "other"}),
    ("GET", f"{NS}/pods/foo", {"verb": "get", "resource": "pods", "name": "foo"}),
    ("HEAD", f"{NS}/pods/foo", {"verb": "get", "resource": "pods", "name": "foo"}),
    ("GET", "/api/v1/pods", {"verb": "list", "resource": "pods", "namespace": ""}),
    ("GET", "/api/v1/pods?watch=true", {"verb": "watch", "resource": "pods"}),
    ("GET", "/api/v1/pods?watch=1", {"verb": "watch"}),
    ("GET", "/api/v1/pods?watch=false", {"verb": "list"}),
    ("GET", "/api/v1/pods?watch=0", {"verb": "list"}),
    ("GET", f"{NS}/pods/foo?watch=true", {"verb": "get", "name": "foo"}),  # not a collection
    ("GET", "/api/v1/watch/pods", {"verb": "watch", "resource": "pods", "namespace": ""}),
    ("GET", "/api/v1/watch/namespaces/other/pods", {"verb": "watch", "namespace": "other"}),
    ("GET", "/api/v1/watch/namespaces/other/pods/foo", {"verb": "watch", "name": "foo"}),
    (
        "GET",
        "/api/v1/watch/namespaces/other",
        {"verb": "watch", "resource": "namespaces", "name": "other", "namespace": "other"},
    ),
    (
        "GET",
        "/api/v1/proxy/namespaces/other/pods/foo/some/path",
        {"verb": "proxy", "resource": "pods", "name": "foo", "subresource": ""},
    ),
    ("GET", "/api/v1/proxy/nodes/n1", {"verb": "proxy", "resource": "nodes", "name": "n1"}),
    ("POST", f"{NS}/pods", {"verb": "create", "resource": "pods", "name": ""}),
    ("PUT", f"{NS}/pods/foo", {"verb": "update", "name": "foo"}),
    ("PATCH", f"{NS}/pods/foo", {"verb": "patch", "name": "foo"}),
    ("DELETE", f"{NS}/pods/foo", {"verb": "delete", "name": "foo"}),
    ("DELETE", f"{NS}/pods", {"verb": "deletecollection", "name": ""}),
    ("OPTIONS", f"{NS}/pods/foo", {"verb": ""}),
    (
        "PUT",
        f"{NS}/finalize",
        {"resource": "namespaces", "name": "other", "subresource": "finalize"},
    ),
    ("PUT", f"{NS}/status", {"resource": "namespaces", "name": "other", "subresource": "status"}),
    (
        "GET",
        f"{NS}/pods/foo/log",
        {"verb": "get", "resource": "pods", "name": "foo", "subresource": "log"},
    ),
    ("POST", f"{NS}/pods/foo/exec", {"verb": "create", "subresource": "exec"}),
    ("GET", f"{NS}/pods/foo/exec", {"verb": "get", "subresource": "exec"}),
    ("GET", f"{NS}/pods/foo/proxy/a/b", {"verb": "get", "subresource": "proxy", "name": "foo"}),
    (
        "GET",
        "/apis/apps/v1/namespaces/other/deployments/web/scale",
        {"api_group": "apps", "api_version": "v1", "subresource": "scale", "name": "web"},
    ),
    (
        "GET",
        "/apis/extensions/v1beta1/namespaces/other/ingresses",
        {"api_group": "extensions", "api_version": "v1beta1", "verb": "list"},
    ),
    ("GET", "/apis/apps/v1/watch/deployments", {"api_group": "apps", "verb": "watch"}),
    # A metadata.name field selector names a list or watch (when it is a valid path segment).
    (
        "GET",
        f"{NS}/secrets?fieldSelector=metadata.name%3Dfoo",
        {"verb": "list", "name": "foo", "resource_path": f"{NS}/secrets/foo"},
    ),
    ("GET", f"{NS}/secrets?fieldSelector=metadata.name==foo&watch=1", {"verb": "watch"}),
    ("GET", f"{NS}/secrets?fieldSelector=metadata.name!=foo", {"verb": "list", "name": ""}),
    ("GET", f"{NS}/secrets?fieldSelector=metadata.name=..", {"name": ""}),
    ("GET", f"{NS}/pods?fieldSelector=spec.nodeName=n,metadata.name=foo", {"name": "foo"}),
    ("DELETE", f"{NS}/secrets?fieldSelector=metadata.name=foo", {"verb": "deletecollection"}),
    # Decoding: what the apiserver reads is the decoded path.
    ("POST", "/api/v1/namespaces/default/%73ecrets", {"verb": "create", "resource": "secrets"}),
    ("GET", "/%61pi/v1/namespaces/default/secrets", {"verb": "list", "resource": "secrets"}),
    ("GET", "/api/v1/namespaces/default/pods/", {"verb": "list", "name": ""}),  # trailing slash
]

NON_RESOURCE = [
    ("GET", "/api", "get"),
    ("GET", "/api/v1", "get"),
    ("GET", "/apis", "get"),
    ("GET", "/apis/apps", "get"),
    ("GET", "/apis/apps/v1", "get"),
    ("GET", "/version/", "get"),
    ("HEAD", "/healthz", "head"),
    ("POST", "/logs/x", "post"),
    ("GET", "/openapi/v3/apis/apps/v1", "get"),
    ("GET", "/", "get"),
]


@pytest.mark.parametrize(("method", "target", "expected"), CASES, ids=[c[1] for c in CASES])
def test_the_resolver_derives_what_the_apiserver_derives(
    method: str, target: str, expected: dict[str, Any]
) -> None:
    info = info_of(method, target)
    assert info.resource_request
    got = {key: getattr(info, key) for key in expected}
    assert got == expected


@pytest.mark.parametrize(("method", "path", "verb"), NON_RESOURCE)
def test_paths_outside_the_resource_layout_are_non_resource_requests(
    method: str, path: str, verb: str
) -> None:
    info = info_of(method, path)
    assert not info.resource_request
    assert info.verb == verb
    assert info.resource == info.namespace == info.name == ""


@pytest.mark.parametrize("path", ["/api/v1/watch", "/api/v1/proxy", "/apis/apps/v1/watch/"])
def test_a_special_verb_that_names_nothing_is_refused(path: str) -> None:
    # The apiserver's resolver cannot determine a resource there (it answers 500).
    with pytest.raises(BadRequest):
        parse_api_path(path)


def test_a_legacy_watch_path_addresses_the_resource_it_watches() -> None:
    info = info_of("GET", "/api/v1/watch/namespaces/default/secrets")
    assert info.path == "/api/v1/watch/namespaces/default/secrets"
    assert info.resource_path == "/api/v1/namespaces/default/secrets"
    named = info_of("GET", "/api/v1/watch/namespaces/d/secrets?fieldSelector=metadata.name=s")
    # The apiserver leaves the name of a legacy watch empty; what it reads is still that object.
    assert named.name == ""
    assert named.resource_path == "/api/v1/namespaces/d/secrets/s"


@pytest.mark.parametrize(
    ("method", "target", "verbs"),
    [
        ("GET", f"{NS}/pods/p/exec", {"get", "connect", "create"}),
        ("POST", f"{NS}/pods/p/attach", {"create", "connect"}),
        ("GET", f"{NS}/pods/p/portforward", {"get", "connect", "create"}),
        ("GET", f"{NS}/services/s:80/proxy/", {"get", "connect"}),
        ("PUT", f"{NS}/pods/p/proxy/x", {"update", "connect"}),
        ("GET", f"{NS}/pods/p/log", {"get"}),
    ],
)
def test_connect_subresources_are_known_as_connect_and_exec_also_as_create(
    method: str, target: str, verbs: set[str]
) -> None:
    info = info_of(method, target)
    assert info.verbs == verbs
    assert not info.reads_only or verbs == {"get"}


@pytest.mark.parametrize(
    ("method", "target", "reads"),
    [
        ("GET", f"{NS}/pods", True),
        ("GET", f"{NS}/pods?watch=1", True),
        ("HEAD", f"{NS}/pods/p", True),
        ("GET", "/api/v1/watch/pods", True),
        ("GET", f"{NS}/pods/p/log", True),
        ("GET", f"{NS}/pods/p/exec", False),
        ("GET", f"{NS}/pods/p/attach", False),
        ("GET", f"{NS}/pods/p/portforward", False),
        ("GET", f"{NS}/services/s/proxy/", False),
        ("GET", "/api/v1/proxy/nodes/n1", False),
        ("POST", f"{NS}/pods", False),
        ("OPTIONS", f"{NS}/pods", False),
        ("DELETE", f"{NS}/pods", False),
        ("GET", "/version", True),
        ("HEAD", "/version", True),
        ("POST", "/version", False),
    ],
)
def test_only_get_list_and_watch_read(method: str, target: str, reads: bool) -> None:
    assert info_of(method, target).reads_only is reads
