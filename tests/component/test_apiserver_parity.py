"""Requests judged as kube-apiserver judges them: one table, asked of the proxy and of the fake.

Each row is a request and the status kube-apiserver answered it with: v1.34.12 and v1.37.2 answer
every row alike (asked directly, with an admin token, from the ``kubetestenv`` binaries of the
real-apiserver tier). The proxy must
give the same status unless the row says why it deliberately differs (``proxy``), and so must
the fake apiserver, unless it cannot reproduce the real answer (``fake``, with a note). Where
the proxy refuses a request itself, its Status names the parameter (``param``).

What the real apiserver does, in short (the rows pin each point):

- booleans (``watch``, ``allowWatchBookmarks``, ``sendInitialEvents``) are false only for ``0``
  and ``false`` in any case; anything else, ``maybe`` and the empty string included, is true:
  ``?watch=maybe`` is a watch, not a 400;
- integers (``timeoutSeconds``, ``limit``) are Go ``ParseInt``: a sign is allowed, spaces,
  decimals, exponents and out-of-range values are a 400; a negative value is accepted;
- ``resourceVersion`` must be a decimal uint64 (400 for a list; the watch handler answers 500);
- ``resourceVersionMatch`` combinations and ``sendInitialEvents`` are checked after the
  WatchList defaults (a watch from "" or "0" gets ``sendInitialEvents=true`` +
  ``NotOlderThan``, so ``?watch=1&continue=x`` is a 422): 422 Invalid naming the field;
- selectors that do not parse are a 400; a field the resource cannot select on is a 400;
- list options are read only on collections (list, watch, deletecollection) and the legacy
  ``/watch/`` paths: ``GET .../configmaps/NAME?watch=1&limit=abc`` is a plain GET, 200;
- unknown parameters, ``pretty=maybe`` and a bad ``includeObject`` on JSON are ignored;
- one trailing slash is served as if absent (``/version/``, ``/api/``, ``.../pods/``).

``tests/realapi/test_parity.py`` asks the real apiserver the same table (directly, and through a
proxy in front of it) wherever that tier runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from tests.component.test_bad_input import Answer, request, send_raw
from tests.harness import Running, running_proxy

pytestmark = pytest.mark.asyncio(loop_scope="module")

P = "/api/v1/namespaces/default/pods"
CM = "/api/v1/namespaces/default/configmaps"
W = P + "?watch=1&timeoutSeconds=1"


@dataclass(frozen=True)
class Row:
    """One request, the real apiserver's status, and where the proxy or the fake differ.

    ``stream``: a 200 that is a watch (chunked, events) rather than one document.
    """

    id: str
    target: str
    real: int
    method: str = "GET"
    proxy: int | None = None
    fake: int | None = None
    param: str | None = None
    stream: bool = False
    note: str = ""

    @property
    def proxy_status(self) -> int:
        return self.real if self.proxy is None else self.proxy

    @property
    def fake_status(self) -> int:
        return self.real if self.fake is None else self.fake


NON_CANONICAL = "the proxy refuses a non-canonical path rather than guess how it is read"

ROWS: list[Row] = [
    # --- paths: one trailing slash is served; anything ambiguous is refused ---------------
    Row("version", "/version", 200),
    Row("version-slash", "/version/", 200),
    Row("api-slash", "/api/", 200),
    Row("apis-slash", "/apis/", 200),
    Row("core-v1-slash", "/api/v1/", 200),
    Row("group-slash", "/apis/apps/", 200),
    Row("group-version-slash", "/apis/apps/v1/", 200),
    Row("pods-slash", P + "/", 200),
    Row("all-pods-slash", "/api/v1/pods/", 200),
    Row("namespaces-slash", "/api/v1/namespaces/", 200),
    Row("namespace-slash", "/api/v1/namespaces/default/", 200),
    Row("named-slash", CM + "/cm1/", 200),
    Row("missing-named-slash", P + "/nope/", 404),
    Row("watch-collection-slash", P + "/?watch=1&timeoutSeconds=1", 200, stream=True),
    Row(
        "legacy-watch-slash",
        "/api/v1/watch/namespaces/default/pods/?timeoutSeconds=1",
        200,
        stream=True,
    ),
    Row("group-collection-slash", "/apis/apps/v1/namespaces/default/deployments/", 200),
    Row("healthz-slash", "/healthz/", 404),
    Row("unknown-group", "/apis/nope.example.com/v1/things", 404),
    Row("unknown-version-slash", "/api/v2/", 404),
    Row("empty-segment", "/api/v1//namespaces/default/pods", 404, proxy=400, note=NON_CANONICAL),
    Row("leading-double-slash", "//api/v1/pods", 404, proxy=400, note=NON_CANONICAL),
    Row(
        "double-trailing-slash",
        "/api//",
        200,
        proxy=400,
        fake=404,
        note="go-restful matches /api// as /api; the fake's router does not (the proxy refuses)",
    ),
    Row("collection-double-slash", P + "//", 200, proxy=400, note=NON_CANONICAL),
    Row("dotdot", "/api/v1/namespaces/default/../default/pods", 404, proxy=400),
    Row("dotdot-encoded", "/api/v1/namespaces/default/%2e%2e/default/pods", 404, proxy=400),
    Row(
        "encoded-slash",
        "/api/v1/namespaces/default%2Fpods",
        200,
        proxy=400,
        note="the apiserver decodes %2F and lists pods; the proxy refuses an encoded slash",
    ),
    # --- booleans: false only for 0 and false ---------------------------------------------
    Row("watch-maybe", P + "?watch=maybe&timeoutSeconds=1", 200, stream=True),
    Row("watch-empty", P + "?watch=&timeoutSeconds=1", 200, stream=True),
    Row("watch-no", P + "?watch=no&timeoutSeconds=1", 200, stream=True),
    Row("watch-0", P + "?watch=0", 200),
    Row("watch-False", P + "?watch=False", 200),
    Row("watch-FALSE", P + "?watch=FALSE", 200),
    Row("watch-first-value-wins", P + "?watch=0&watch=1", 200),
    Row("bookmarks-maybe", W + "&allowWatchBookmarks=maybe", 200, stream=True),
    Row("sie-maybe-on-list", P + "?sendInitialEvents=maybe", 422, param="sendInitialEvents"),
    Row("sie-false-on-list", P + "?sendInitialEvents=false", 422, param="sendInitialEvents"),
    # --- integers: Go ParseInt --------------------------------------------------------------
    Row("timeout-letters", P + "?timeoutSeconds=x", 400, param="timeoutSeconds"),
    Row("watch-timeout-letters", W + "x", 400, param="timeoutSeconds"),
    Row("timeout-decimal", P + "?watch=1&timeoutSeconds=1.5", 400, param="timeoutSeconds"),
    Row("timeout-space", P + "?watch=1&timeoutSeconds=+1", 400, param="timeoutSeconds"),
    Row("timeout-plus-sign", P + "?watch=1&timeoutSeconds=%2B1", 200, stream=True),
    Row("timeout-empty", P + "?timeoutSeconds=", 400, param="timeoutSeconds"),
    Row(
        "timeout-out-of-range",
        P + "?watch=1&timeoutSeconds=99999999999999999999",
        400,
        param="timeoutSeconds",
    ),
    Row("timeout-negative-on-list", P + "?timeoutSeconds=-1", 200),
    Row(
        "timeout-negative-on-watch",
        P + "?watch=1&timeoutSeconds=-5",
        200,
        stream=True,
        note="the apiserver ends the watch at once; the proxy passes it through",
    ),
    Row("limit-letters", P + "?limit=abc", 400, param="limit"),
    Row("limit-empty", P + "?limit=", 400, param="limit"),
    Row("limit-exponent", P + "?limit=1e3", 400, param="limit"),
    Row("limit-underscore", P + "?limit=5_0", 400, param="limit"),
    Row("limit-leading-space", P + "?limit=%205", 400, param="limit"),
    Row("limit-out-of-range", P + "?limit=99999999999999999999", 400, param="limit"),
    Row("limit-negative", P + "?limit=-1", 200),
    Row("limit-zero", P + "?limit=0", 200),
    Row("limit-on-watch", W + "&limit=-5", 200, stream=True),
    # --- resourceVersion and resourceVersionMatch ----------------------------------------
    Row("rv-letters", P + "?resourceVersion=abc", 400, param="resourceVersion"),
    Row("rv-negative", P + "?resourceVersion=-1", 400, param="resourceVersion"),
    Row("rv-plus", P + "?resourceVersion=%2B5", 400, param="resourceVersion"),
    Row(
        "rv-out-of-range", P + "?resourceVersion=99999999999999999999", 400, param="resourceVersion"
    ),
    Row("rv-leading-zero", P + "?resourceVersion=05", 200),
    Row("rv-empty", P + "?resourceVersion=", 200),
    Row(
        "watch-rv-letters",
        W + "&resourceVersion=abc",
        500,
        proxy=400,
        fake=400,
        param="resourceVersion",
        note="the apiserver's watch handler answers 500 for this; a client error is a 400",
    ),
    Row("match-without-rv", P + "?resourceVersionMatch=Exact", 422, param="resourceVersionMatch"),
    Row(
        "match-unsupported",
        P + "?resourceVersionMatch=Bogus&resourceVersion=1",
        422,
        param="resourceVersionMatch",
    ),
    Row(
        "match-exact-rv-0",
        P + "?resourceVersionMatch=Exact&resourceVersion=0",
        422,
        param="resourceVersionMatch",
    ),
    Row("match-not-older-than-0", P + "?resourceVersionMatch=NotOlderThan&resourceVersion=0", 200),
    Row(
        "match-with-continue",
        P + "?resourceVersionMatch=Exact&resourceVersion=1&continue=abc",
        422,
        param="resourceVersionMatch",
    ),
    Row(
        "watch-match-without-sie",
        W + "&resourceVersionMatch=NotOlderThan",
        422,
        param="resourceVersionMatch",
    ),
    Row(
        "watch-sie-with-exact",
        W + "&resourceVersionMatch=Exact&sendInitialEvents=true&allowWatchBookmarks=true",
        422,
        param="resourceVersionMatch",
    ),
    Row(
        "watch-sie-true",
        W + "&resourceVersionMatch=NotOlderThan&sendInitialEvents=true",
        200,
        stream=True,
    ),
    Row(
        "watch-sie-false",
        W + "&resourceVersionMatch=NotOlderThan&sendInitialEvents=false",
        200,
        stream=True,
    ),
    # --- watch-lists the apiserver refuses (client-go falls back to LIST + WATCH on these) ---
    Row(
        "watch-sie-without-match",
        W + "&sendInitialEvents=true",
        422,
        param="resourceVersionMatch",
    ),
    Row(
        "watch-sie-false-without-match",
        W + "&sendInitialEvents=false",
        422,
        param="resourceVersionMatch",
    ),
    Row(
        "watch-sie-maybe-without-match",
        W + "&sendInitialEvents=maybe",
        422,
        param="resourceVersionMatch",
    ),
    Row(
        "watch-sie-with-continue",
        W + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&continue=abc",
        422,
        param="resourceVersionMatch",
    ),
    Row("list-sie", P + "?sendInitialEvents=true", 422, param="sendInitialEvents"),
    Row(
        "list-sie-with-match",
        P + "?sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0",
        422,
        param="sendInitialEvents",
    ),
    # ... and those it serves: without bookmarks (no end bookmark), from "0", from an RV
    Row(
        "watch-sie-without-bookmarks",
        W + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=false",
        200,
        stream=True,
    ),
    Row(
        "watch-sie-from-rv-0",
        W + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0"
        "&allowWatchBookmarks=true",
        200,
        stream=True,
    ),
    Row(
        "watch-sie-from-an-rv",
        W + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=1"
        "&allowWatchBookmarks=true",
        200,
        stream=True,
    ),
    Row(
        "watch-continue-from-now",
        W + "&continue=abc",
        422,
        param="resourceVersionMatch",
        note="the WatchList defaults turn this into sendInitialEvents + NotOlderThan + continue",
    ),
    Row(
        "watch-continue-from-rv-0",
        W + "&resourceVersion=0&continue=abc",
        422,
        param="resourceVersionMatch",
    ),
    Row("watch-rv-empty", W + "&resourceVersion=", 200, stream=True),
    Row("watch-rv-0", W + "&resourceVersion=0", 200, stream=True),
    Row(
        "watch-rv-empty-bookmarks",
        W + "&resourceVersion=&allowWatchBookmarks=true",
        200,
        stream=True,
    ),
    Row(
        "watch-rv-0-sie-false",
        W + "&resourceVersion=0&sendInitialEvents=false",
        422,
        param="resourceVersionMatch",
    ),
    Row("watch-continue-from-an-rv", W + "&resourceVersion=1&continue=abc", 200, stream=True),
    Row("continue-garbage", P + "?continue=abc", 400),
    # --- selectors ------------------------------------------------------------------------
    Row("label-open-set", P + "?labelSelector=a%20in%20(", 400, param="labelSelector"),
    Row("label-bang", P + "?labelSelector=!", 400, param="labelSelector"),
    Row("label-bad-key", P + "?labelSelector=-a%3Db", 400, param="labelSelector"),
    Row("label-double-equals", P + "?labelSelector=a%3Db%3Dc", 400, param="labelSelector"),
    Row("label-bad-value", P + "?labelSelector=a%3D$", 400, param="labelSelector"),
    Row("label-two-slashes", P + "?labelSelector=x/y/z%3D1", 400, param="labelSelector"),
    Row("label-gt-not-a-number", P + "?labelSelector=a>x", 400, param="labelSelector"),
    Row("label-lone-comma", P + "?labelSelector=,", 400, param="labelSelector"),
    Row("label-notin-empty-set", P + "?labelSelector=a%20notin%20()", 200),
    Row("label-double-equals-operator", P + "?labelSelector=a%3D%3Db", 200),
    Row("label-gt", P + "?labelSelector=a>1", 200),
    Row("label-not-exists", P + "?labelSelector=!a", 200),
    Row("label-empty-value", P + "?labelSelector=a%3D", 200),
    Row("watch-label-bang", W + "&labelSelector=!", 400, param="labelSelector"),
    Row("field-no-operator", P + "?fieldSelector=metadata.name", 400, param="fieldSelector"),
    Row(
        "field-unescaped-equals",
        P + "?fieldSelector=metadata.name%3Da%3Db",
        400,
        param="fieldSelector",
    ),
    Row("field-bad-escape", P + "?fieldSelector=metadata.name%3Da%5Cx", 400, param="fieldSelector"),
    Row("field-unsupported", P + "?fieldSelector=spec.bogus%3Dx", 400),
    Row("watch-field-unsupported", W + "&fieldSelector=spec.bogus%3Dx", 400),
    Row("field-unsupported-for-kind", CM + "?fieldSelector=spec.nodeName%3Dn1", 400),
    Row("field-double-equals", P + "?fieldSelector=metadata.name%3D%3Dx", 200),
    Row("field-escaped-comma", P + "?fieldSelector=metadata.name%3Da%5C,b", 200),
    Row("field-lone-comma", P + "?fieldSelector=,", 200),
    Row("field-supported", W + "&fieldSelector=spec.nodeName%3Dn1", 200, stream=True),
    # --- parameters that are ignored or judged later by the apiserver ----------------------
    Row("unknown-parameter", P + "?bogusParam=1", 200),
    Row("watch-unknown-parameter", W + "&bogusParam=1", 200, stream=True),
    Row("pretty-maybe", P + "?pretty=maybe", 200),
    Row("include-object-bogus", P + "?includeObject=Bogus", 200),
    Row("timeout-bad-duration", P + "?timeout=abc", 400),
    Row("rv0-timeout-bad-duration", P + "?resourceVersion=0&timeout=abc", 400),
    Row("timeout-good-duration", P + "?timeout=1m30s", 200),
    Row("watch-timeout-bad-duration", W + "&timeout=abc", 200, stream=True),
    # --- list options are read only where the apiserver reads them ----------------------
    Row("named-get-watch", CM + "/cm1?watch=1", 200),
    Row("named-get-watch-maybe", CM + "/cm1?watch=maybe&timeoutSeconds=1", 200),
    Row("named-get-bad-timeout", CM + "/cm1?timeoutSeconds=x", 200),
    Row("named-get-bad-limit", CM + "/cm1?limit=abc", 200),
    Row("named-get-bad-selector", CM + "/cm1?labelSelector=!", 200),
    Row(
        "legacy-watch-named",
        "/api/v1/watch/namespaces/default/configmaps/cm1?timeoutSeconds=1",
        200,
        stream=True,
    ),
    Row(
        "legacy-watch-bad-timeout",
        "/api/v1/watch/namespaces/default/configmaps/cm1?timeoutSeconds=x",
        400,
        param="timeoutSeconds",
    ),
    Row(
        "legacy-watch-ignores-watch-0",
        "/api/v1/watch/namespaces/default/configmaps?watch=0&timeoutSeconds=1",
        200,
        stream=True,
    ),
    Row(
        "deletecollection-bad-limit",
        CM + "?limit=abc&dryRun=All",
        400,
        method="DELETE",
        param="limit",
    ),
    Row(
        "deletecollection-bad-selector",
        CM + "?labelSelector=!&dryRun=All",
        400,
        method="DELETE",
        param="labelSelector",
    ),
    Row(
        "deletecollection-bad-match",
        CM + "?resourceVersionMatch=Bogus&resourceVersion=1&dryRun=All",
        422,
        method="DELETE",
        param="resourceVersionMatch",
    ),
    Row(
        "group-bad-limit",
        "/apis/apps/v1/namespaces/default/deployments?limit=x",
        400,
        param="limit",
    ),
    Row(
        "group-watch-maybe-slash",
        "/apis/apps/v1/deployments/?watch=maybe&timeoutSeconds=1",
        200,
        stream=True,
    ),
]

CM1 = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1"}, "data": {"a": "b"}}


def _raw(row: Row, *, token: str | None = None) -> bytes:
    headers = [] if token is None else [("Authorization", f"Bearer {token}")]
    return request(row.method, row.target, headers=headers)


def _check_answer(row: Row, answer: Answer, expected: int, where: str) -> None:
    assert answer.status == expected, (where, row.id, answer.status, answer.body[:300])
    if answer.status != 200:
        return
    chunked = answer.headers.get("transfer-encoding", "").lower() == "chunked"
    if row.stream:
        assert chunked and "content-length" not in answer.headers, (where, row.id)
    else:
        assert not chunked, (where, row.id, "a list or object, not a watch stream")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    async with running_proxy(tmp_path_factory.mktemp("parity")) as proxy:
        proxy.fake.store.create("configmaps", "default", CM1)
        yield proxy


async def test_the_table_is_large_enough() -> None:
    assert len(ROWS) >= 40
    assert len({row.id for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_the_proxy_answers_as_the_apiserver(running: Running, row: Row) -> None:
    running.fake.stats.reset()
    answer = await send_raw(running.proxy.api_port, _raw(row), head_only=row.stream)
    _check_answer(row, answer, row.proxy_status, "proxy")
    assert answer.status < 500
    if answer.status >= 400:
        status = answer.status_object
        assert status is not None and status["kind"] == "Status", answer.body[:300]
        assert status["code"] == answer.status
        if row.param is not None:
            assert row.param in status["message"], status["message"]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_the_fake_answers_as_the_apiserver(running: Running, row: Row) -> None:
    fake = running.fake
    answer = await send_raw(
        fake.port,
        _raw(row, token=fake.token),
        ssl_context=fake.client_ssl_context(),
        head_only=row.stream,
    )
    _check_answer(row, answer, row.fake_status, "fake")


async def test_a_trailing_slash_does_not_escape_an_access_rule(tmp_path: Any) -> None:
    """The apiserver serves ``.../secrets/`` as ``.../secrets``: a deny rule for one is for both."""
    rules = [{"action": "deny", "path": "/api/v1/namespaces/*/secrets"}]
    async with running_proxy(tmp_path, {"security.rules": rules}) as proxy:
        for target in ("/api/v1/namespaces/default/secrets", "/api/v1/namespaces/default/secrets/"):
            answer = await send_raw(proxy.proxy.api_port, request("GET", target))
            assert answer.status == 403, (target, answer.body[:200])
        reached = [r.path for r in proxy.fake.stats.requests if "secrets" in r.path]
        assert reached == []
