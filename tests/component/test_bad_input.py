"""Hostile and malformed requests through the real proxy: a clear 4xx, never a 500, no crash.

One table, one row per request. Each row is sent as raw bytes over a socket (so that requests
aiohttp's client refuses to build can be sent too) and says what the proxy must answer, whether
the request may reach the upstream at all, and — where the proxy answers for itself a request
the apiserver would also judge — what the fake apiserver says when asked directly. Differences
between the two are deliberate and noted on the row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.harness import Running, running_proxy

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_BODY = 64 * 1024
PODS = "/api/v1/namespaces/default/pods"
WATCH = PODS + "?watch=true"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


@dataclass(frozen=True)
class Case:
    """One hostile request and what must come back.

    ``reason`` None: the answer is aiohttp's own parser error (plain text, not a Status).
    ``upstream``: True — the request must be forwarded; False — nothing may reach the fake.
    ``direct``: the status the fake apiserver gives the same request (None: not compared).
    """

    id: str
    raw: bytes
    status: int
    reason: str | None
    upstream: bool
    direct: int | None = None
    note: str = ""


def request(
    method: str,
    target: str,
    *,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    host: str | None = "127.0.0.1",
) -> bytes:
    """An HTTP/1.1 request, byte for byte as given (no normalisation, Connection: close)."""
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    names = {name.lower() for name, _ in headers or []}
    lines.extend(f"{name}: {value}" for name, value in headers or [])
    if body and "content-length" not in names and "transfer-encoding" not in names:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(body: bytes, size: int = 8192) -> bytes:
    out = b""
    for start in range(0, len(body), size):
        piece = body[start : start + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def get(target: str, **kwargs: Any) -> bytes:
    return request("GET", target, **kwargs)


UPGRADE = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]
JSON = [("Content-Type", "application/json")]

CASES: list[Case] = [
    # --- non-canonical paths: refused by the path check, never normalised -------------------
    Case("dotdot", get(PODS + "/../../kube-system/secrets"), 400, "BadRequest", False, 404),
    Case(
        "dotdot-encoded",
        get("/api/v1/namespaces/default/%2e%2e/secrets"),
        400,
        "BadRequest",
        False,
        404,
    ),
    Case(
        "dotdot-encoded-upper",
        get("/api/v1/namespaces/%2E%2E/kube-system/secrets"),
        400,
        "BadRequest",
        False,
    ),
    Case("dot-segment", get("/api/v1/namespaces/./default/pods"), 400, "BadRequest", False),
    Case("double-slash", get("/api/v1//namespaces/default/pods"), 400, "BadRequest", False),
    Case("leading-double-slash", get("//api/v1/pods"), 400, "BadRequest", False),
    Case("encoded-slash", get("/api/v1/namespaces/default%2Fsecrets"), 400, "BadRequest", False),
    Case(
        "encoded-backslash",
        get("/api/v1/namespaces/default%5C..%5Csecrets"),
        400,
        "BadRequest",
        False,
    ),
    Case("raw-backslash", get("/api/v1/namespaces\\default/pods"), 400, "BadRequest", False),
    Case("encoded-nul", get("/api/v1/namespaces/default%00/pods"), 400, "BadRequest", False),
    Case(
        "encoded-percent", get("/api/v1/namespaces/default%252Fsecrets"), 400, "BadRequest", False
    ),
    Case("bad-escape", get("/api/v1/namespaces/de%zzfault/pods"), 400, "BadRequest", False),
    Case("non-utf8-escape", get("/api/v1/namespaces/%ff/pods"), 400, "BadRequest", False),
    Case(
        "raw-nul",
        b"GET /api/v1/namespaces/default\x00/pods HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Connection: close\r\n\r\n",
        400,
        None,
        False,
        note="aiohttp's parser refuses a raw NUL before any handler runs",
    ),
    # --- watch and list query values that do not decode ------------------------------------
    Case("rv-abc", get(WATCH + "&resourceVersion=abc"), 400, "BadRequest", False, 400),
    Case("rv-negative", get(WATCH + "&resourceVersion=-1"), 400, "BadRequest", False, 400),
    Case(
        "rv-too-big", get(WATCH + "&resourceVersion=18446744073709551616"), 400, "BadRequest", False
    ),
    # A negative timeoutSeconds is valid (the watch ends at once): see test_apiserver_parity.
    Case("timeout-not-a-number", get(WATCH + "&timeoutSeconds=x"), 400, "BadRequest", False, 400),
    Case("label-open-set", get(WATCH + "&labelSelector=a%20in%20("), 400, "BadRequest", False, 400),
    Case("label-bang", get(WATCH + "&labelSelector=!"), 400, "BadRequest", False, 400),
    Case(
        "label-double-equals",
        get(WATCH + "&labelSelector=a%3Db%3Dc"),
        400,
        "BadRequest",
        False,
        400,
    ),
    Case("label-bad-key", get(PODS + "?labelSelector=-a%3Db"), 400, "BadRequest", False, 400),
    Case(
        "field-no-operator",
        get(WATCH + "&fieldSelector=metadata.name"),
        400,
        "BadRequest",
        False,
        400,
    ),
    Case(
        "field-unescaped-equals",
        get(WATCH + "&fieldSelector=metadata.name%3Da%3Db"),
        400,
        "BadRequest",
        False,
        400,
    ),
    Case(
        "field-bad-escape",
        get(WATCH + "&fieldSelector=metadata.name%3Da%5Cx"),
        400,
        "BadRequest",
        False,
        400,
    ),
    Case(
        "sie-without-match",
        get(WATCH + "&sendInitialEvents=true&allowWatchBookmarks=true"),
        422,
        "Invalid",
        False,
        422,
    ),
    Case(
        "sie-with-exact",
        get(WATCH + "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=Exact"),
        422,
        "Invalid",
        False,
        422,
    ),
    Case(
        "match-without-sie",
        get(WATCH + "&resourceVersionMatch=NotOlderThan"),
        422,
        "Invalid",
        False,
        422,
    ),
    Case("sie-on-list", get(PODS + "?sendInitialEvents=true"), 422, "Invalid", False),
    Case("limit-not-a-number", get(PODS + "?limit=abc"), 400, "BadRequest", False),
    Case("limit-float", get(PODS + "?limit=1e3"), 400, "BadRequest", False),
    Case(
        "legacy-watch-path-bad-rv",
        get("/api/v1/watch/namespaces/default/pods?resourceVersion=abc"),
        400,
        "BadRequest",
        False,
    ),
    # --- bodies --------------------------------------------------------------------------------
    Case(
        "body-declared-too-large",
        request(
            "POST",
            CONFIGMAPS,
            headers=[*JSON, ("Content-Length", str(MAX_BODY + 1))],
            body=b"{" * 1024,
        ),
        413,
        "RequestEntityTooLarge",
        False,
    ),
    Case(
        "body-chunked-too-large",
        request(
            "POST",
            CONFIGMAPS,
            headers=[*JSON, ("Transfer-Encoding", "chunked")],
            body=chunked(b"x" * (MAX_BODY + 10_000)),
        ),
        413,
        "RequestEntityTooLarge",
        False,
    ),
    Case(
        "malformed-json",
        request("POST", CONFIGMAPS, headers=JSON, body=b'{"metadata": {'),
        400,
        "BadRequest",
        True,
        note="the upstream's own 400 passes through",
    ),
    Case("unknown-resource", get("/api/v1/namespaces/default/widgets"), 404, "NotFound", True),
    Case("unknown-group", get("/apis/nope.example.com/v1/things"), 404, "NotFound", True),
    Case(
        "webdav-method",
        request("PROPFIND", PODS),
        405,
        "MethodNotAllowed",
        True,
        note="a method the parser knows but Kubernetes does not: the upstream's 405",
    ),
    Case(
        "unknown-method",
        request("FROB", PODS),
        400,
        None,
        False,
        note="llhttp refuses methods it does not know",
    ),
    # --- who is asking ------------------------------------------------------------------------
    Case("foreign-host", get(PODS, host="evil.example"), 403, "Forbidden", False),
    Case("host-suffix", get(PODS, host="127.0.0.1.evil.example"), 403, "Forbidden", False),
    Case("host-userinfo", get(PODS, host="localhost@evil.example"), 403, "Forbidden", False),
    Case(
        "no-host",
        get(PODS, host=None),
        400,
        None,
        False,
        note="HTTP/1.1 without Host: aiohttp's parser refuses it",
    ),
    Case("no-host-http10", b"GET " + PODS.encode() + b" HTTP/1.0\r\n\r\n", 403, "Forbidden", False),
    Case("empty-host", get(PODS, host=""), 403, "Forbidden", False),
    # --- upgrades on exec/attach/portforward go upstream, whatever the protocol; the
    # apiserver's answer (here: no X-Stream-Protocol-Version to agree on) comes back as is --
    Case(
        "exec-upgrade",
        request("POST", PODS + "/p/exec?command=ls&stdout=true", headers=UPGRADE),
        400,
        "BadRequest",
        True,
        400,
    ),
    Case(
        "attach-no-upgrade-header",
        request("POST", PODS + "/p/attach"),
        400,
        "BadRequest",
        True,
        400,
    ),
    Case(
        "portforward",
        get(PODS + "/p/portforward?ports=80", headers=UPGRADE),
        400,
        "BadRequest",
        True,
        400,
    ),
    Case(
        "exec-upgrade-with-body",
        request("POST", PODS + "/p/exec?command=ls", headers=UPGRADE, body=b"{}"),
        400,
        "BadRequest",
        False,
    ),
    Case(
        "websocket-on-list",
        get(PODS, headers=[("Connection", "Upgrade"), ("Upgrade", "websocket")]),
        400,
        "BadRequest",
        False,
    ),
    # --- request smuggling: aiohttp's parser answers 400, nothing reaches the upstream -------
    Case(
        "cl-and-te",
        request(
            "POST",
            CONFIGMAPS,
            headers=[("Content-Length", "4"), ("Transfer-Encoding", "chunked")],
            body=b"0\r\n\r\n",
        ),
        400,
        None,
        False,
    ),
    Case(
        "duplicate-cl",
        request(
            "POST",
            CONFIGMAPS,
            headers=[("Content-Length", "2"), ("Content-Length", "3")],
            body=b"{}x",
        ),
        400,
        None,
        False,
    ),
    Case(
        "duplicate-cl-same",
        request(
            "POST",
            CONFIGMAPS,
            headers=[("Content-Length", "2"), ("Content-Length", "2")],
            body=b"{}",
        ),
        400,
        None,
        False,
    ),
    Case(
        "te-not-chunked",
        request("POST", CONFIGMAPS, headers=[("Transfer-Encoding", "gzip")], body=b"{}"),
        400,
        None,
        False,
    ),
    Case(
        "te-chunked-then-other",
        request(
            "POST",
            CONFIGMAPS,
            headers=[("Transfer-Encoding", "chunked, identity")],
            body=chunked(b"{}"),
        ),
        400,
        None,
        False,
    ),
    Case(
        "cl-with-sign",
        request("POST", CONFIGMAPS, headers=[("Content-Length", "+2")], body=b"{}"),
        400,
        None,
        False,
    ),
    Case(
        "bad-chunk-size",
        request(
            "POST",
            CONFIGMAPS,
            headers=[("Transfer-Encoding", "chunked")],
            body=b"zz\r\n{}\r\n0\r\n\r\n",
        ),
        400,
        None,
        False,
    ),
    Case(
        "obs-fold",
        b"GET " + PODS.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"X-Folded: a\r\n b\r\nConnection: close\r\n\r\n",
        400,
        None,
        False,
    ),
    Case(
        "space-before-colon",
        b"GET " + PODS.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding : chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
        400,
        None,
        False,
    ),
    Case(
        "bare-lf-request-line",
        b"GET " + PODS.encode() + b" HTTP/1.1\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        400,
        None,
        False,
    ),
    Case("over-long-header", get(PODS, headers=[("X-Long", "a" * 20_000)]), 400, None, False),
    Case("over-long-target", get(PODS + "?labelSelector=" + "a" * 20_000), 400, None, False),
    Case(
        "http10-transfer-encoding",
        b"POST " + CONFIGMAPS.encode() + b" HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'1b\r\n{"metadata":{"name":"te10"}}\r\n0\r\n\r\n',
        400,
        "BadRequest",
        False,
        note="RFC 9112 section 6.1: the framing of such a message is faulty",
    ),
]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    status_object: dict[str, Any] | None = field(default=None)


def _head(data: bytes) -> tuple[int, dict[str, str]]:
    lines = data.decode("latin-1").split("\r\n")
    assert lines and lines[0].startswith("HTTP/1."), data[:200]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(" ", 2)[1]), headers


def _dechunk(rest: bytes) -> bytes | None:
    """The body of a complete chunked message, None while incomplete."""
    body = b""
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return None
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return body
        if len(rest) < size + 2:
            return None
        body, rest = body + rest[:size], rest[size + 2 :]


def parse_answer(data: bytes, *, eof: bool, head_only: bool = False) -> Answer | None:
    """The answer in ``data`` once it is complete (None: read more)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        assert not eof, data[:200]
        return None
    status, headers = _head(head)
    body: bytes | None = b""
    if head_only:
        pass
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(rest)
    elif "content-length" in headers:
        length = int(headers["content-length"])
        body = rest[:length] if len(rest) >= length else None
    elif eof:
        body = rest
    else:
        body = None
    if body is None:
        assert not eof, data[:300]
        return None
    answer = Answer(status, headers, body)
    if headers.get("content-type", "").startswith("application/json") and body:
        answer.status_object = json.loads(body)
    return answer


