"""Forward one client request to the apiserver and relay the answer back unchanged.

:meth:`Forwarder.forward` is the pass-through of every request kind the hub and the LIST
services do not answer (one-shot requests, unshared watches, ``logs -f``), and :func:`relay`
is the one copy of an upstream answer that is still arriving to a client, at the pace the
client reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from watchproxy.errors import BodiesBusy, PayloadTooLarge, UpstreamTimeout, UpstreamUnavailable
from watchproxy.kube.apipath import canonical_target
from watchproxy.kube.headers import Headers, forwarded_credential, request_headers, response_headers
from watchproxy.policy.bodybudget import BodyBudget
from watchproxy.server.http import HEADER_BLOCKS_KEPT, Request
from watchproxy.server.protocol import Response
from watchproxy.upstream.client import Upstream, UpstreamResponse
from watchproxy.upstream.http1 import HeaderBlock

log = logging.getLogger("watchproxy.passthrough")


# A body up to this size is read without taking from the body budget: within the connection
# cap, what such bodies hold together is bounded already.
BUFFERED_BODY_BYTES = 65536
# How long a client refused for lack of body budget is asked to wait before sending again.
BODY_BUDGET_RETRY_SECONDS = 1
# Answers that never have a body (RFC 9112 section 6.3).
_NO_BODY = frozenset({204, 304})


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
    request: Request, response: Response, limit: int, budget: BodyBudget | None = None
) -> HeldBody | None:
    """The request body, read whole before anything is sent upstream (see
    ``policy.bodybudget``: a slow client must not hold an upstream slot while it sends): more
    than ``limit`` bytes is a 413; a body bigger than BUFFERED_BODY_BYTES that ``budget`` cannot
    hold now is a 503 with Retry-After, before it is read."""
    if not request.has_body:
        return None
    if response.body_error is not None:
        raise response.body_error
    length = request.body_length
    if length is not None and length > limit:
        raise PayloadTooLarge(f"request body of {length} bytes exceeds {limit}")
    if length is not None and length <= BUFFERED_BODY_BYTES:
        return HeldBody(await response.body(limit), None, 0)
    # A declared length is taken at once; a chunked body of unknown length takes the limit.
    held = limit if length is None else length
    if budget is not None and not budget.take(held):
        raise BodiesBusy(
            f"watchproxy holds too many request bodies to read this one of {held} bytes now",
            retry_after=BODY_BUDGET_RETRY_SECONDS,
        )
    try:
        return HeldBody(await response.body(limit), budget, held)
    except BaseException:
        if budget is not None:
            budget.give(held)
        raise


async def relay(upstream: UpstreamResponse, response: Response, request: Request) -> bool:
    """Copy an upstream answer that is still arriving to the client, at the pace the client
    reads it; True when it was read to its end. A stream that breaks off or goes silent ends
    cleanly (chunked: the client asks again); a body of a declared length that cannot be
    completed ends the connection."""
    status = upstream.status
    upstream_chunked = upstream.headers.get("Transfer-Encoding", "").lower() == "chunked"
    keep_length = not upstream_chunked and "Content-Length" in upstream.headers
    headers = response_headers(upstream.headers, keep_length=keep_length)
    response.start(status, upstream.reason, headers, chunked=not keep_length)
    try:
        async for chunk in upstream.chunks():
            response.write(chunk)
            await response.drain()
    except (UpstreamUnavailable, UpstreamTimeout) as exc:
        reason = "idle" if isinstance(exc, UpstreamTimeout) else exc.message
        log.info("upstream answer ended early (%s): %s %s", reason, request.method, request.path)
        if keep_length:
            response.abort()  # a body of a declared length that cannot be completed
        else:
            response.end()
        return False
    response.end()
    return True


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

    def outgoing_headers(self, client_headers: Headers) -> tuple[CIMultiDict[str], str | None]:
        """The headers a client request carries upstream, and the credential it runs as in
        forward mode (None: the proxy's own)."""
        headers = request_headers(
            client_headers,
            forward_identity=self.forward_identity,
            forward_impersonation=self.forward_impersonation,
        )
        return headers, forwarded_credential(client_headers, self.forward_identity)

    def outgoing_of_shared(self, client_headers: Headers) -> tuple[HeaderBlock, str | None]:
        """What goes upstream for a client header block that later requests share (never
        changed: ``server.http.Request``), without the credential, which comes beside it."""
        # By identity: the entry holds the headers, so no other object can take their id.
        entry = self._outgoing.get(id(client_headers))
        if entry is not None and entry[0] is client_headers:
            return entry[1], entry[2]
        if len(self._outgoing) >= HEADER_BLOCKS_KEPT:  # as many as the protocol keeps
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
        lines share, never changed (``server.http.Request``): what goes upstream for it is
        worked out once. ``Upstream.open`` copies what it is given, so it can be shared."""
        headers: Mapping[str, str] | HeaderBlock
        if shared_headers:
            headers, forwarded_auth = self.outgoing_of_shared(client_headers)
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
        self, request: Request, response: Response, *, verb: str, streaming: bool
    ) -> None:
        """Pass ``request`` through and answer it with what the apiserver answers."""
        body = None
        if request.has_body:
            body = await read_body(request, response, self.max_body_bytes, self.body_budget)
        try:
            upstream = await self.send(
                request.method,
                request.target,
                request.headers,
                None if body is None else body.data,
                verb=verb,
                streaming=streaming,
                shared_headers=request.shared,
            )
        finally:
            if body is not None:
                body.release()
        status = upstream.status
        # A stream (a watch, logs -f) keeps its chunked framing even when it ended at once (a
        # watch with a negative timeoutSeconds): the apiserver's answer is chunked, and clients
        # tell a watch from an error by it. The one upstream client can hand any answer whole.
        whole = None if request.method == "HEAD" or streaming else upstream.whole_body()
        if whole is not None and status not in _NO_BODY:
            # The whole answer came at once (most one-shot answers do): head and body in one
            # write, with its length.
            upstream.release()
            if response.passes_raw and upstream.head_passes_with(whole):
                # Nothing in its head is hop-by-hop: it goes on as it came, not rebuilt.
                response.send_raw(status, upstream.raw_head + whole)
                return
            headers = response_headers(upstream.headers, keep_length=False)
            response.send(status, upstream.reason, headers, whole)
            return
        if streaming:
            self._streams.add(upstream)
        ended = False
        try:
            ended = await relay(upstream, response, request)
        finally:
            self._streams.discard(upstream)
            if ended:
                upstream.release()
            else:
                upstream.cut()
