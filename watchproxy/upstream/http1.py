"""HTTP/1.1 requests as watchproxy writes them to the apiserver: one head, encoded once.

Answers are parsed by llhttp (``upstream.connection``); what is written is simple enough to
write here: a request line, the fields, and the framing of a body read whole.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict

# Methods whose request carries a Content-Length even without a body, as clients send them.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def encode_fields(fields: Mapping[str, str]) -> str:
    """Header lines, each ending in CRLF. A line break in a name or a value would let a client
    add headers of its own choosing upstream: ValueError, before anything is sent."""
    lines = [f"{name}: {value}\r\n" for name, value in fields.items()]
    text = "".join(lines)
    # Checked once, whole: a CR or LF anywhere but at the end of a line is a line break inside
    # a name or a value.
    if text.count("\r") != len(lines) or text.count("\n") != len(lines):
        broken = next(n for n, v in fields.items() if "\r" in n + v or "\n" in n + v)
        raise ValueError(f"header {broken[:40]!r} holds a line break")
    for name in fields:
        if ":" in name:
            raise ValueError(f"header {name[:40]!r} holds a colon")
    return text


def encode_head(
    method: str,
    target: str,
    host: str,
    headers: Mapping[str, str] | HeaderBlock,
    *,
    extra: str = "",
) -> bytes:
    """A request head: its fields, then ``extra`` (lines that end in CRLF, checked by the
    caller). The target is a client's, as its request line held it (no line break can), or
    the proxy's own."""
    fields = headers.encoded if isinstance(headers, HeaderBlock) else encode_fields(headers)
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{fields}{extra}\r\n"
    return head.encode("latin-1")


class HeaderBlock:
    """Request fields that many requests send alike (what goes upstream for a client's
    repeated header lines): read-only, and encoded for the wire once, when first sent."""

    __slots__ = ("_encoded", "fields")

    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields = fields  # never changed once here: the encoding is kept
        self._encoded: str | None = None

    @property
    def encoded(self) -> str:
        if self._encoded is None:
            self._encoded = encode_fields(self.fields)
        return self._encoded


def encode_request(
    method: str,
    target: str,
    host: str,
    headers: Mapping[str, str] | HeaderBlock,
    body: bytes | None,
    auth: str | None,
) -> bytes:
    """A whole request: its head with ``auth`` as its Authorization (None: none) and the body's
    Content-Length, then the body. ValueError when a field holds a line break."""
    extra = ""
    replaced: list[str] = []
    if auth is not None:
        if "\r" in auth or "\n" in auth:
            raise ValueError("the credential holds a line break")
        extra = f"Authorization: {auth}\r\n"
        replaced.append("Authorization")
    if body is not None or method in BODY_METHODS:
        extra += f"Content-Length: {len(body) if body is not None else 0}\r\n"
        replaced.append("Content-Length")
    if not isinstance(headers, HeaderBlock) and any(name in headers for name in replaced):
        # The request's own take the place of those the caller's headers hold.
        fields: CIMultiDict[str] = CIMultiDict(headers)
        for name in replaced:
            fields.popall(name, None)
        headers = fields
    head = encode_head(method, target, host, headers, extra=extra)
    return head + body if body else head
