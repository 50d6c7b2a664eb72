"""What the API port's protocol hands its handler and how an answer goes on the wire, as values.

:class:`Request` is one client request as llhttp parsed it (``server.protocol``): method, raw
target, headers, version and, once read, its body. :func:`response_head` renders an answer's
head and :func:`status_answer` is the one place a :class:`~watchproxy.errors.ProxyError`
becomes a Kubernetes ``Status`` answer on this port. Pure: no socket here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from http import HTTPStatus

from multidict import CIMultiDict, CIMultiDictProxy, MultiDictProxy
from yarl import URL

from watchproxy.errors import ProxyError, status_bytes
from watchproxy.kube.headers import Headers
from watchproxy.lists.answers import Answer

# A client sends the same header lines request after request (its User-Agent, Accept, often the
# same Content-Length): the parse of a block of lines is kept, read-only, for the next, and
# what is derived from it (the headers that go upstream) may be kept with it. Bounded in blocks
# and in the size of a block kept.
HEADER_BLOCKS_KEPT = 512
HEADER_BLOCK_BYTES_KEPT = 2048


def status_answer(error: ProxyError) -> Answer:
    """``error`` as the Kubernetes ``Status`` answer every refusal on the API port gets."""
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})
    seconds = error.retry_after_seconds()
    if seconds is not None:
        headers["Retry-After"] = str(seconds)
    body = status_bytes(error.code, error.reason, error.message)
    return Answer(error.code, reason_phrase(error.code), headers, body)


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def response_head(
    status: int,
    reason: str,
    headers: Mapping[str, str],
    *,
    length: int | None = None,
    chunked: bool = False,
    close: bool = False,
) -> bytes:
    """An answer's head. Header values come from the apiserver's answer as parsed (latin-1,
    every line break refused) or from the proxy itself, so they are written back byte for
    byte."""
    parts = [f"HTTP/1.1 {status} {reason}\r\n"]
    for name, value in headers.items():
        parts += (name, ": ", value, "\r\n")
    if length is not None:
        parts.append(f"Content-Length: {length}\r\n")
    if chunked:
        parts.append("Transfer-Encoding: chunked\r\n")
    if close:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


@functools.lru_cache(maxsize=1024)
def decoded_query(raw_query: str) -> MultiDictProxy[str]:
    """The query's parameters, decoded as the apiserver's Go server decodes them (yarl's
    reading of an encoded query string)."""
    return URL.build(query_string=raw_query, encoded=True).query


_NO_QUERY: MultiDictProxy[str] = decoded_query("")


class Request:
    """One request as the protocol parsed it. ``headers`` is read-only: when ``shared``, the
    same object is every later request's with the same header lines (see
    :data:`HEADER_BLOCKS_KEPT`), so what is derived from it may be kept with it."""

    __slots__ = (
        "_query",
        "body_length",
        "chunked",
        "errored_watch",
        "flow",
        "has_body",
        "headers",
        "hosts",
        "impersonating",
        "method",
        "remote",
        "shared",
        "target",
        "upgrade",
        "version",
    )

    def __init__(
        self,
        method: str,
        target: str,
        headers: CIMultiDictProxy[str],
        version: tuple[int, int],
        remote: str,
        *,
        shared: bool = False,
        body_length: int | None = 0,
        upgrade: bool | None = None,
    ) -> None:
        self.method = method
        self.target = target  # the raw request target: path and query, as sent
        self.headers = headers
        self.version = version
        self.remote = remote
        self.shared = shared
        self.body_length = body_length  # declared Content-Length; None for a chunked body
        self.chunked = chunked = body_length is None
        self.has_body = chunked or bool(body_length)
        self.upgrade = "Upgrade" in headers if upgrade is None else upgrade
        # Set by the protocol from the header block: Impersonate-* among them; Host fields.
        self.impersonating = False
        self.hosts = 1
        self._query: MultiDictProxy[str] | None = None
        # Set on a watch: its errored-watch key, and whether it asked for a short timeout.
        self.errored_watch: tuple[tuple[str, str, str], bool] | None = None
        self.flow: tuple[str, str, str] | None = None  # its fair-queueing key, once asked

    @property
    def raw_path(self) -> str:
        """The target, named as LIST serving reads it (``lists.ports.ListRequest``)."""
        return self.target

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> MultiDictProxy[str]:
        query = self._query
        if query is None:
            raw = self.target.partition("?")[2]
            query = self._query = decoded_query(raw) if raw else _NO_QUERY
        return query


def may_be_faulty(request: Request) -> bool:
    """Whether :func:`faulty_framing` may find something wrong with ``request`` (most requests
    are HTTP/1.1 with one Host: nothing to look at)."""
    return (
        request.version != (1, 1)
        or request.hosts != 1
        or request.chunked
        or request.method == "CONNECT"
    )


def faulty_framing(method: str, version: tuple[int, int], headers: Headers) -> str | None:
    """Why a message llhttp accepted must still be refused, with its connection closed, for
    its framing (None: it may be served).

    CONNECT: llhttp reads what follows its head as a tunnel's bytes whatever its
    Content-Length says, where h11 (and any parser that honours the length) reads a body and
    then a next request; the Kubernetes API has no tunnel to open.
    A major version other than 1: llhttp reads any digit.digit (HTTP/2.0 among them) by
    HTTP/1.1's rules; the apiserver's Go server refuses such a version on this port.
    An HTTP/1.1 request without Host, or with two: llhttp accepts both.
    Transfer-Encoding other than ``chunked`` alone (found by the parser differential test).
    RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing, even
    with a Content-Length: llhttp frames its body as chunked, an HTTP/1.0 peer or a proxy in
    front may frame it by its length or by the connection's end, and what one reads as a body
    the other reads as a next request. The parser differential test
    (tests/unit/test_parser_differential.py) holds the protocol to h11's reading."""
    if method == "CONNECT":
        return "CONNECT is not served here"
    if version[0] != 1:
        return f"HTTP/{version[0]}.{version[1]} is not served here; HTTP/1.1 is"
    if version < (1, 1) and "Transfer-Encoding" in headers:
        return "an HTTP/1.0 request must not carry Transfer-Encoding"
    codings = headers.getall("Transfer-Encoding", ())
    if codings and [c.strip().lower() for c in codings] != ["chunked"]:
        # llhttp reads any codings that end in chunked; the apiserver's Go server, and h11,
        # only chunked alone, and the proxy would forward a body still in the other codings.
        return "a request body may be framed by Transfer-Encoding: chunked alone"
    if version >= (1, 1) and len(headers.getall("Host", ())) != 1:
        # RFC 9112 section 3.2: exactly one Host, or a 400.
        return "an HTTP/1.1 request carries exactly one Host header"
    return None
