"""Forward one client request to the apiserver and stream the answer back unchanged."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from watchproxy.errors import (
    BadRequest,
    BodiesBusy,
    PayloadTooLarge,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from watchproxy.kube.apipath import canonical_target
from watchproxy.kube.headers import forwarded_credential, request_headers, response_headers
from watchproxy.policy.bodybudget import BodyBudget
from watchproxy.server.clientgone import started
from watchproxy.server.requesthead import HEADER_BLOCKS_KEPT
from watchproxy.server.routes import Headers
from watchproxy.upstream.client import Upstream, UpstreamResponse
from watchproxy.upstream.http1 import HeaderBlock

log = logging.getLogger("watchproxy.passthrough")


# A body up to this size is read by the fast lane itself (bigger ones come through aiohttp's
# parser): within the connection cap, what such bodies hold together is bounded already.
BUFFERED_BODY_BYTES = 65536
# How long a client refused for lack of body budget is asked to wait before sending again.
BODY_BUDGET_RETRY_SECONDS = 1


class HeldBody:
    """A request body read whole, and what it holds of the body budget (given back by
    :meth:`release` once the request has gone upstream)."""

    __slots__ = ("_budget", "_held", "data")

    def __init__(self, data: bytes, budget: BodyBudget | None, held: int) -> None:
        self.data = data
        self._budget = budget
        self._held = held

    def release(self) -> None:
        if self._budget is not None and self._held:
            self._budget.give(self._held)
            self._held = 0


async def read_body(
    request: web.Request, limit: int, budget: BodyBudget | None = None
) -> HeldBody | None:
    """The request body, read whole before anything is sent upstream (see
    ``policy.bodybudget``: a slow client must not hold an upstream slot while it sends): more
    than ``limit`` bytes is a 413; a body bigger than BUFFERED_BODY_BYTES that ``budget`` cannot
    hold now is a 503 with Retry-After, before it is read."""
    if not request.body_exists:
        return None
    length = request.content_length
    if length is not None and length > limit:
        raise PayloadTooLarge(f"request body of {length} bytes exceeds {limit}")
    if length is not None and length <= BUFFERED_BODY_BYTES:
        return HeldBody(await _whole(request, limit), None, 0)
    # A declared length is taken at once; a chunked body of unknown length takes the limit.
    held = limit if length is None else length
    if budget is not None and not budget.take(held):
        raise BodiesBusy(
            f"watchproxy holds too many request bodies to read this one of {held} bytes now",
            retry_after=BODY_BUDGET_RETRY_SECONDS,
        )
    try:
        return HeldBody(await _whole(request, limit), budget, held)
    except BaseException:
        if budget is not None:
            budget.give(held)
        raise


async def _whole(request: web.Request, limit: int) -> bytes:
    chunks = [chunk async for chunk in _BodyParts(request, limit)]
    return b"".join(chunks)


class _BodyParts:
    """A client's request body as it arrives, at most ``limit`` bytes (an iterator class, not an
    async generator: mypyc compiles this module, and it has no async generators)."""

    def __init__(self, request: web.Request, limit: int) -> None:
        self._chunks = request.content.iter_any()
        self._limit = limit
        self._size = 0

    def __aiter__(self) -> _BodyParts:
        return self

    async def __anext__(self) -> bytes:
        # A body that breaks off is the client's doing: it must not read as an upstream failure
        # (which would count against the apiserver's health and the adaptive limit).
        try:
            chunk = await self._chunks.__anext__()
        except (aiohttp.ClientError, ConnectionError) as error:
            raise BadRequest(f"the request body broke off: {type(error).__name__}") from None
        self._size += len(chunk)
        if self._size > self._limit:
            raise PayloadTooLarge(f"request body exceeds {self._limit} bytes")
        return chunk


class Forwarder:
    """Pass-through of everything the hub does not serve itself."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        max_body_bytes: int,
        forward_identity: bool,
        body_budget: BodyBudget | None = None,
        forward_impersonation: bool = False,
        stream_idle_timeout: float | None = None,
    ) -> None:
        self.upstream = upstream
        self.max_body_bytes = max_body_bytes
        self.body_budget = body_budget
        self.forward_identity = forward_identity
        self.forward_impersonation = forward_impersonation
        # Streams (logs -f, unshared watches) end cleanly after this long without a byte: a
        # silently dead upstream connection must not hold the client forever.
        self.stream_idle_timeout = stream_idle_timeout or None
        self._streams: set[UpstreamResponse] = set()
        # What goes upstream for a client's shared header block (send(shared_headers=True)):
        # id -> (the block, its outgoing headers, its forwarded credential).
        self._outgoing: dict[int, tuple[Headers, HeaderBlock, str | None]] = {}

    def close_streams(self) -> None:
        """At shutdown: end every relayed stream; each client sees a clean end of stream."""
        for response in list(self._streams):
            response.cut()

    def outgoing(self, request: web.Request) -> tuple[CIMultiDict[str], str | None]:
        """The headers a client request carries upstream, and the credential it runs as in
        forward mode (None: the proxy's own)."""
        return self.outgoing_headers(request.headers)

    def outgoing_headers(self, client_headers: Headers) -> tuple[CIMultiDict[str], str | None]:
        """:meth:`outgoing`, from the client's headers alone."""
        headers = request_headers(
            client_headers,
            forward_identity=self.forward_identity,
            forward_impersonation=self.forward_impersonation,
        )
        return headers, forwarded_credential(client_headers, self.forward_identity)

    def _outgoing_of_shared(self, client_headers: Headers) -> tuple[HeaderBlock, str | None]:
        # By identity: the entry holds the headers, so no other object can take their id.
        entry = self._outgoing.get(id(client_headers))
        if entry is not None and entry[0] is client_headers:
            return entry[1], entry[2]
        if len(self._outgoing) >= HEADER_BLOCKS_KEPT:  # as many as requesthead keeps
            self._outgoing.clear()
        outgoing, auth = self.outgoing_headers(client_headers)
        outgoing.popall("Authorization", None)  # the credential goes beside it: auth
        headers = HeaderBlock(CIMultiDictProxy(outgoing))  # read-only, encoded once
        self._outgoing[id(client_headers)] = (client_headers, headers, auth)
        return headers, auth

    async def send(
        self,
        method: str,
        target: str,
        client_headers: Headers,
        body: bytes | None,
        *,
        verb: str,
        streaming: bool,
        shared_headers: bool = False,
    ) -> UpstreamResponse:
        """Send a client's request upstream; its answer comes back with the body unread.
        ``target`` is the raw request target the router checked: its canonical form goes, which
        decodes to the path the router judged (the same bytes, for a path without ``%``).
        ``shared_headers``: ``client_headers`` is a parse that later requests with the same
        lines share, never changed (``server.requesthead``): what goes upstream for it is
        worked out once. ``Upstream.open`` copies what it is given, so it can be shared."""
        headers: Mapping[str, str] | HeaderBlock
        if shared_headers:
            headers, forwarded_auth = self._outgoing_of_shared(client_headers)
        else:
            headers, forwarded_auth = self.outgoing_headers(client_headers)
        return await self.upstream.open(
            method,
            canonical_target(target),
            headers=headers,
            body=body,
            verb=verb,
            streaming=streaming,
            read_timeout=self.stream_idle_timeout,
            wait=False,
            forwarded_auth=forwarded_auth,
        )

    async def forward(
        self, request: web.Request, *, verb: str, streaming: bool
    ) -> web.StreamResponse:
        body = await read_body(request, self.max_body_bytes, self.body_budget)
        try:
            upstream_response = await self.send(
                request.method,
                request.raw_path,
                request.headers,
                None if body is None else body.data,
                verb=verb,
                streaming=streaming,
            )
        finally:
            if body is not None:
                body.release()
        body_whole = None if request.method == "HEAD" else upstream_response.whole_body()
        if body_whole is not None and upstream_response.status not in (204, 304):
            # The whole answer came at once (most one-shot answers do): one write to the
            # client, head and body together, with its length.
            upstream_response.release()
            answer = web.Response(
                status=upstream_response.status, reason=upstream_response.reason, body=body_whole
            )
            answer.headers.extend(response_headers(upstream_response.headers, keep_length=False))
            return answer
        if streaming:
            self._streams.add(upstream_response)
        ended = False
        try:
            response, ended = await self._relay(request, upstream_response)
            return response
        finally:
            self._streams.discard(upstream_response)
            if ended:
                upstream_response.release()
            else:
                upstream_response.cut()

    async def _relay(
        self, request: web.Request, upstream: UpstreamResponse
    ) -> tuple[web.StreamResponse, bool]:
        """Copy the answer to the client as it comes; True when it was read to its end."""
        chunked = upstream.headers.get("Transfer-Encoding", "").lower() == "chunked"
        keep_length = not chunked and "Content-Length" in upstream.headers
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(response_headers(upstream.headers, keep_length=keep_length))
        if not keep_length and request.method != "HEAD":
            response.enable_chunked_encoding()
        await response.prepare(request)
        started(request, response)
        chunks = upstream.chunks()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (UpstreamUnavailable, UpstreamTimeout) as exc:
                # The upstream broke mid-body or went silent for too long. A stream gets a clean
                # end (the client asks again); a fixed-length body cannot be completed, so cut
                # the connection.
                log.info(
                    "upstream stream ended early (%s): %s %s",
                    "idle" if isinstance(exc, UpstreamTimeout) else exc.message,
                    request.method,
                    request.path,
                )
                if keep_length:
                    if request.transport is not None:
                        request.transport.close()
                    return response, False
                await self._end(response)
                return response, False
            try:
                await response.write(chunk)
            except (ConnectionError, aiohttp.ClientConnectionResetError):
                await chunks.aclose()
                return response, False  # the client left; nothing more to say to it
        await self._end(response)
        return response, True

    @staticmethod
    async def _end(response: web.StreamResponse) -> None:
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await response.write_eof()
