"""exec, attach and port-forward: any protocol upgrade relayed as raw bytes.

kubectl >= 1.30 speaks the remote-command protocol over WebSocket, older kubectl (and client-go's
SPDY executor, still the fallback in every version) over SPDY/3.1; port-forward is SPDY, or SPDY
tunnelled in WebSocket since 1.31. The relay does not need to know which: it sends the request
upstream with the proxy's credential and the client's Upgrade and protocol headers, and a
refusal (401, 403, 404, 400) reaches the client with the apiserver's own status and Status
body. On 101 it answers the client with the apiserver's 101 headers and copies bytes both ways
until either side closes, then closes both. A client's FIN (Go's clients shut down their
sending side at the end of a session and keep reading) ends only the client-to-apiserver
direction: what the apiserver still sends reaches the client, until the apiserver ends the
session or sends nothing for HALF_CLOSED_IDLE seconds (the FIN may also mean the client is
gone, and over TLS it cannot be passed on).

When the apiserver ends a session, the client may still have megabytes to read (they wait in
the relay's write buffer, the kernel's send queue and the client's receive buffer). The relay
sends its FIN after the last byte and keeps the connection open, reading and dropping what
the client still sends, until the client closes its side: a socket closed while the peer
still sends is answered with a reset, and a reset empties the kernel's send queue, so the
client would lose the tail it had not read yet (see :class:`Linger`).

Taking the client's connection over: a request that asks to switch protocols is the last one
the connection parses (``server.protocol``); ``Response.take_over`` routes every byte after it
to the relay, whatever the protocol. It is taken before the 101 is written, so no byte of the
new protocol can reach the HTTP parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import math
import struct
import termios

from multidict import CIMultiDict

from watchproxy.errors import BadRequest
from watchproxy.kube.apipath import canonical_target
from watchproxy.kube.headers import forwarded_credential, request_headers, response_headers
from watchproxy.server.http import Request
from watchproxy.server.protocol import Response
from watchproxy.upstream.client import Upstream, UpstreamResponse

log = logging.getLogger("watchproxy.upgrade")

READ_CHUNK = 1 << 16
# Bytes from the client held before its socket stops being read.
CLIENT_BUFFER = 1 << 16
# After a client's FIN, the session ends once the apiserver has sent nothing for this long.
HALF_CLOSED_IDLE = 2.0
# After the apiserver's end of a session: the client's connection is closed once the client
# has made no progress for LINGER_IDLE seconds (none of the bytes still on their way to it was
# taken, and it sent nothing), and LINGER_LIMIT seconds after the end at the latest.
LINGER_IDLE = 5.0
LINGER_LIMIT = 60.0
# How often a lingering connection's progress is looked at (the kernel's send queue shrinking
# is no event the loop can wait for).
LINGER_LOOK = 0.2


class _ClientBytes:
    """The connection's tunnel after the switch: every byte the client sends after the request
    head is buffered here for the pump, and the socket stops being read while more than
    CLIENT_BUFFER bytes wait (backpressure)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._paused = False
        self._arrived = asyncio.Event()
        self.half_closed = False
        """The client shut down its sending side (FIN) and still reads."""
        self._discarding = False
        self.discarded = 0
        """Bytes the client sent after :meth:`discard` (dropped)."""
        self.ended = asyncio.Event()
        """Set at the client's end of stream (its FIN, or the connection's loss)."""

    def eof_received(self) -> bool:
        """The client's FIN: True keeps the transport open, for what the apiserver still sends
        to a client that has only finished sending, as Go's clients do at a session's end."""
        self.half_closed = True
        self.feed_eof()
        return True

    def discard(self) -> None:
        """From now on the client's bytes are dropped as they arrive (the session is over)."""
        self._discarding = True
        self._chunks.clear()
        self._size = 0
        self._resume()

    def _resume(self) -> None:
        """Read the client's socket again, if it was paused for a full buffer."""
        transport = self._transport
        if self._paused and transport is not None and not transport.is_closing():
            self._paused = False
            transport.resume_reading()

    def feed_data(self, data: bytes) -> None:
        if self._discarding:
            self.discarded += len(data)
            return
        if data:
            self._chunks.append(data)
            self._size += len(data)
            self._arrived.set()
            transport = self._transport
            if self._size > CLIENT_BUFFER and not self._paused and transport is not None:
                self._paused = True
                transport.pause_reading()

    def feed_eof(self) -> None:
        self._eof = True
        self._arrived.set()
        self.ended.set()

    async def read(self) -> bytes:
        """All bytes buffered so far, waiting for some; b"" at the client's end of stream."""
        while not self._chunks and not self._eof:
            self._arrived.clear()
            await self._arrived.wait()
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        self._resume()
        return data


