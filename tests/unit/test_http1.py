"""The HTTP/1.1 response parser: framing by the rules of RFC 9112, fed in every split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from watchproxy.kube.headers import HOP_BY_HOP
from watchproxy.upstream.http1 import (
    EndOfMessage,
    Event,
    HeaderBlock,
    ProtocolError,
    ResponseHead,
    ResponseParser,
    encode_fields,
    encode_head,
    parse_head,
    read_head,
)


def parse(data: bytes, *, head_request: bool = False, eof: bool = False) -> list[Event]:
    parser = ResponseParser()
    parser.expect(head_request=head_request)
    events = parser.feed(data)
    if eof:
        events += parser.feed_eof()
    return events


def body_of(events: list[Event]) -> bytes:
    return b"".join(e for e in events if isinstance(e, bytes))


def ends(events: list[Event]) -> list[bool]:
    return [e.reusable for e in events if isinstance(e, EndOfMessage)]


def test_content_length_body_is_delivered_and_the_connection_stays_usable() -> None:
    events = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nAudit-Id: x\r\n\r\nhello")
    head = events[0]
    assert isinstance(head, ResponseHead)
    assert (head.status, head.reason, head.headers["Audit-Id"]) == (200, "OK", "x")
    assert body_of(events) == b"hello"
    assert ends(events) == [True]


def test_chunked_body_with_extensions_and_trailers() -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    events = parse(data)
    assert body_of(events) == b"hello world"
    assert ends(events) == [True]


@given(st.data())
def test_every_split_of_the_bytes_gives_the_same_messages(data: st.DataObject) -> None:
    wire = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"a\r\n0123456789\r\n3\r\nabc\r\n0\r\n\r\n"
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    parser = ResponseParser()
    parser.expect()
    events: list[Event] = []
    start = 0
    for cut in [*cuts, len(wire)]:
        events += parser.feed(wire[start:cut])
        start = cut
    heads = [e for e in events if isinstance(e, ResponseHead)]
    assert [h.status for h in heads] == [201]  # the interim 100 is skipped
    assert body_of(events) == b"0123456789abc"
    assert ends(events) == [True]
    assert parser.idle


def test_no_body_after_head_204_and_304() -> None:
    assert ends(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", head_request=True)) == [
        True
    ]
    assert ends(parse(b"HTTP/1.1 204 No Content\r\n\r\n")) == [True]
    assert ends(parse(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n")) == [True]


def test_a_body_without_length_runs_to_the_close_and_the_connection_is_not_reused() -> None:
    events = parse(b"HTTP/1.1 200 OK\r\n\r\npartial", eof=True)
    assert body_of(events) == b"partial"
    assert ends(events) == [False]


def test_connection_close_and_http10_end_the_connection() -> None:
    assert ends(parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")) == [
        False
    ]
    assert ends(parse(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")) == [False]


def test_two_responses_in_turn_on_one_parser() -> None:
    parser = ResponseParser()
    for body in (b"one", b"second"):
        parser.expect()
        events = parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert body_of(events) == body
        assert parser.idle


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nA: b\r\n\tfolded\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nA : b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n: b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nA: b\nC: d\r\n\r\n",  # a bare LF
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab",  # a byte nobody asked for
    ],
)
def test_malformed_answers_are_protocol_errors(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse(wire)


def test_a_response_cut_mid_body_is_an_error_at_the_close() -> None:
    parser = ResponseParser()
    parser.expect()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(ProtocolError):
        parser.feed_eof()


def test_an_endless_head_is_refused() -> None:
    parser = ResponseParser()
    parser.expect()
    with pytest.raises(ProtocolError):
        parser.feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000)


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


def test_an_apiserver_head_is_parsed_whole() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nAudit-Id: 5b1c\r\nCache-Control: no-cache, private\r\n"
        b"Content-Type: application/json\r\nX-Kubernetes-Pf-Flowschema-Uid: a-b\r\n"
        b"Date: Sat, 05 Dec 2026 23:00:00 GMT\r\nContent-Length: 2\r\n\r\n"
    )
    status, reason, headers, http10 = parse_head(head)
    assert (status, reason, http10) == (200, "OK", False)
    assert headers["cache-control"] == "no-cache, private" and len(headers) == 6


def head_with(*fields: tuple[str, str], version: str = "HTTP/1.1") -> ResponseHead:
    lines = "".join(f"{name}: {value}\r\n" for name, value in fields)
    return read_head(f"{version} 200 OK\r\n{lines}\r\n".encode("latin-1"))


def test_a_head_passes_on_as_it_came_only_without_hop_by_hop_fields() -> None:
    assert head_with(("Content-Type", "a"), ("Content-Length", "3")).passable
    assert head_with(("X-Te", "1"), ("Connectionless", "1"), ("Content-Length", "3")).passable
    # (Transfer-Encoding beside a Content-Length is refused outright, a test above.)
    for name in HOP_BY_HOP - {"content-length", "transfer-encoding"}:
        for spelled in (name, name.title(), name.upper()):
            assert not head_with((spelled, "x"), ("Content-Length", "3")).passable, spelled
    assert not head_with(("Content-Length", "3"), ("content-length", "3")).passable
    assert not head_with(("Content-Type", "a")).passable
    assert not head_with(("Transfer-Encoding", "chunked")).passable
    assert not head_with(("Content-Length", "3"), version="HTTP/1.0").passable


def test_the_fields_are_parsed_when_first_asked_for_and_framing_at_once() -> None:
    head = head_with(("Audit-Id", "a"), ("Content-Length", " 12 "), ("Connection", "Close"))
    assert (head.content_length, head.keep_alive, head.chunked) == (12, False, False)
    assert head._headers is None  # not parsed yet
    assert list(head.headers.items()) == [
        ("Audit-Id", "a"),
        ("Content-Length", "12"),
        ("Connection", "Close"),
    ]
    assert head.headers is head.headers  # parsed once


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["Content-Length", "Audit-Id", "Connection", "X-A", "Date"]),
            st.text(alphabet="abc 019,:\t", max_size=8).map(str.strip),
        ),
        max_size=6,
    )
)
def test_read_fields_are_the_fields_sent(fields: list[tuple[str, str]]) -> None:
    """Whatever the fields, the lazily parsed ones are those sent, values stripped as RFC 9110
    says; and a head is refused exactly when its Content-Length fields disagree or are not
    digits."""
    lengths = [value for name, value in fields if name == "Content-Length"]
    bad = bool(lengths) and (len(set(lengths)) != 1 or not lengths[0].isdigit())
    if bad:
        with pytest.raises(ProtocolError):
            head_with(*fields)
        return
    head = head_with(*fields)
    assert list(head.headers.items()) == [(n, v.strip(" \t")) for n, v in fields]
    assert head.content_length == (int(lengths[0]) if lengths else None)


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
