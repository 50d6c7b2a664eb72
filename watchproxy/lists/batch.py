"""Identical consistent LISTs share one upstream request.

A LIST without a resourceVersion asks for the current state (a quorum read). Such a request
cannot reuse an answer the apiserver began before it arrived, but it can share the next one:
requests for the same path, query and forwarded headers that arrive while one upstream LIST of
theirs is in flight join one batch, and the batch is sent when that LIST has answered. Every
request in a batch arrived before the batch's upstream request was sent, so the answer is as
fresh as each of them asked for. At most one upstream LIST per key is in flight and one batch
waits; N clients listing at once cost the apiserver two LISTs, not N.

Only first pages are batched (a ``continue`` token is one client's). An answer is held whole
only when it is small (one paced piece, 256 KiB); a larger one is streamed to every member from
its one upstream answer as it arrives (``lists.sharedbody``), each member at its own position,
the batch holding at most ``max_bytes`` (``limits.list_batch_max_bytes``) for the slowest and
all streamed batches together at most their budget (``limits.max_buffered_list_bytes``): the
memory a LIST costs does not grow with its size or with its members, and no member sends its
LIST again: one upstream LIST per batch, whatever its size. A batch that gets no answer (refused
by the rate limiter, the apiserver unreachable, the body cut) fails every member with that
error, as the pass-through would have: nothing is retried behind the client's back. A batch
whose members have all left (their clients closed their connections) is dropped, and its
upstream request ended, as a pass-through LIST would have been.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from multidict import CIMultiDict

from watchproxy.errors import ProxyError
from watchproxy.kube.apipath import canonical_target
from watchproxy.kube.headers import Headers, response_headers
from watchproxy.lists.answers import PACED_BODY_BYTES, Answer, StreamedAnswer
from watchproxy.lists.ports import ListRequest
from watchproxy.lists.sharedbody import SLOW_READER_SECONDS, SharedBody, Streamed
from watchproxy.metrics import Metrics
from watchproxy.policy.bodybudget import BodyBudget
from watchproxy.upstream.client import Upstream
from watchproxy.upstream.http1 import HeaderBlock
from watchproxy.upstream.response import UpstreamResponse

log = logging.getLogger("watchproxy.passthrough")

# Headers that differ between otherwise identical requests and do not change the answer: the
# batch's upstream request carries its first member's. The credential is in the key beside
# the fields (forward mode), so whether a header set still holds it does not change the key.
_NOT_IN_KEY = frozenset(
    {"kubectl-session", "kubectl-command", "x-request-id", "audit-id", "authorization"}
)
# The key's fields of a shared outgoing header block are kept for as many blocks as the API
# port keeps (``server.http.HEADER_BLOCKS_KEPT``).
_FIELDS_KEPT = 512

KeyFields = tuple[tuple[str, str], ...]
Key = tuple[str, KeyFields, str | None]
T = TypeVar("T")


class Counting(Protocol):
    """A counter, as a batch counts its upstream request in one."""

    def inc(self, amount: float = 1) -> None: ...


async def _outcome(shared: asyncio.Future[T]) -> T:
    """``shared``'s result, awaited so that cancelling this waiter (its client left) leaves
    ``shared`` to the batch's other members. What ``asyncio.shield`` does, without its Python
    frames and its second future: a batched LIST paid for both on every request."""
    if not shared.done():
        waiter: asyncio.Future[None] = shared.get_loop().create_future()

        def settled(_: asyncio.Future[T]) -> None:
            if not waiter.done():
                waiter.set_result(None)

        shared.add_done_callback(settled)
        try:
            await waiter
        finally:
            shared.remove_done_callback(settled)
    return shared.result()


class Outgoing(Protocol):
    """The pass-through, as a batch sends through it (``server.passthrough.Forwarder`` fits):
    a batch's request carries what its first member's own request would have carried."""

    @property
    def upstream(self) -> Upstream: ...

    def outgoing_headers(self, client_headers: Headers) -> tuple[CIMultiDict[str], str | None]:
        """The headers a request with ``client_headers`` carries upstream, and the credential
        it runs as (None: the proxy's own)."""

    def outgoing_of_shared(self, client_headers: Headers) -> tuple[HeaderBlock, str | None]:
        """The same for a client header block that later requests share (never changed), as
        a read-only block without the credential, worked out once per block."""


class BatchAnswer:
    """A batch's whole answer, which every member is sent. ``raw_head``: the apiserver's head
    as it came, when it may go on unchanged (HTTP/1.1, nothing hop-by-hop, one Content-Length,
    the body's); a member whose connection stays open is sent it and the body, not a head
    built again from parsed headers. :attr:`headers` are parsed and filtered the first time a
    member needs them (bench/README.md, "Instructions per request")."""

    __slots__ = ("_headers", "_upstream", "body", "raw_head", "reason", "status")

    def __init__(self, upstream: UpstreamResponse, body: bytes) -> None:
        self.status = upstream.status
        self.reason = upstream.reason
        self.body = body
        self.raw_head = upstream.raw_head if upstream.head_passes_with(body) else None
        self._upstream = upstream  # released: it holds its head, not its connection
        self._headers: CIMultiDict[str] | None = None

    @property
    def headers(self) -> CIMultiDict[str]:
        """The upstream headers a member's own head carries, without Content-Length (each
        member's answer says its own)."""
        if self._headers is None:
            self._headers = response_headers(self._upstream.headers, keep_length=False)
        return self._headers

    def whole(self) -> Answer:
        """This answer as the value a member's head is built from (its headers parsed)."""
        return Answer(self.status, self.reason, self.headers, self.body)


def key_fields(headers: Mapping[str, str]) -> KeyFields:
    """The headers' part of a batch's key: all of them but those that do not change the
    answer."""
    pairs = [(name.lower(), value) for name, value in headers.items()]
    return tuple(sorted(p for p in pairs if p[0] not in _NOT_IN_KEY))


@dataclass(slots=True)
class Batch:
    path: str
    headers: CIMultiDict[str] | HeaderBlock
    forwarded_auth: str | None
    answer: asyncio.Future[BatchAnswer | Streamed | ProxyError | None]
    counted_in: Counting  # the metric that counts this batch's upstream request
    members: int = 0  # requests waiting for the answer
    fetch: asyncio.Task[None] | None = None  # its upstream request, once sent


@dataclass(slots=True)
class _KeyState:
    in_flight: Batch | None = None
    waiting: Batch | None = None


class ListBatcher:
    """Owns the upstream LIST tasks of every batch; :meth:`close` cancels and awaits them."""

    def __init__(
        self,
        forwarder: Outgoing,
        *,
        max_bytes: int,
        metrics: Metrics,
        stream: bool = True,
        budget: BodyBudget | None = None,
    ) -> None:
        self.forwarder = forwarder  # its upstream, and which headers go there
        self.upstream = forwarder.upstream
        # Streaming: the most one batch holds for its slowest member; else the largest answer
        # it shares (held whole).
        self.max_bytes = max_bytes
        # What every streamed batch holds together (limits.max_buffered_list_bytes).
        self.budget = budget or BodyBudget(0)
        # An answer over max_bytes is streamed to the members (else: None, they pass through).
        self.stream = stream
        self._keys: dict[Key, _KeyState] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        # The key's fields of a shared outgoing block (``ListRequest.shared``), by its id.
        self._fields: dict[int, tuple[HeaderBlock, KeyFields]] = {}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def answer(self, request: ListRequest) -> BatchAnswer | StreamedAnswer | None:
        """The answer of this request's batch, as a value the API port writes as it is; None:
        pass it through on its own."""
        headers, auth, fields = self._outgoing_of(request)
        answer = await self.shared_answer(
            request.raw_path, headers, auth, counted_in=self._metrics.list_batches, fields=fields
        )
        if answer is None:
            return None
        if isinstance(answer, ProxyError):
            raise answer.with_traceback(None)  # one error object, raised once per member
        self._metrics.lists_batched.inc()
        return answer

    def _outgoing_of(
        self, request: ListRequest
    ) -> tuple[CIMultiDict[str] | HeaderBlock, str | None, KeyFields]:
        """What goes upstream for ``request``'s headers, the credential, and the key's fields;
        for a shared header block worked out once, by the pass-through that sends its GETs."""
        if not request.shared:
            headers, auth = self.forwarder.outgoing_headers(request.headers)
            return headers, auth, key_fields(headers)
        block, auth = self.forwarder.outgoing_of_shared(request.headers)
        # By identity: the entry holds the block, so no other object can take its id.
        entry = self._fields.get(id(block))
        if entry is not None and entry[0] is block:
            return block, auth, entry[1]
        if len(self._fields) >= _FIELDS_KEPT:
            self._fields.clear()
        fields = key_fields(block.fields)
        self._fields[id(block)] = (block, fields)
        return block, auth, fields

    async def shared_answer(
        self,
        path: str,
        headers: CIMultiDict[str] | HeaderBlock,
        auth: str | None,
        *,
        counted_in: Counting,
        fields: KeyFields | None = None,
    ) -> BatchAnswer | StreamedAnswer | ProxyError | None:
        """The answer to ``GET path`` from an upstream request sent after this call began,
        shared with every identical call waiting at the same time; None: too big to share.
        ``path`` may be a client's target as it came: what goes upstream (and is shared) is its
        canonical form, the path its route was judged on. ``fields``: the headers' part of the
        key (:func:`key_fields`), when the caller has it."""
        path = canonical_target(path)
        if fields is None:
            fields = key_fields(headers.fields if isinstance(headers, HeaderBlock) else headers)
        key: Key = (path, fields, auth)
        state = self._keys.setdefault(key, _KeyState())
        batch = state.waiting
        if batch is None:
            loop = self._loop
            if loop is None:  # once: each lookup is a getpid() on 3.11
                loop = self._loop = asyncio.get_running_loop()
            batch = Batch(path, headers, auth, loop.create_future(), counted_in)
            if state.in_flight is None:
                self._send(key, state, batch)
            else:
                state.waiting = batch
        batch.members += 1
        claimed = False
        try:
            outcome = await _outcome(batch.answer)
            if isinstance(outcome, Streamed):
                claimed = True  # no await from here to the caller, who reads it or leaves it
                return outcome.claim()
            return outcome
        finally:
            batch.members -= 1
            if batch.members == 0 and not batch.answer.done():
                self._abandon(key, state, batch)
            elif not claimed and batch.answer.done() and not batch.answer.cancelled():
                late = batch.answer.result()
                if isinstance(late, Streamed):  # it left as the answer came: its reader too
                    late.claim().leave()

    def _abandon(self, key: Key, state: _KeyState, batch: Batch) -> None:
        """Nobody waits for ``batch`` any more: it is not sent, or its request is ended."""
        if state.waiting is batch:
            state.waiting = None
            if state.in_flight is None and self._keys.get(key) is state:
                del self._keys[key]
        elif batch.fetch is not None:
            batch.fetch.cancel()  # _fetch then sends the next batch, if one waits

    def _send(self, key: Key, state: _KeyState, batch: Batch) -> None:
        state.in_flight = batch
        batch.counted_in.inc()
        # The loop's own create_task: asyncio.create_task is a Python function on 3.11.
        loop = batch.answer.get_loop()
        task = loop.create_task(self._fetch(key, state, batch), name="watchproxy-list-batch")
        batch.fetch = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, key: Key, state: _KeyState, batch: Batch) -> None:
        answer: BatchAnswer | Streamed | ProxyError | None = None
        try:
            answer = await self._read(batch)
        finally:
            if not batch.answer.done():
                batch.answer.set_result(answer)
            state.in_flight = None
            waiting, state.waiting = state.waiting, None
            if waiting is not None:
                self._send(key, state, waiting)
            elif self._keys.get(key) is state:
                del self._keys[key]

    async def _read(self, batch: Batch) -> BatchAnswer | Streamed | ProxyError | None:
        try:
            upstream = await self.upstream.open(
                "GET",
                batch.path,
                headers=batch.headers,
                verb="list",
                wait=False,
                forwarded_auth=batch.forwarded_auth,
            )
        except ProxyError as error:
            return error
        ended = False
        shared: SharedBody | None = None
        # Held whole: up to the smaller of max_bytes and, when streaming, one paced piece.
        whole_max = min(self.max_bytes, PACED_BODY_BYTES) if self.stream else self.max_bytes
        try:
            length = upstream.content_length
            body = upstream.whole_body()
            if body is not None and len(body) <= whole_max:
                ended = True
                return BatchAnswer(upstream, body)
            chunks: list[bytes] = [] if body is None else [body]
            size = len(body) if body is not None else 0
            if (length is not None and length > whole_max) or size > whole_max:
                if not self.stream:
                    return None
                shared = self._share(batch, upstream, chunks)
            if body is None:
                # (No ``continue`` here: mypyc miscompiles one inside try/finally.)
                async for chunk in upstream.chunks():
                    if shared is not None:
                        if not await shared.put(chunk):
                            return None  # every member left: the upstream request ends
                    else:
                        size += len(chunk)
                        chunks.append(chunk)
                        if size > whole_max:
                            if not self.stream:
                                return None
                            shared = self._share(batch, upstream, chunks)
                            chunks = []
            ended = True
            if shared is not None:
                shared.end()
                return None  # the members have it already
            return BatchAnswer(upstream, b"".join(chunks))
        except ProxyError as error:
            log.info("a batched LIST broke: %s", error.message)
            if shared is not None:
                shared.end(error.message)
            return error
        finally:
            if shared is not None and not ended:
                shared.end("the shared answer ended early")  # cancelled: nobody reads it
            if ended:
                upstream.release()
            else:
                upstream.cut()

    def _share(self, batch: Batch, upstream: UpstreamResponse, chunks: list[bytes]) -> SharedBody:
        """The batch's answer, too big to hold whole, given to its members as it goes on."""
        # A new dict, without Content-Length (each member's answer says its own).
        headers = response_headers(upstream.headers, keep_length=False)
        status, reason = upstream.status, upstream.reason
        # The window is taken from the budget of every streamed batch; one piece at least, so
        # that a batch always moves (beyond the budget by that piece at most).
        taken = self.budget.take_at_most(self.max_bytes)
        shared = SharedBody(
            chunks,
            batch.members,
            window=max(taken, PACED_BODY_BYTES),
            slow_seconds=SLOW_READER_SECONDS,
            released=lambda: self.budget.give(taken),
        )
        if not batch.answer.done():
            batch.answer.set_result(Streamed(status, reason, headers, shared))
        self._metrics.list_batches_streamed.inc()
        return shared