def _switching_headers(answer: UpstreamResponse) -> CIMultiDict[str]:
    headers = response_headers(answer.headers, keep_length=False)
    for name in ("Date", "Server"):
        headers.popall(name, None)
    headers["Connection"] = "Upgrade"
    headers["Upgrade"] = answer.headers.get("Upgrade", "")
    return headers


async def _client_to_upstream(source: _ClientBytes, sink: asyncio.StreamWriter) -> None:
    while chunk := await source.read():
        sink.write(chunk)
        await sink.drain()
    # The client's end of stream, passed on as the apiserver would have seen it directly.
    if source.half_closed and sink.can_write_eof():
        sink.write_eof()


async def _upstream_to_client(
    source: asyncio.StreamReader, sink: Response, sent: list[float]
) -> None:
    """Copies until the apiserver's end of stream. ``sent[0]``: since when it has been waiting
    for the apiserver (infinity while it writes to the client: a slow reader is no silence)."""
    loop = asyncio.get_running_loop()
    while chunk := await source.read(READ_CHUNK):
        if sink.client_gone():
            return
        sent[0] = math.inf
        sink.write(chunk)
        await sink.drain()
        sent[0] = loop.time()


async def _until_upstream_quiet(down: asyncio.Task[None], sent: list[float]) -> None:
    """After a client's FIN: until the apiserver ends the session or has sent nothing for
    HALF_CLOSED_IDLE seconds."""
    loop = asyncio.get_running_loop()
    sent[0] = max(sent[0], loop.time())
    while not down.done():
        left = sent[0] + HALF_CLOSED_IDLE - loop.time()
        if left <= 0:
            return
        await asyncio.wait([down], timeout=min(left, HALF_CLOSED_IDLE))


class Linger:
    """When to close a client's connection after the apiserver ended its session (pure: the
    clock and the counts are passed in).

    A client still reading a large output may send while it reads (client-go pings its SPDY
    and WebSocket connections every few seconds; a WebSocket client answers pings). A socket
    that is closed when such bytes arrive answers them with a reset, and the reset empties the
    kernel's send queue: the client loses the tail that was still on its way to it. The fixed
    wait of 2 s for the client's FIN that came before this cut every client that needed longer
    to read what was queued and sent a byte meanwhile (a reader at 800 kB/s of a 3 MB output
    got 1.6 MB: tests/component/test_upgrade_faults.py). So the connection stays open while
    the client makes progress: the bytes still to send shrink, or it sends something. A
    client that makes none for ``idle`` seconds is stuck or gone; after ``limit`` seconds the
    connection is closed however slowly the client reads."""

    def __init__(self, now: float, *, idle: float = LINGER_IDLE, limit: float = LINGER_LIMIT):
        self._idle = idle
        self._end = now + limit
        self._progress_at = now
        self._unsent: int | None = None
        self._received = 0

    def next_look(self, now: float, unsent: int, received: int) -> float | None:
        """Seconds until progress is looked at again, or None: close the connection now.
        ``unsent``: bytes not yet taken by the client (our buffer and the kernel's send queue);
        ``received``: bytes the client sent since the end, in all."""
        if self._unsent is None or unsent < self._unsent or received > self._received:
            self._progress_at = now
        self._unsent, self._received = unsent, received
        due = min(self._progress_at + self._idle, self._end)
        if now >= due:
            return None
        return min(LINGER_LOOK, due - now)


