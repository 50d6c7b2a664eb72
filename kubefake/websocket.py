"""Watches over WebSocket, as kube-apiserver 1.37 serves them (``WatchServer.HandleWS`` on
``golang.org/x/net/websocket``), built on aiohttp's own WebSocket server.

What the apiserver does and this fake does alike: no ``Origin`` header is a bare 403 (x/net's
``websocket.Handler`` refuses a "null origin"); more than one offered subprotocol a bare 400;
one is echoed. Each event is one text message, the event's JSON line with its ``\\n``. Pings
are answered, the client's messages are read and dropped, and the client's close ends the
watch. The watch's end (its timeout, the one ERROR of an expired resourceVersion) is a close
frame with status 1000 and no reason.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from .context import CUT, OpenStream

# How long the end of a watch waits for the client's answering close (the apiserver closes
# its side at once; aiohttp's server waits for the answer, a client answers at once).
CLOSE_WAIT_SECONDS = 1.0


def is_websocket(request: web.Request) -> bool:
    """The apiserver's ``wsstream.IsWebSocketRequest``."""
    if request.headers.get("Upgrade", "").strip().lower() != "websocket":
        return False
    connection = request.headers.get("Connection", "").lower()
    return "upgrade" in (token.strip() for token in connection.split(","))


def _offered(request: web.Request) -> list[str]:
    offered = request.headers.get("Sec-WebSocket-Protocol", "").strip()
    return [p.strip() for p in offered.split(",")] if offered else []


def websocket_refusal(request: web.Request) -> web.Response | None:
    """x/net's refusals of a handshake the watch handler otherwise accepts."""
    if not request.headers.get("Origin"):
        return web.Response(status=403)
    if len(_offered(request)) > 1:
        return web.Response(status=400)
    return None


class WebSocketWatch:
    """A watch response over WebSocket: ``write`` sends one event line as one text message,
    ``write_eof`` the close frame. Owns the task that reads the client's frames; ``close``
    ends it."""

    def __init__(self, request: web.Request, stream: OpenStream) -> None:
        self.response = web.WebSocketResponse(
            protocols=_offered(request),
            autoping=True,
            compress=False,  # x/net speaks no permessage-deflate
            timeout=CLOSE_WAIT_SECONDS,
        )
        self._stream = stream
        self._reader: asyncio.Task[None] | None = None

    async def prepare(self, request: web.Request) -> None:
        await self.response.prepare(request)
        self._reader = asyncio.create_task(self._read_client())

    async def _read_client(self) -> None:
        async for _message in self.response:
            pass  # a watch client has nothing to say; pings are answered by autoping
        self._stream.queue.put_nowait(CUT)  # the client closed: the watch ends

    async def write(self, line: bytes) -> None:
        if self.response.closed:
            raise ConnectionResetError("the WebSocket watch client has gone")
        try:
            await self.response.send_str(line.decode())
        except (RuntimeError, OSError) as error:
            raise ConnectionResetError(str(error)) from None

    async def write_eof(self) -> None:
        await self._stop_reading()
        if not self.response.closed:
            await self.response.close(code=1000)

    async def _stop_reading(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def close(self) -> None:
        await self._stop_reading()