async def send_raw(
    port: int, raw: bytes, *, ssl_context: ssl.SSLContext | None = None, head_only: bool = False
) -> Answer:
    """Write ``raw`` and read one answer: to its end (or its headers only, for a stream)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_context)
    try:
        writer.write(raw)
        with contextlib.suppress(ConnectionError):
            await writer.drain()  # the server may answer and close before reading it all
        data = b""
        async with asyncio.timeout(10):
            while True:
                try:
                    chunk = await reader.read(65536)
                except ConnectionError:
                    chunk = b""
                data += chunk
                answer = parse_answer(data, eof=not chunk, head_only=head_only)
                if answer is not None:
                    return answer
    finally:
        writer.close()
        # A TLS connection's shutdown ends later; wait so that no transport outlives the test.
        with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
            await asyncio.wait_for(writer.wait_closed(), 5)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    tmp = tmp_path_factory.mktemp("bad-input")
    async with running_proxy(tmp, {"limits.max_body_bytes": MAX_BODY}) as proxy:
        proxy.fake.store.create(
            "pods",
            "default",
            {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        )
        yield proxy


async def still_serving(running: Running) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(running.url + PODS, timeout=aiohttp.ClientTimeout(total=5)) as response,
    ):
        assert response.status == 200
        assert (await response.json())["kind"] == "PodList"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_bad_request_gets_a_clear_4xx(running: Running, case: Case) -> None:
    running.fake.stats.reset()
    answer = await send_raw(running.proxy.api_port, case.raw)
    assert answer.status == case.status, (case.id, answer.status, answer.body[:300])
    assert answer.status < 500
    # Every refusal is a Kubernetes Status, even the ones aiohttp's parser makes.
    status = answer.status_object
    assert status is not None, answer.body[:300]
    assert status["kind"] == "Status"
    assert status["code"] == case.status
    assert status["message"]
    if case.reason is not None:
        assert status["reason"] == case.reason
    reached = [r for r in running.fake.stats.requests if r.path != "/readyz"]
    if case.upstream:
        assert reached, "the request should have been passed to the upstream"
    else:
        assert not reached, [(r.method, r.path) for r in reached]
    await still_serving(running)


DIRECT = [c for c in CASES if c.direct is not None]


@pytest.mark.parametrize("case", DIRECT, ids=[c.id for c in DIRECT])
async def test_the_fake_apiserver_judges_the_same_request(running: Running, case: Case) -> None:
    """What the apiserver (the fake) says to the same request, asked directly with the token.

    A path the proxy refuses as non-canonical is one the apiserver normalises (and then does not
    find): the proxy's 400 is stricter on purpose. Query values: see each row's note.
    """
    fake = running.fake
    raw = case.raw.replace(
        b"Connection: close", f"Authorization: Bearer {fake.token}\r\nConnection: close".encode()
    )
    answer = await send_raw(
        fake.port, raw, ssl_context=fake.client_ssl_context(), head_only=case.direct == 200
    )
    assert answer.status == case.direct, (case.id, answer.status, answer.body[:300])


async def test_client_identity_headers_are_stripped(running: Running) -> None:
    running.fake.stats.reset()
    raw = get(
        PODS,
        headers=[
            ("Authorization", "Bearer client-secret"),
            ("Authorization", "Basic cm9vdDpyb290"),
            ("X-Remote-User", "root"),
            ("X-Remote-Group", "system:masters"),
            ("Connection", "Impersonate-User"),
        ],
    )
    answer = await send_raw(running.proxy.api_port, raw)
    assert answer.status == 200
    [record] = [r for r in running.fake.stats.requests if r.path == PODS]
    sent = {k.lower(): v for k, v in record.headers.items()}
    assert sent["authorization"] == f"Bearer {running.fake.token}"
    assert not [k for k in sent if k.startswith(("impersonate-", "x-remote-"))]
    assert "client-secret" not in json.dumps(record.headers)


async def test_impersonation_is_refused_not_dropped(running: Running) -> None:
    """Dropping Impersonate-* would run the request as the proxy's identity, with more rights
    than a client that asked to act as someone less privileged meant: refused by default."""
    running.fake.stats.reset()
    for name, value in [
        ("Impersonate-User", "system:admin"),
        ("Impersonate-Group", "system:masters"),
        ("Impersonate-Uid", "0"),
        ("Impersonate-Extra-Scopes", "all"),
    ]:
        answer = await send_raw(running.proxy.api_port, get(PODS, headers=[(name, value)]))
        assert answer.status == 403, (name, answer.body[:200])
        status = json.loads(answer.body)
        assert status["reason"] == "Forbidden" and name in status["message"]
    assert not [r for r in running.fake.stats.requests if r.path == PODS]


async def test_the_proxy_never_answered_500(running: Running) -> None:
    await still_serving(running)
    codes = {
        sample.labels["code"]
        for metric in running.proxy.metrics.requests.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }
    assert not [c for c in codes if c.startswith("5")], codes


async def test_http10_with_transfer_encoding_closes_the_connection(running: Running) -> None:
    """Refused, and nothing after it on the connection is read as a request (RFC 9112 6.1):
    an HTTP/1.0 peer in front would have framed the body differently."""
    running.fake.stats.reset()
    behind = b"DELETE " + CONFIGMAPS.encode() + b"/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    raw = (
        b"POST " + CONFIGMAPS.encode() + b" HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        b"Connection: keep-alive\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" + behind
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)  # to the end: the proxy closes
    finally:
        writer.close()
    assert data.startswith(b"HTTP/1.0 400 ") or data.startswith(b"HTTP/1.1 400 "), data[:200]
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert len(body) == length, data  # one answer only: the DELETE behind it was not read
    assert b"Transfer-Encoding" in body
    assert not [r for r in running.fake.stats.requests if r.path.startswith(CONFIGMAPS)]


async def test_obs_text_header_values_reach_the_apiserver_as_sent(running: Running) -> None:
    """Bytes 0x80-0xFF in a field value (obs-text, RFC 9110 5.5) are the apiserver's to judge,
    and it accepts them: they pass through byte for byte, UTF-8 or not."""
    running.fake.stats.reset()
    values = {"X-Latin": b"caf\xe9", "X-Utf8": b"caf\xc3\xa9", "X-Mixed": b"\xff\x80 ok \xc3"}
    raw = (
        b"GET "
        + PODS.encode()
        + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"".join(name.encode() + b": " + value + b"\r\n" for name, value in values.items())
        + b"Connection: close\r\n\r\n"
    )
    answer = await send_raw(running.proxy.api_port, raw)
    assert answer.status == 200, answer.body[:300]
    [record] = [r for r in running.fake.stats.requests if r.path == PODS]
    # The fake is an aiohttp server too: its parser decodes as the proxy's does.
    arrived = {name: record.headers[name].encode("utf-8", "surrogateescape") for name in values}
    assert arrived == values


async def test_a_chunked_bodys_trailer_never_becomes_the_next_requests_header(
    running: Running,
) -> None:
    """aiohttp's C parser hands a chunked body's trailer fields to the next request on the
    connection as its headers (found by tests/unit/test_parser_differential.py): the proxy
    answers a chunked request and closes, so the request pipelined behind it is never read."""
    running.fake.stats.reset()
    body = b'{"metadata": {"name": "trailer"}}'
    raw = (
        b"POST " + CONFIGMAPS.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%b\r\n0\r\nX-Smuggled: yes\r\n\r\n" % (len(body), body)
        + b"GET "
        + PODS.encode()
        + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)  # to the end: the proxy closes
    finally:
        writer.close()
    assert data.startswith(b"HTTP/1.1 201 "), data[:200]
    assert data.count(b"HTTP/1.1 ") == 1, data
    reached = [r for r in running.fake.stats.requests if r.path != "/readyz"]
    assert [(r.method, r.path) for r in reached] == [("POST", CONFIGMAPS)]
    assert not [r for r in reached if "X-Smuggled" in r.headers]
