"""Protocol upgrades (exec, attach, port-forward) opened to the apiserver as raw byte streams.

aiohttp's client speaks WebSocket only, and parses whatever follows a 101 it does not know
(``Upgrade: SPDY/3.1``) as the next HTTP response. Once the apiserver answers 101, an upgrade
is a byte pipe whatever the protocol, so watchproxy opens its own connection with the upstream's
TLS context, writes the request head itself and reads the answer's head. A 101 hands the open
stream (and any bytes that came with the head) to the relay; any other answer is read whole,
bounded, so that the client gets the apiserver's own status and Status body.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass

from multidict import CIMultiDict
from yarl import URL

from watchproxy.upstream.connector import DialFailed
from watchproxy.upstream.http1 import (
    EndOfMessage,
    ProtocolError,
    ResponseParser,
    encode_head,
    parse_head,
)

MAX_HEAD_BYTES = 65536
READ_CHUNK = 1 << 16
# A refusal is a Status of a few hundred bytes; a bigger body is cut, never buffered unbounded.
MAX_REFUSAL_BYTES = 1 << 20
# How long a closed upstream stream may take over its TLS shutdown before it is aborted.
CLOSE_WAIT_SECONDS = 2.0


class BadAnswer(Exception):
    """The apiserver's answer to an upgrade is not HTTP/1.1."""


@dataclass(eq=False)  # one answer per connection: compared and hashed by identity
class UpgradeAnswer:
    """The apiserver's answer: 101 with the stream open, or a refusal with its body read."""

    status: int
    headers: CIMultiDict[str]
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def switched(self) -> bool:
        return self.status == 101

    async def close(self) -> None:
        """Close the upstream stream (its one owner calls this once)."""
        self.writer.close()
        try:
            async with asyncio.timeout(CLOSE_WAIT_SECONDS):
                await self.writer.wait_closed()
        except (TimeoutError, OSError, ssl.SSLError):
            # The peer never finished the TLS shutdown: nothing more can arrive; drop it.
            self.writer.transport.abort()


def _keep_alive(writer: asyncio.StreamWriter) -> None:
    """An exec session may be silent for hours, so silence cannot mean a dead apiserver; TCP
    keepalive probes find a peer that vanished (half-open) within about a minute instead."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):  # Linux; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


async def read_refusal_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    """The body of the non-101 answer whose head is ``head``, framed by the same parser as
    every other answer from the apiserver (Content-Length, chunks, or up to the close); cut at
    MAX_REFUSAL_BYTES. Raises BadAnswer when the body breaks off or does not parse."""
    parser = ResponseParser()
    parser.expect()
    body = bytearray()
    try:
        events = parser.feed(head)
        while True:
            for event in events:
                if isinstance(event, EndOfMessage):
                    return bytes(body[:MAX_REFUSAL_BYTES])
                if isinstance(event, bytes):
                    body += event
            if len(body) >= MAX_REFUSAL_BYTES:
                return bytes(body[:MAX_REFUSAL_BYTES])
            data = await reader.read(READ_CHUNK)
            events = parser.feed(data) if data else parser.feed_eof()
            if not data and not events:  # pragma: no cover - the parser ends or raises at EOF
                raise ProtocolError("the connection closed before the answer's end")
    except ProtocolError:
        raise BadAnswer("the apiserver's answer broke off") from None


async def open_upgrade(
    server: str,
    ssl_context: ssl.SSLContext | None,
    method: str,
    target: str,
    headers: CIMultiDict[str],
    *,
    connect_timeout: float,
    answer_timeout: float,
) -> UpgradeAnswer:
    """Send an upgrade request to ``server`` and read the head of its answer.

    Raises DialFailed when no connection can be made, TimeoutError when the head does not come
    in time, BadAnswer or OSError when the answer breaks off.
    """
    url = URL(server)
    secure = url.scheme == "https"
    context = (ssl_context or ssl.create_default_context()) if secure else None
    assert url.host is not None and url.port is not None
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(
                url.host, url.port, ssl=context, limit=MAX_HEAD_BYTES
            )
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        raise DialFailed(exc, url.host, url.port) from None
    _keep_alive(writer)
    try:
        host = url.raw_authority.rpartition("@")[2]
        writer.write(encode_head(method, target, host, headers))
        async with asyncio.timeout(answer_timeout):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                raise BadAnswer(f"response head longer than {MAX_HEAD_BYTES} bytes") from None
            except asyncio.IncompleteReadError:
                raise BadAnswer("the apiserver closed the connection before answering") from None
            try:
                status, _reason, answer_headers, _http10 = parse_head(head)
            except ProtocolError as error:
                raise BadAnswer(str(error)) from None
            body = b""
            if status != 101:
                body = await read_refusal_body(reader, head)
    except BaseException:
        writer.transport.abort()
        raise
    return UpgradeAnswer(status, answer_headers, body, reader, writer)
