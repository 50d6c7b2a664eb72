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

import functools
import re
from typing import NamedTuple

from multidict import CIMultiDict, CIMultiDictProxy

from watchproxy.kube.headers import impersonates

# aiohttp's own limits (its parser's max_line_size and max_field_size, max_headers): a line
# over them is aiohttp's to refuse, with its own answer.
MAX_LINE = 8190
MAX_HEADERS = 128
# Bytes without a blank line after which the head is not simple (aiohttp says what is wrong).
MAX_HEAD_BYTES = 65536

SIMPLE_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
# A plain request line; then header lines of a token, a colon and printable ASCII or tab (no
# control characters, no obs-text, no folded lines). Each a match in C; anything else is for
# aiohttp.
_REQUEST_LINE = re.compile(r"(GET|POST|PUT|PATCH|DELETE) (/[!-~]*) HTTP/1\.1")
_HEADER_LINES = re.compile(r"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t -~]*\r\n)*")
# A field's name and its value without the whitespace around it (greedy, so no backtracking
# per character: the value runs to its last non-blank character).
_FIELD = re.compile(r"([^:\r\n]+):[ \t]*((?:[^\r\n]*[^\r\n \t])?)[ \t]*\r\n")
# Headers whose presence means a message the fast lane does not frame or answer itself.
_NOT_SIMPLE_FIELDS = ("transfer-encoding", "upgrade", "expect", "te", "http2-settings")
# Headers aiohttp's parser refuses to see twice (its SINGLETON_HEADERS): a head with two of
# one is aiohttp's to refuse, not the fast lane's to serve.
_SINGLETON_FIELDS = (
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "etag",
    "host",
    "max-forwards",
    "server",
    "transfer-encoding",
    "user-agent",
)
# A client sends the same header lines request after request (its User-Agent, Accept, often
# the same Content-Length): the parse of a block of lines is kept, read-only, for the next.
# Bounded in blocks and in the length of a block kept.
HEADER_BLOCKS_KEPT = 512
HEADER_BLOCK_CHARS_KEPT = 2048


class NotSimple(Exception):
    """This message is for aiohttp's server to parse (and, if need be, to refuse)."""


class RequestHead(NamedTuple):
    method: str
    target: str  # the raw request target: path and query, as sent
    headers: CIMultiDictProxy[str]  # read-only: a client's next request may share it
    head_length: int  # bytes up to and including the blank line
    body_length: int  # the declared Content-Length; 0 without one
    # An Impersonate-* header among them (kube.headers.impersonates), decided once per block.
    impersonating: bool = False
    # The headers are a parse kept for later requests with the same lines: the same object
    # each time, never changed (what is derived from them may be kept with them).
    shared: bool = False

    @property
    def raw_path(self) -> str:
        """The target, named as LIST serving reads it (``lists.ports.ListRequest``)."""
        return self.target


