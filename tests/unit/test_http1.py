"""What watchproxy writes to the apiserver: request heads and whole requests
(watchproxy/upstream/http1.py). How answers are read is tests/component/test_upstream_framing.py."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from watchproxy.upstream.http1 import HeaderBlock, encode_fields, encode_head, encode_request


def test_request_head_refuses_line_breaks_in_headers() -> None:
    head = encode_head("GET", "/api", "h:1", CIMultiDict({"Accept": "application/json"}))
    assert head == b"GET /api HTTP/1.1\r\nHost: h:1\r\nAccept: application/json\r\n\r\n"
    for name, value in [
        ("X", "a\r\nEvil: 1"),
        ("X", "a\nb"),
        ("X", "a\rb"),
        ("X\r\nY", "1"),
        ("X:Y", "1"),
    ]:
        with pytest.raises(ValueError):
            encode_head("GET", "/api", "h", CIMultiDict({"Accept": "a", name: value}))


def test_a_header_block_is_encoded_once_and_sent_as_any_fields_are() -> None:
    fields = CIMultiDict([("Accept", "application/json"), ("User-Agent", "ua")])
    block = HeaderBlock(fields)
    extra = encode_fields({"Authorization": "Bearer t", "Content-Length": "0"})
    sent = encode_head("PATCH", "/api/x", "h:1", block, extra=extra)
    assert sent == encode_head(
        "PATCH", "/api/x", "h:1", CIMultiDict([*fields.items(), ("Authorization", "Bearer t")]),
        extra=encode_fields({"Content-Length": "0"}),
    )  # fmt: skip
    assert block.encoded is block.encoded  # once
    broken = HeaderBlock(CIMultiDict({"X": "a\r\nEvil: 1"}))
    for _ in range(2):  # refused each time it is sent, never kept half-made
        with pytest.raises(ValueError):
            encode_head("GET", "/", "h", broken)


def test_a_request_carries_its_own_credential_and_body_length() -> None:
    """The request's Authorization and Content-Length are its own, whatever the caller's
    fields held; a method that carries a body says Content-Length: 0 without one."""
    fields = CIMultiDict(
        [("Accept", "a"), ("authorization", "Bearer client"), ("Content-Length", "9")]
    )
    sent = encode_request("POST", "/api/x", "h", fields, b"{}", "Bearer proxy")
    assert sent == (
        b"POST /api/x HTTP/1.1\r\nHost: h\r\nAccept: a\r\n"
        b"Authorization: Bearer proxy\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert encode_request("PATCH", "/x", "h", {}, None, None) == (
        b"PATCH /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    )
    assert encode_request("GET", "/x", "h", HeaderBlock({"A": "1"}), None, None) == (
        b"GET /x HTTP/1.1\r\nHost: h\r\nA: 1\r\n\r\n"
    )
    with pytest.raises(ValueError):
        encode_request("GET", "/x", "h", {}, None, "Bearer a\r\nEvil: 1")
