"""Which headers cross the proxy, in each direction."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

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

# A client's own identity claims: never forwarded in the default identity mode.
IDENTITY_HEADERS = frozenset({"authorization"})
IDENTITY_PREFIXES = ("impersonate-", "x-remote-")


def is_identity_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in IDENTITY_HEADERS or lowered.startswith(IDENTITY_PREFIXES)


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    tokens: set[str] = set()
    for value in headers.getall("Connection", []):
        tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def request_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], *, forward_identity: bool = False
) -> CIMultiDict[str]:
    """Client request headers to send upstream: no hop-by-hop, no client identity by default."""
    drop = HOP_BY_HOP | _connection_tokens(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in drop:
            continue
        if not forward_identity and is_identity_header(lowered):
            continue
        out.add(name, value)
    return out


def response_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], *, keep_length: bool
) -> CIMultiDict[str]:
    """Upstream response headers to give the client (Warning, Audit-Id, X-Kubernetes-PF-* pass)."""
    drop = HOP_BY_HOP | _connection_tokens(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered == "content-length" and keep_length:
            out.add(name, value)
            continue
        if lowered in drop:
            continue
        out.add(name, value)
    return out


def forwarded_credential(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], forward_identity: bool
) -> str | None:
    """The credential a request carries upstream in forward mode, None in the default mode.

    Forward mode passes the client's own ``Authorization``, or "" when it sent none (the
    request then goes upstream anonymous) — never the proxy's own credential.
    """
    if not forward_identity:
        return None
    return headers.get("Authorization", "")
