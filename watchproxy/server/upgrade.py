"""exec, attach and port-forward: any protocol upgrade relayed as raw bytes.

kubectl >= 1.30 speaks the remote-command protocol over WebSocket, older kubectl (and client-go's
SPDY executor, still the fallback in every version) over SPDY/3.1; port-forward is SPDY, or SPDY
tunnelled in WebSocket since 1.31. The relay does not need to know which: it sends the request
upstream with the proxy's credential and the client's Upgrade and protocol headers, and a
refusal (401, 403, 404, 400) reaches the client with the apiserver's own status and Status
body. On 101 it answers the client with the apiserver's 101 headers and copies bytes both ways
until either side closes, then closes both.

Taking the client's connection over: a request that asks to switch protocols is the last one
the connection parses (``server.protocol``); ``Response.take_over`` routes every byte after it
to the relay, whatever the protocol. It is taken before the 101 is written, so no byte of the
new protocol can reach the HTTP parser.
"""

from __future__ import annotations

import asyncio
import logging

from multidict import CIMultiDict

from watchproxy.errors import BadRequest
from watchproxy.kube.apipath import canonical_target
from watchproxy.kube.headers import forwarded_credential, request_headers, response_headers
from watchproxy.server.http import Request
from watchproxy.server.protocol import Response
from watchproxy.upstream.client import Upstream
from watchproxy.upstream.upgrade import UpgradeAnswer

log = logging.getLogger("watchproxy.upgrade")

READ_CHUNK = 1 << 16
# Bytes from the client held before its socket stops being read.
CLIENT_BUFFER = 1 << 16


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

    def feed_data(self, data: bytes) -> None:
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

    async def read(self) -> bytes:
        """All bytes buffered so far, waiting for some; b"" at the client's end of stream."""
        while not self._chunks and not self._eof:
            self._arrived.clear()
            await self._arrived.wait()
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        transport = self._transport
        if self._paused and transport is not None and not transport.is_closing():
            self._paused = False
            transport.resume_reading()
        return data


def _switching_headers(answer: UpgradeAnswer) -> CIMultiDict[str]:
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


async def _upstream_to_client(source: asyncio.StreamReader, sink: Response) -> None:
    while chunk := await source.read(READ_CHUNK):
        if sink.client_gone():
            return
        sink.write(chunk)
        await sink.drain()


class UpgradeRelay:
    """Serves upgrade requests on pods/exec, pods/attach and pods/portforward."""

    def __init__(
        self, upstream: Upstream, *, forward_identity: bool, forward_impersonation: bool = False
    ) -> None:
        self.upstream = upstream
        self.forward_identity = forward_identity
        self.forward_impersonation = forward_impersonation
        self._sessions: set[asyncio.Task[None]] = set()  # every session's two pumps

    def close_sessions(self) -> None:
        """At shutdown: end every relayed session now, not after the shutdown grace. Its pumps
        are cancelled; its handler, which owns both connections, then closes them."""
        for pump in list(self._sessions):
            pump.cancel()

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
                    answer.body,
                )
                return
            await self._pipe(request, response, answer)
        finally:
            await answer.close()

    async def _pipe(self, request: Request, response: Response, answer: UpgradeAnswer) -> None:
        client = _ClientBytes()
        # Before the 101: no byte of the new protocol can reach the HTTP parser.
        transport = response.take_over(client)
        client._transport = transport
        try:
            response.start(101, "Switching Protocols", _switching_headers(answer))
            pumps = [
                asyncio.create_task(_client_to_upstream(client, answer.writer)),
                asyncio.create_task(_upstream_to_client(answer.reader, response)),
            ]
            self._sessions.update(pumps)
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._sessions.difference_update(pumps)
                for pump in pumps:
                    pump.cancel()
                outcomes = await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            transport.close()
        for outcome in outcomes:
            if isinstance(outcome, ConnectionError | OSError):
                log.info("a relayed upgrade ended abruptly: %s (%s)", request.path, outcome)
            elif isinstance(outcome, Exception):
                raise outcome
