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

# A client's own identity claims. Authorization goes upstream only in forward identity mode;
# Impersonate-* only with security.impersonation: forward; X-Remote-* never (the apiserver reads
# them only from an authenticating front proxy, which watchproxy is not).
IMPERSONATE_PREFIX = "impersonate-"


def impersonates(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> bool:
    """Whether the request asks to act as someone else (any ``Impersonate-*`` header)."""
    return any(name.lower().startswith(IMPERSONATE_PREFIX) for name in headers)


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    tokens: set[str] = set()
    for value in headers.getall("Connection", []):
        tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def request_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str],
    *,
    forward_identity: bool = False,
    forward_impersonation: bool = False,
) -> CIMultiDict[str]:
    """Client request headers to send upstream: no hop-by-hop, no client identity by default."""
    drop = HOP_BY_HOP | _connection_tokens(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in drop:
            continue
        if lowered == "authorization" and not forward_identity:
            continue
        if lowered.startswith(IMPERSONATE_PREFIX) and not forward_impersonation:
            continue
        if lowered.startswith("x-remote-"):
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
