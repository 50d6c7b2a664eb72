"""The fast lane's request heads: plain messages parse; every doubt goes to aiohttp's server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchproxy.server.requesthead import NotSimple, parse_request_head

PLAIN = (
    b"PATCH /api/v1/namespaces/default/configmaps/x?fieldManager=me HTTP/1.1\r\n"
    b"Host: 127.0.0.1:8001\r\n"
    b"User-Agent: kubectl/v1.33.0\r\n"
    b"Content-Type: application/merge-patch+json\r\n"
    b"Content-Length: 17\r\n"
    b"Accept-Encoding: gzip\r\n"
    b"\r\n"
)


def test_a_plain_request_parses_with_its_body_length_and_headers() -> None:
    head = parse_request_head(PLAIN + b'{"data":{"a":"b"}}')
    assert head is not None
    assert head.method == "PATCH"
    assert head.target == "/api/v1/namespaces/default/configmaps/x?fieldManager=me"
    assert head.head_length == len(PLAIN)
    assert head.body_length == 17
    assert head.headers["content-type"] == "application/merge-patch+json"
    assert head.headers.getall("Host") == ["127.0.0.1:8001"]


def test_a_head_without_its_blank_line_is_incomplete() -> None:
    assert parse_request_head(PLAIN[:-2]) is None
    assert parse_request_head(b"") is None
    assert parse_request_head(b"GET / HT") is None


def test_no_content_length_is_no_body() -> None:
    head = parse_request_head(b"GET /api HTTP/1.1\r\nHost: a\r\n\r\n")
    assert head is not None and head.body_length == 0


def test_header_values_lose_surrounding_whitespace_only() -> None:
    head = parse_request_head(b"GET /api HTTP/1.1\r\nHost: a\r\nX-A: \t one two \t\r\n\r\n")
    assert head is not None and head.headers["X-A"] == "one two"


@pytest.mark.parametrize(
    "message",
    [
        # Framing that aiohttp owns: chunked bodies, several or bad lengths, 100-continue.
        b"POST /api HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        b"POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
        b"POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 3 3\r\n\r\n",
        b"POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 1234567890123456\r\n\r\n",
        b"POST /api HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
        # Connections that end or change protocol.
        b"GET /api HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        b"GET /api HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: h2c\r\n\r\n",
        b"GET /api HTTP/1.0\r\nHost: a\r\n\r\n",
        b"GET /api HTTP/2.0\r\nHost: a\r\n\r\n",
        # Smuggling shapes: folded lines, spaces before the colon, control bytes, bare LF.
        b"GET /api HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
        b"GET /api HTTP/1.1\r\nHost: a\r\nContent-Length : 3\r\n\r\n",
        b"GET /api HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n",
        b"GET /api HTTP/1.1\r\nHost: a\r\nX-A: b\nContent-Length: 3\r\n\r\n",
        b"GET /api HTTP/1.1\r\nHost: a\r\nX-A: caf\xc3\xa9\r\n\r\n",
        b"GET /api HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n",
        # Hosts: none or two.
        b"GET /api HTTP/1.1\r\nX-A: b\r\n\r\n",
        b"GET /api HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        # Targets and methods the fast lane does not serve.
        b"GET http://a/api HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET * HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
        b"HEAD /api HTTP/1.1\r\nHost: a\r\n\r\n",
        b"OPTIONS /api HTTP/1.1\r\nHost: a\r\n\r\n",
        b"get /api HTTP/1.1\r\nHost: a\r\n\r\n",
        # Over aiohttp's line limit.
        b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    ],
)
def test_whatever_is_not_plain_goes_to_aiohttp(message: bytes) -> None:
    with pytest.raises(NotSimple):
        parse_request_head(message)


def test_a_head_that_never_ends_goes_to_aiohttp() -> None:
    with pytest.raises(NotSimple):
        parse_request_head(b"GET /api HTTP/1.1\r\nHost: a\r\n" + b"X-A: b\r\n" * 10_000)


_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)


@given(fields=st.lists(st.tuples(_TOKEN, _VALUE), max_size=20), body=st.binary(max_size=64))
def test_any_plain_head_parses_to_what_was_sent(fields: list[tuple[str, str]], body: bytes) -> None:
    fields = [(n, v) for n, v in fields if n.lower() not in ("host", "content-length")]
    fields = [(n, v) for n, v in fields if n.lower() not in ("transfer-encoding", "upgrade")]
    fields = [(n, v) for n, v in fields if n.lower() not in ("expect", "te", "connection")]
    lines = [f"{name}: {value}" for name, value in fields]
    head = "\r\n".join(["POST /x HTTP/1.1", "Host: h", *lines, f"Content-Length: {len(body)}"])
    raw = head.encode() + b"\r\n\r\n"
    parsed = parse_request_head(raw + body)
    assert parsed is not None
    assert parsed.head_length == len(raw) and parsed.body_length == len(body)
    assert [(n, v) for n, v in parsed.headers.items()][1:-1] == fields


def test_a_kept_header_block_is_shared_read_only_and_each_request_line_still_checked() -> None:
    lines = b"Host: 127.0.0.1\r\nUser-Agent: kept/1.0\r\nContent-Length: 2\r\n\r\n"
    first = parse_request_head(b"PATCH /api/v1/namespaces/a/configmaps/x HTTP/1.1\r\n" + lines)
    second = parse_request_head(b"POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\n" + lines)
    assert first is not None and second is not None
    assert first.headers is second.headers and second.body_length == 2
    assert (second.method, second.target) == ("POST", "/api/v1/namespaces/a/configmaps")
    with pytest.raises(TypeError):
        first.headers["Authorization"] = "Bearer x"  # type: ignore[index]
    for line in (b"OPTIONS / HTTP/1.1", b"GET / HTTP/1.0", b"GET  / HTTP/1.1", b"GET x HTTP/1.1"):
        with pytest.raises(NotSimple):
            parse_request_head(line + b"\r\n" + lines)