def parse_request_head(buffer: bytes | bytearray) -> RequestHead | None:
    """The head at the start of ``buffer``; None while its blank line has not arrived.

    Raises NotSimple for a message that is not a plain HTTP/1.1 request with a declared (or no)
    body length that keeps its connection open."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise NotSimple("no end of head")
        return None
    text = buffer[: end + 4].decode("latin-1")
    line_end = text.find("\r\n")
    line = _REQUEST_LINE.fullmatch(text, 0, line_end)
    if line is None:
        raise NotSimple("not a plain HTTP/1.1 request line")
    method, target = line.groups()
    if len(target) > MAX_LINE - 15:
        raise NotSimple("over aiohttp's limits")
    block = text[line_end + 2 : -2]  # the header lines, each with its CRLF
    shared = len(block) <= HEADER_BLOCK_CHARS_KEPT
    if shared:
        headers, length, impersonating = _header_block(block)
    else:
        headers, length, impersonating = _header_block.__wrapped__(block)
    return RequestHead(method, target, headers, end + 4, length, impersonating, shared)


@functools.lru_cache(maxsize=HEADER_BLOCKS_KEPT)
def _header_block(block: str) -> tuple[CIMultiDictProxy[str], int, bool]:
    """The headers of a simple request's header lines, its declared body length, and whether
    it impersonates."""
    if _HEADER_LINES.fullmatch(block) is None:
        raise NotSimple("not a plain HTTP/1.1 head")
    fields = _FIELD.findall(block)
    if len(fields) > MAX_HEADERS:
        raise NotSimple("over aiohttp's limits")
    if len(block) > MAX_LINE and max(map(len, block.split("\r\n"))) > MAX_LINE:
        raise NotSimple("a header line over aiohttp's limit")
    headers: CIMultiDict[str] = CIMultiDict(fields)
    for name in _NOT_SIMPLE_FIELDS:
        if name in headers:
            raise NotSimple(f"a {name} header")
    if "host" not in headers:
        raise NotSimple("no Host")
    if len(headers) != len(set(map(str.lower, headers))):
        for name in _SINGLETON_FIELDS:
            if len(headers.getall(name, ())) > 1:
                raise NotSimple(f"more than one {name}")
    for value in headers.getall("connection", ()):
        if not _keeps_alive(value):
            raise NotSimple("a connection that ends or changes protocol")
    lengths = headers.getall("content-length", ())
    if len(lengths) > 1 or (lengths and (not lengths[0].isdigit() or len(lengths[0]) > 15)):
        raise NotSimple("a Content-Length to check")
    length = int(lengths[0]) if lengths else 0
    return CIMultiDictProxy(headers), length, impersonates(headers)


def faulty_framing(
    method: str, version: tuple[int, int], headers: CIMultiDictProxy[str]
) -> str | None:
    """Why a message aiohttp's parser accepted must still be refused, with its connection
    closed, for its body framing (None: it may be served).

    A major version other than 1: HTTP/1's framing rules are not that version's. CONNECT:
    aiohttp reads what follows its head as a tunnel's bytes whatever its Content-Length says,
    where h11 (and any parser that honours the length) reads a body and then a next request;
    the Kubernetes API has no tunnel to open.
    RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing, even
    with a Content-Length. llhttp frames its body as chunked; an HTTP/1.0 peer or a proxy in
    front may frame it by its length or by the connection's end, and what one reads as a body
    the other reads as a next request. The fast lane serves HTTP/1.1 only, so this is checked
    on aiohttp's path alone (``server.api``); the parser differential test
    (tests/unit/test_parser_differential.py) holds the two parsers to h11's reading."""
    if method == "CONNECT":
        return "CONNECT is not served here"
    if version[0] != 1:
        # llhttp reads any digit.digit (HTTP/2.0 among them) by HTTP/1.1's rules; the
        # apiserver's Go server refuses a major version other than 1 on this port.
        return f"HTTP/{version[0]}.{version[1]} is not served here; HTTP/1.1 is"
    if version < (1, 1) and "Transfer-Encoding" in headers:
        return "an HTTP/1.0 request must not carry Transfer-Encoding"
    return None


def last_on_connection(headers: CIMultiDictProxy[str]) -> bool:
    """Whether no request after this one may be read from its connection (its answer then
    closes it).

    A chunked body: aiohttp's C parser (llhttp, aiohttp 3.14.5) hands the trailer fields of a
    chunked body to the next request on the connection, as that request's own headers
    (``0\\r\\nImpersonate-User: x\\r\\n\\r\\n`` then ``GET ...``: the GET carries
    Impersonate-User). Found by the parser differential test against h11, which drops them.
    Clients send chunked bodies seldom (client-go and kubectl send a length), so closing after
    one costs little, and no trailer can become another request's header."""
    return "Transfer-Encoding" in headers


def _keeps_alive(value: str) -> bool:
    tokens = {token.strip().lower() for token in value.split(",")}
    return "close" not in tokens and "upgrade" not in tokens
