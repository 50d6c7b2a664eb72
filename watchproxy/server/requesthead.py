"""The request heads the API port's fast lane serves itself, told apart from all others.

Almost every request a controller sends is a small, plain HTTP/1.1 message: a method, an
origin-form target, a few dozen ASCII header lines and a body of a declared length. For those,
:func:`parse_request_head` returns a :class:`RequestHead` and the connection serves them
without aiohttp's per-request machinery (``server.fastlane``). Anything else raises
:class:`NotSimple`, and the connection hands its bytes to aiohttp's server, whose own checks
(request smuggling, header limits, 100-continue, upgrades, chunked bodies) then apply as they
always did. The rules here are therefore allowed to be narrow, never loose: every message they
accept is one aiohttp would parse the same way, and every doubt is a ``NotSimple``.

Pure: bytes in, a value or an exception out.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from multidict import CIMultiDict

# aiohttp's own limits (its parser's max_line_size and max_field_size, max_headers): a line
# over them is aiohttp's to refuse, with its own answer.
MAX_LINE = 8190
MAX_HEADERS = 128
# Bytes without a blank line after which the head is not simple (aiohttp says what is wrong).
MAX_HEAD_BYTES = 65536

SIMPLE_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
# Printable ASCII and tab only: no control characters, no obs-text, no line folding.
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PRINTABLE = re.compile(rb"[\t\x20-\x7e]*")
_TARGET = re.compile(r"/[\x21-\x7e]*")
# Headers whose presence means a message the fast lane does not frame or answer itself.
_NOT_SIMPLE_FIELDS = frozenset({"transfer-encoding", "upgrade", "expect", "te", "http2-settings"})


class NotSimple(Exception):
    """This message is for aiohttp's server to parse (and, if need be, to refuse)."""


class RequestHead(NamedTuple):
    method: str
    target: str  # the raw request target: path and query, as sent
    headers: CIMultiDict[str]
    head_length: int  # bytes up to and including the blank line
    body_length: int  # the declared Content-Length; 0 without one


def parse_request_head(buffer: bytes | bytearray) -> RequestHead | None:
    """The head at the start of ``buffer``; None while its blank line has not arrived.

    Raises NotSimple for a message that is not a plain HTTP/1.1 request with a declared (or no)
    body length that keeps its connection open."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise NotSimple("no end of head")
        return None
    raw = bytes(buffer[:end])
    if _PRINTABLE.fullmatch(raw.replace(b"\r\n", b"")) is None:
        raise NotSimple("a byte outside printable ASCII")
    lines = raw.decode("ascii").split("\r\n")
    request_line = lines[0]
    if len(request_line) > MAX_LINE or len(lines) > MAX_HEADERS + 1:
        raise NotSimple("over aiohttp's limits")
    method, _, rest = request_line.partition(" ")
    target, _, version = rest.partition(" ")
    if method not in SIMPLE_METHODS or version != "HTTP/1.1" or not _TARGET.fullmatch(target):
        raise NotSimple("not a plain HTTP/1.1 request line")
    headers: CIMultiDict[str] = CIMultiDict()
    body_length: int | None = None
    hosts = 0
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or len(line) > MAX_LINE or not _FIELD_NAME.fullmatch(name):
            raise NotSimple("not a plain header line")
        value = value.strip(" \t")
        lowered = name.lower()
        if lowered in _NOT_SIMPLE_FIELDS:
            raise NotSimple(f"a {name} header")
        if lowered == "content-length":
            if body_length is not None or not value.isdigit() or len(value) > 15:
                raise NotSimple("a Content-Length to check")
            body_length = int(value)
        elif lowered == "host":
            hosts += 1
        elif lowered == "connection" and not _keeps_alive(value):
            raise NotSimple("a connection that ends or changes protocol")
        headers.add(name, value)
    if hosts != 1:
        raise NotSimple("not exactly one Host")
    return RequestHead(method, target, headers, end + 4, body_length or 0)


def _keeps_alive(value: str) -> bool:
    tokens = {token.strip().lower() for token in value.split(",")}
    return "close" not in tokens and "upgrade" not in tokens
