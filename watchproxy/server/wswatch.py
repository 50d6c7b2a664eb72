"""A hub-served watch over WebSocket: the 101, one message per event, the client's control frames.

fabric8 kubernetes-client asks for a WebSocket on every watch by default; the apiserver serves
it (see :mod:`watchproxy.kube.websocket` for how, exactly). Here the hub serves it like any
other watch, through a :class:`WebSocketSink`: the same shared lines, the same per-client start
point, bookmarks, deadline, in-stream 410 and slow-client bounds, only each event goes out as
one WebSocket message instead of as part of an HTTP chunk.

The connection is taken over as :mod:`watchproxy.server.upgrade` does, before the 101 goes
out, so every byte the client sends afterwards reaches :class:`_ClientControl`, which answers
pings and ends the stream on the client's close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from watchproxy.kube import websocket
from watchproxy.server.protocol import Response

log = logging.getLogger("watchproxy.server")


def encodes_as_text(content_type: str) -> bool:
    """Whether the apiserver sends this media type's watch events as text messages
    (its serializer's ``EncodesAsText``: JSON and YAML, not protobuf or CBOR)."""
    media = content_type.partition(";")[0].strip().lower()
    return media in ("application/json", "application/yaml")


class _ClientControl:
    """The connection's tunnel once the 101 is decided: reads the client's frames, answers a
    ping with a pong, and a close (or a frame x/net refuses) with a close frame and the end of
    the connection, as the apiserver does."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._frames = websocket.ClientFrames()

    def feed_data(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        try:
            controls = self._frames.feed(data)
        except websocket.ProtocolError:
            transport.write(websocket.close_frame(websocket.CLOSE_PROTOCOL_ERROR))
            transport.close()
            return
        for control in controls:
            if control.opcode == websocket.PING:
                transport.write(websocket.frame(websocket.PONG, control.payload))
            elif control.opcode == websocket.CLOSE:
                transport.write(websocket.close_frame())
                transport.close()
                break

    def eof_received(self) -> bool:
        self.feed_eof()
        return False  # the stream ends with the client's FIN, as the apiserver's does

    def feed_eof(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class WebSocketSink:
    """One client's watch over WebSocket, 101 already sent: every event one message.

    ``frame`` turns the hub's batch of events (lines, or length-prefixed frames for protobuf)
    into one message each, the same bytes for every WebSocket client of the key; ``write_eof``
    is the close frame (status 1000) and the end of the connection."""

    def __init__(self, transport: asyncio.Transport, writer: Response, *, binary: bool) -> None:
        self._transport = transport
        self._writer = writer
        self._binary = binary
        self._high = transport.get_write_buffer_limits()[1]
        # Text and binary sinks frame the same events differently: the fan-out keeps one
        # framing per coding.
        self.coding = "websocket-binary" if binary else "websocket-text"

    def frame(self, data: bytes) -> bytes:
        return websocket.frame_events(data, binary=self._binary)

    def send_framed(self, framed: bytes) -> bool:
        transport = self._transport
        if transport.is_closing():
            return False
        transport.write(framed)
        return transport.get_write_buffer_size() <= self._high

    def send_lines(self, lines: Sequence[bytes], size: int) -> bool:
        transport = self._transport
        if transport.is_closing():
            return False
        transport.writelines(websocket.frame_lines(lines, binary=self._binary))
        return transport.get_write_buffer_size() <= self._high

    async def drain(self) -> None:
        if self.client_gone():
            raise ConnectionResetError("the watch client has gone")
        await self._writer.drain()

    async def write(self, data: bytes) -> None:
        if not self.send_framed(self.frame(data)):
            await self.drain()

    async def write_eof(self) -> None:
        transport = self._transport
        if not transport.is_closing():
            transport.write(websocket.close_frame())
            transport.close()

    def client_gone(self) -> bool:
        return self._transport.is_closing()

    def abort(self) -> None:
        self._transport.abort()

    def close(self) -> None:
        self._transport.close()


class WebSocketStarter:
    """Answers the client's handshake with the 101 when the hub is ready to stream (a refusal
    before that is a plain HTTP answer, as the apiserver's)."""

    def __init__(self, response: Response, handshake: websocket.Handshake) -> None:
        self._response = response
        self._handshake = handshake

    async def start(self, content_type: str) -> WebSocketSink:
        response = self._response
        if response.client_gone():
            raise ConnectionResetError("the watch client has gone")
        control = _ClientControl()
        # Before the 101: no byte of the client's frames can reach the HTTP parser.
        transport = control.transport = response.take_over(control)
        response.start(101, "Switching Protocols", dict(self._handshake.switching_headers()))
        return WebSocketSink(transport, response, binary=not encodes_as_text(content_type))
