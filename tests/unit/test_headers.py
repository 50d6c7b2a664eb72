"""Which headers cross the proxy, in each direction."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from watchproxy.kube.headers import (
    HOP_BY_HOP,
    impersonates,
    request_headers,
    response_headers,
)


def headers(*pairs: tuple[str, str]) -> CIMultiDict[str]:
    return CIMultiDict(pairs)


def test_requests_lose_hop_by_hop_identity_and_connection_listed_headers() -> None:
    sent = headers(
        ("Host", "127.0.0.1"),
        ("Connection", "keep-alive, X-Private"),
        ("X-Private", "secret"),
        ("Keep-Alive", "timeout=5"),
        ("Authorization", "Bearer client"),
        ("Impersonate-User", "someone"),
        ("X-Remote-User", "admin"),
        ("Accept", "application/json"),
        ("Accept", "application/yaml"),
        ("User-Agent", "kubectl"),
    )
    out = request_headers(sent)
    assert list(out.items()) == [
        ("Accept", "application/json"),
        ("Accept", "application/yaml"),
        ("User-Agent", "kubectl"),
    ]


def test_forward_modes_keep_the_clients_identity_but_never_x_remote() -> None:
    sent = headers(
        ("Authorization", "Bearer client"),
        ("Impersonate-Group", "g"),
        ("X-Remote-Group", "system:masters"),
    )
    out = request_headers(sent, forward_identity=True, forward_impersonation=True)
    assert list(out.items()) == [("Authorization", "Bearer client"), ("Impersonate-Group", "g")]
    assert list(request_headers(sent, forward_identity=True).items()) == [
        ("Authorization", "Bearer client")
    ]


def test_responses_keep_their_length_only_when_asked() -> None:
    answer = headers(
        ("Audit-Id", "1"),
        ("Content-Length", "3"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "close"),
    )
    assert list(response_headers(answer, keep_length=True).items()) == [
        ("Audit-Id", "1"),
        ("Content-Length", "3"),
    ]
    assert list(response_headers(answer, keep_length=False).items()) == [("Audit-Id", "1")]


def test_impersonation_is_any_name_that_starts_with_the_prefix() -> None:
    assert impersonates(headers(("impersonate-extra-scopes", "x")))
    assert impersonates(headers(("Accept", "a"), ("IMPERSONATE-USER", "u")))
    assert not impersonates(headers(("X-Impersonate-User", "u"), ("Impersonate", "u")))
    assert not impersonates(headers())


_OTHERS = ["accept", "audit-id", "authorization", "impersonate-user", "x-remote-user", "x-a"]
_NAMES = st.sampled_from([*sorted(HOP_BY_HOP), *_OTHERS, "te-x"])


@given(st.lists(st.tuples(_NAMES, st.sampled_from(["v", "close", "x-a"])), max_size=12))
def test_request_headers_keep_exactly_what_the_rules_allow(pairs: list[tuple[str, str]]) -> None:
    sent = headers(*pairs)
    listed = {
        token.strip().lower()
        for name, value in pairs
        if name == "connection"
        for token in value.split(",")
    }
    kept = [
        (name, value)
        for name, value in pairs
        if name not in HOP_BY_HOP
        and name not in listed
        and name != "authorization"
        and not name.startswith(("impersonate-", "x-remote-"))
    ]
    assert list(request_headers(sent).items()) == kept
