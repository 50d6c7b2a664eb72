"""Which headers cross the proxy, in each direction."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

# A request's or an answer's header block, as llhttp's callbacks fill it (CIMultiDict) or
# read-only as kept for the next request with the same lines (CIMultiDictProxy).
Headers = CIMultiDictProxy[str] | CIMultiDict[str]

# RFC 9110 hop-by-hop headers, plus the ones aiohttp recomputes for the new message.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
    }
)

# A client's own identity claims. Authorization goes upstream only in forward identity mode;
# Impersonate-* only with security.impersonation: forward; X-Remote-* never (the apiserver reads
# them only from an authenticating front proxy, which watchproxy is not).
IMPERSONATE_PREFIX = "impersonate-"


def impersonates(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> bool:
    """Whether the request asks to act as someone else (any ``Impersonate-*`` header)."""
    # One search of all the names at once (every request is asked this): a name starts with
    # the prefix exactly when the prefix follows a line break in the joined, lowered names.
    return "\nimpersonate-" in "\n" + "\n".join(headers).lower()


def _dropped(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> frozenset[str]:
    """Hop-by-hop names, plus those the request's ``Connection`` header lists."""
    values = headers.getall("Connection", None)
    if values is None:
        return HOP_BY_HOP
    tokens = {t.strip().lower() for value in values for t in value.split(",")}
    return HOP_BY_HOP | tokens - {""}


def request_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str],
    *,
    forward_identity: bool = False,
    forward_impersonation: bool = False,
) -> CIMultiDict[str]:
    """Client request headers to send upstream: no hop-by-hop, no client identity by default.

    Each value goes upstream as the bytes the client sent (``wire_value``)."""
    drop = _dropped(headers)
    if not forward_identity:
        drop = drop | _AUTHORIZATION
    identity_prefixes = _REMOTE if forward_impersonation else _REMOTE_AND_IMPERSONATE
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in drop or lowered.startswith(identity_prefixes):
            continue
        out.add(name, value if value.isascii() else wire_value(value))
    return out


def wire_value(value: str) -> str:
    """A client's header value as the upstream encoder writes it: one character per byte
    (latin-1), the bytes the client sent.

    Field values may hold obs-text, bytes 0x80-0xFF (RFC 9110 section 5.5), and the apiserver
    (Go's net/http) accepts them as they are. The API port's protocol (``server.protocol``)
    hands a value over decoded as UTF-8, each byte that is not UTF-8 kept as a surrogate
    escape: ``caf\\xe9`` arrives as ``"caf\\udce9"``, ``caf\\xc3\\xa9`` as ``"café"``. Encoding
    that back the same way gives the client's bytes; written as latin-1 (``upstream.http1``)
    they go out unchanged."""
    return value.encode("utf-8", "surrogateescape").decode("latin-1")


def response_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], *, keep_length: bool
) -> CIMultiDict[str]:
    """Upstream response headers to give the client (Warning, Audit-Id, X-Kubernetes-PF-* pass)."""
    drop = _dropped(headers)
    if keep_length:
        drop = drop - _CONTENT_LENGTH
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    return out


_AUTHORIZATION = frozenset({"authorization"})
_CONTENT_LENGTH = frozenset({"content-length"})
_REMOTE = ("x-remote-",)
_REMOTE_AND_IMPERSONATE = ("x-remote-", IMPERSONATE_PREFIX)


def forwarded_credential(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], forward_identity: bool
) -> str | None:
    """The credential a request carries upstream in forward mode, None in the default mode.

    Forward mode passes the client's own ``Authorization``, or "" when it sent none (the
    request then goes upstream anonymous) — never the proxy's own credential. The value is in
    the upstream encoder's form (``wire_value``), the bytes the client sent: the server's form
    (surrogate escapes for obs-text) cannot be written as latin-1, and every request that
    carried such a credential failed with a 400 of ours instead of the apiserver's 401.
    """
    if not forward_identity:
        return None
    value = headers.get("Authorization", "")
    return value if value.isascii() else wire_value(value)