def unsent_bytes(transport: asyncio.Transport) -> int:
    """Bytes written to ``transport`` that its peer has not acknowledged yet: its own buffer
    and, on Linux, the socket's send queue (TIOCOUTQ, the same number as SIOCOUTQ: bytes not
    sent or not acknowledged)."""
    unsent = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):
            (queued,) = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))
            unsent += queued
    return unsent


async def _close_gracefully(transport: asyncio.Transport, client: _ClientBytes) -> None:
    """The apiserver ended the session: send the client our FIN after the last bytes, and read
    (and drop) what it still sends until its own FIN, for as long as :class:`Linger` says."""
    if transport.is_closing() or not transport.can_write_eof():
        return
    client.discard()
    transport.write_eof()
    loop = asyncio.get_running_loop()
    linger = Linger(loop.time())
    while not client.ended.is_set():
        delay = linger.next_look(loop.time(), unsent_bytes(transport), client.discarded)
        if delay is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(client.ended.wait(), delay)


class UpgradeRelay:
    """Serves upgrade requests on pods/exec, pods/attach and pods/portforward."""

    def __init__(
        self, upstream: Upstream, *, forward_identity: bool, forward_impersonation: bool = False
    ) -> None:
        self.upstream = upstream
        self.forward_identity = forward_identity
        self.forward_impersonation = forward_impersonation
        self._sessions: set[asyncio.Task[None]] = set()  # every session's two pumps
        self._lingering: set[_ClientBytes] = set()  # sessions waiting for their client to close

    def close_sessions(self) -> None:
        """At shutdown: end every relayed session now, not after the shutdown grace. Its pumps
        are cancelled, and a session that waits for its client to close stops waiting; its
        handler, which owns both connections, then closes them."""
        for pump in list(self._sessions):
            pump.cancel()
        for client in list(self._lingering):
            client.ended.set()

    async def relay(self, request: Request, response: Response) -> None:
        if request.has_body:
            raise BadRequest("an upgrade request carries no body")
        headers = request_headers(
            request.headers,
            forward_identity=self.forward_identity,
            forward_impersonation=self.forward_impersonation,
        )
        upgrade = request.headers.get("Upgrade")
        if upgrade:
            headers["Connection"] = "Upgrade"
            headers["Upgrade"] = upgrade
        answer = await self.upstream.open_upgrade(
            request.method,
            canonical_target(request.target),  # what the router judged, decoded
            headers=headers,
            forwarded_auth=forwarded_credential(request.headers, self.forward_identity),
        )
        try:
            if not answer.switched:
                response.send(
                    answer.status,
                    "",
                    response_headers(answer.headers, keep_length=False),
                    await answer.read(),
                )
                return
            await self._pipe(request, response, answer)
        finally:
            await answer.close()

    async def _pipe(self, request: Request, response: Response, answer: UpstreamResponse) -> None:
        client = _ClientBytes()
        # Before the 101: no byte of the new protocol can reach the HTTP parser.
        upstream_reader, upstream_writer = answer.take_stream()
        transport = response.take_over(client)
        client._transport = transport
        try:
            response.start(101, "Switching Protocols", _switching_headers(answer))
            sent = [0.0]
            up = asyncio.create_task(_client_to_upstream(client, upstream_writer))
            down = asyncio.create_task(_upstream_to_client(upstream_reader, response, sent))
            pumps = [up, down]
            self._sessions.update(pumps)
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                # A client that only finished sending still reads until the apiserver ends
                # the session; a client that went away, or an upstream that ended, ends it now.
                if client.half_closed and up.done() and not up.cancelled() and not up.exception():
                    await _until_upstream_quiet(down, sent)
            finally:
                self._sessions.difference_update(pumps)
                for pump in pumps:
                    pump.cancel()
                outcomes = await asyncio.gather(*pumps, return_exceptions=True)
            if down.done() and not down.cancelled() and down.exception() is None:
                self._lingering.add(client)
                try:
                    await _close_gracefully(transport, client)
                finally:
                    self._lingering.discard(client)
        finally:
            transport.close()
        for outcome in outcomes:
            if isinstance(outcome, ConnectionError | OSError):
                log.info("a relayed upgrade ended abruptly: %s (%s)", request.path, outcome)
            elif isinstance(outcome, Exception):
                raise outcome
