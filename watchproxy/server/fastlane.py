"""The fast lane: plain one-shot pass-throughs and LISTs, served without aiohttp's server.

A busy controller sends GET, PATCH, POST, PUT and DELETE of single objects in a tight loop,
and through aiohttp's server each paid for a request object, a handler task, a response object,
a router lookup and a writer: more than the proxy's own work on the request, and on a small
machine the difference between a sidecar that keeps up with ``kubectl proxy`` and one that
does not. The connection (``server.lanes``) parses such a request's head itself
(``server.requesthead``), asks :meth:`FastLane.admit` whether the request's route is a plain
pass-through or a LIST, and if so runs :meth:`FastLane.serve`. A LIST is offered to the same
LIST services the aiohttp path offers it to (the hub's cache, a current shared watch, a batch),
in the same order; a pass-through goes upstream through the same
:class:`~watchproxy.server.passthrough.Forwarder` (credentials, fair queueing, the adaptive
limit, the pooled connections). The answer is written to the socket here: head and body in one
write when the whole answer came at once. Everything else (watches, streams, upgrades,
refusals, anything unusual on the wire) goes to aiohttp's server as before, so the fast lane
adds no rule of its own: it is the same route, served with fewer objects.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDictProxy
from yarl import URL

from watchproxy.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable, status_bytes
from watchproxy.kube.headers import response_headers
from watchproxy.lists.answers import PACED_BODY_BYTES, StreamedAnswer, write_answer
from watchproxy.lists.batch import Answer
from watchproxy.policy.fairqueue import flow
from watchproxy.server.api import ApiHandler, flow_key
from watchproxy.server.clientgone import CLIENT_CLOSED_REQUEST, EndsWithClient
from watchproxy.server.passthrough import BUFFERED_BODY_BYTES
from watchproxy.server.requesthead import RequestHead
from watchproxy.server.routes import Route, RouteKind, classify, page_shape, with_continue
from watchproxy.upstream.client import UpstreamResponse

log = logging.getLogger("watchproxy.passthrough")

# Route kinds the fast lane serves: a pass-through, and the LIST services that may answer
# first (their answers are whole bodies). Watches, streams and upgrades are aiohttp's.
_SERVED = frozenset(
    {
        RouteKind.PASSTHROUGH,
        RouteKind.CACHED_LIST,
        RouteKind.CONSISTENT_LIST,
        RouteKind.BATCHED_LIST,
    }
)
_LAST_CHUNK = b"0\r\n\r\n"
# Answers that never have a body (RFC 9112 section 6.3).
_NO_BODY = frozenset({204, 304})
# Admission decisions remembered, by (method, target, Host). A controller sends the same few
# targets over and over, and deciding one anew (decoding its query, parsing its path, checking
# the policy) was a tenth of the proxy's CPU per request. Bounded in entries and in the length
# of a target it keeps (a client making up targets costs it about a megabyte at most).
ROUTE_MEMO_SIZE = 1024
# (method, target or page shape, Host)
_MemoKey = tuple[str, str, str | None]
ROUTE_MEMO_TARGET_CHARS = 512


class ClientConnection(Protocol):
    """The client's connection, as the fast lane writes to it."""

    remote: str
    lost: asyncio.Future[None]  # resolves when the connection is lost

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""

    def abort(self) -> None:
        """Close the connection: an answer that cannot be completed must not look whole."""


@functools.lru_cache(maxsize=1024)
def decoded_query(raw_query: str) -> MultiDictProxy[str]:
    """The query's parameters, decoded exactly as aiohttp decodes ``request.query``."""
    return URL.build(query_string=raw_query, encoded=True).query


def response_head(
    status: int,
    reason: str,
    headers: CIMultiDict[str],
    *,
    length: int | None = None,
    chunked: bool = False,
    close: bool = False,
) -> bytes:
    """An answer's head. Header values come from the apiserver's answer as parsed (latin-1,
    every line break refused), so they are written back byte for byte."""
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


def error_reply(error: ProxyError, *, close: bool) -> bytes:
    """A refusal as the aiohttp path answers it: a Status body with its HTTP code."""
    body = status_bytes(error.code, error.reason, error.message)
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})
    seconds = error.retry_after_seconds()
    if seconds is not None:
        headers["Retry-After"] = str(seconds)
    phrase = HTTPStatus(error.code).phrase
    head = response_head(error.code, phrase, headers, length=len(body), close=close)
    return head + body


class FastLane:
    """Admits and serves the requests the connection may serve without aiohttp's server."""

    def __init__(self, handler: ApiHandler, clock: Callable[[], float] = time.monotonic) -> None:
        self.handler = handler
        self._clock = clock
        self.served = 0  # requests answered here (the rest went to aiohttp's server)
        self._routes: dict[_MemoKey, Route | None] = {}
        # The same for the pages of paged LISTs, by (method, page shape, Host): one route per
        # shape, whichever page's token it holds (routes.page_shape). Apart from the targets: a
        # shape reads like the target of a first page that sends an empty continue.
        self._pages: dict[_MemoKey, Route | None] = {}

    def admit(self, head: RequestHead) -> Route | None:
        """The route of ``head`` when the fast lane serves it, else None (aiohttp serves it)."""
        handler = self.handler
        if handler.draining or head.body_length > BUFFERED_BODY_BYTES:
            return None
        if head.body_length > handler.forwarder.max_body_bytes:
            return None  # aiohttp's path answers the 413
        headers = head.headers
        if head.impersonating or len(head.target) > ROUTE_MEMO_TARGET_CHARS:
            # An impersonating request's verdict depends on every header name: decided each time.
            return self._admitted(head)
        # Otherwise classify() reads only these (an Upgrade never reaches the fast lane), and
        # the handler's routing, which is fixed: the same key, the same decision.
        key = (head.method, head.target, headers.get("Host"))
        try:
            return self._routes[key]
        except KeyError:
            pass
        page = page_shape(head.target)
        if page is not None:
            return self._page(head, (head.method, page[0], key[2]), page[1])
        return self._decided(self._routes, key, head)

    def _page(self, head: RequestHead, key: _MemoKey, token: str) -> Route | None:
        """The route of one page of a paged LIST: the first page of its shape is decided, the
        others take its route with their own token (None, aiohttp's, stays None)."""
        try:
            route = self._pages[key]
        except KeyError:
            return self._decided(self._pages, key, head)
        return None if route is None else with_continue(route, token)

    def _decided(
        self,
        memo: dict[_MemoKey, Route | None],
        key: _MemoKey,
        head: RequestHead,
    ) -> Route | None:
        """``head``'s route, decided now and remembered in ``memo`` under ``key``."""
        if len(memo) >= ROUTE_MEMO_SIZE:
            memo.clear()
        route = memo[key] = self._admitted(head)
        return route

    def _admitted(self, head: RequestHead) -> Route | None:
        raw_query = head.target.partition("?")[2]
        query: Mapping[str, str] = decoded_query(raw_query) if raw_query else _NO_QUERY
        route = classify(head.method, head.target, query, head.headers, self.handler.routing)
        if route.streaming or not _SERVED.issuperset(route.kinds):
            return None
        return route

    async def serve(
        self,
        head: RequestHead,
        route: Route,
        body: bytes,
        client: ClientConnection,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """Answer one admitted request on ``client``; counted as the aiohttp path counts it.
        ``task``: the one this runs in, when the caller holds it."""
        handler = self.handler
        started = self._clock()
        self.served += 1
        handler.in_flight += 1
        sent = _Sent()
        try:
            with EndsWithClient(client.lost, task):
                await self._answer(head, route, body, client, sent)
        finally:
            handler.in_flight -= 1
        status = sent.status or CLIENT_CLOSED_REQUEST
        took = self._clock() - started
        handler.metrics.request_done(route.verb, status, took, stream=False)

    async def _answer(
        self, head: RequestHead, route: Route, body: bytes, client: ClientConnection, sent: _Sent
    ) -> None:
        forwarder = self.handler.forwarder
        try:
            key = flow_key(client.remote, head.headers, forwarder.forward_identity)
            if route.verb == "list":
                self.handler.check_client_limit(client.remote, route.verb)
                for kind in route.kinds[:-1]:  # the LIST services, before the pass-through
                    listed = await self._list(kind, route, head, key)
                    # A batch's answer too big to hold whole is streamed to it; a large one
                    # held whole is written from the shared bytes at the client's pace.
                    if isinstance(listed, StreamedAnswer) or (
                        isinstance(listed, Answer) and len(listed.body) > PACED_BODY_BYTES
                    ):
                        sent.status = listed.status
                        length = None if isinstance(listed, StreamedAnswer) else len(listed.body)
                        answer_head = response_head(
                            listed.status,
                            listed.reason,
                            listed.headers,
                            length=length,
                            chunked=length is None,
                            close=self.handler.draining,
                        )
                        await write_answer(listed, answer_head, client)
                        return
                    if listed is not None:
                        self._write_response(listed, client)
                        sent.status = listed.status
                        return
            with flow(key):
                upstream = await forwarder.send(
                    head.method,
                    head.target,
                    head.headers,
                    body or None,
                    verb=route.verb,
                    streaming=False,
                    shared_headers=head.shared,
                )
        except ProxyError as error:
            client.write(error_reply(error, close=self.handler.draining))
            sent.status = error.code
            return
        status = upstream.status
        whole = upstream.whole_body()
        if whole is not None and status not in _NO_BODY:
            # The whole answer came at once (most do): head and body in one write.
            upstream.release()
            sent.status = status
            if (
                upstream.passable
                and not self.handler.draining
                and upstream.content_length == len(whole)
            ):
                # Nothing in its head is hop-by-hop: it goes on as it came, not rebuilt (nor
                # parsed into fields: http1.ResponseHead).
                client.write(upstream.raw_head + whole)
                return
            headers = response_headers(upstream.headers, keep_length=False)
            client.write(
                response_head(
                    status,
                    upstream.reason,
                    headers,
                    length=len(whole),
                    close=self.handler.draining,
                )
                + whole
            )
            return
        await self._relay(head, upstream, client, sent)

    async def _list(
        self, kind: RouteKind, route: Route, listing: RequestHead, key: tuple[str, str, str]
    ) -> web.Response | Answer | StreamedAnswer | None:
        """One LIST service's answer, or None to let the route's next kind answer."""
        handler = self.handler
        assert route.api_path is not None and route.query is not None
        if kind is RouteKind.CACHED_LIST:
            return await handler.hub.serve_list(listing, route.api_path, route.query)
        with flow(key):  # charged like the pass-through: to the client that asks
            if kind is RouteKind.CONSISTENT_LIST:
                return await handler.consistent_lists.serve(listing, route.api_path, route.query)
            return await handler.list_batcher.answer(listing)

    def _write_response(self, response: web.Response | Answer, client: ClientConnection) -> None:
        if isinstance(response, Answer):  # a batch's: its headers are the ones to send
            body = response.body
            headers = response.headers
            reason = response.reason
        else:
            assert isinstance(response.body, bytes), "LIST services answer with whole bodies"
            body = response.body
            headers = CIMultiDict(response.headers)
            headers.popall("Content-Length", None)
            reason = response.reason
        head = response_head(
            response.status, reason, headers, length=len(body), close=self.handler.draining
        )
        client.write(head + body)

    async def _relay(
        self, head: RequestHead, upstream: UpstreamResponse, client: ClientConnection, sent: _Sent
    ) -> None:
        """Copy an answer that is still arriving, at the pace the client reads it."""
        status = upstream.status
        upstream_chunked = upstream.headers.get("Transfer-Encoding", "").lower() == "chunked"
        keep_length = not upstream_chunked and "Content-Length" in upstream.headers
        chunked = not keep_length and status not in _NO_BODY
        headers = response_headers(upstream.headers, keep_length=keep_length)
        client.write(
            response_head(
                status, upstream.reason, headers, chunked=chunked, close=self.handler.draining
            )
        )
        sent.status = status
        ended = False
        try:
            async for chunk in upstream.chunks():
                if chunk:
                    client.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await client.drain()
            ended = True
        except (UpstreamUnavailable, UpstreamTimeout) as exc:
            reason = "idle" if isinstance(exc, UpstreamTimeout) else exc.message
            log.info("upstream answer ended early (%s): %s %s", reason, head.method, head.target)
            if keep_length:
                client.abort()  # a body of a declared length that cannot be completed
                return
        finally:
            if ended:
                upstream.release()
            else:
                upstream.cut()
        if chunked:
            client.write(_LAST_CHUNK)


class _Sent:
    """The status the client has been sent (0: none yet)."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = 0


_NO_QUERY: Mapping[str, str] = CIMultiDictProxy(CIMultiDict())
