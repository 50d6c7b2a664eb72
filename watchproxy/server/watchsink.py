"""The hub's client side, made of aiohttp: a watch response as a :class:`WatchSink`.

:class:`HubEndpoint` is what the API handler sees as its ``WatchServer``: it hands the hub the
request's path, query and headers and a starter that sends the 200 when the hub is ready, and
turns what the hub answers into aiohttp responses, so that the hub itself never sees aiohttp.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from watchproxy.hub.multiplexer import Hub, Refusal
from watchproxy.hub.watchkey import Unservable
from watchproxy.kube import websocket
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.contentcoding import GZIP, IDENTITY, gzip_member, watch_coding
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.lists.answers import StreamedAnswer
from watchproxy.lists.cached import CachedLists
from watchproxy.lists.ports import ListRequest
from watchproxy.lists.sharedaccess import SharedAccess
from watchproxy.server.clientgone import started
from watchproxy.server.wswatch import WebSocketStarter


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk, as aiohttp's chunked writer frames it."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


class ResponseSink:
    """One client's prepared watch response (chunked, uncompressed).

    The hub's fan-out writes pre-framed chunks straight to the transport (``send_framed``);
    aiohttp's writer is used for the rest (``write``, ``write_eof``) and for ``drain``, which
    waits on the protocol's ``pause_writing``/``resume_writing``. Both go through the same
    transport in call order, so the chunks stay in order.
    """

    def __init__(
        self, request: web.Request, response: web.StreamResponse, writer: AbstractStreamWriter
    ) -> None:
        self._request = request
        self._response = response
        self._writer = writer
        transport = request.transport
        self._high = transport.get_write_buffer_limits()[1] if transport is not None else 0
        # Kept for send_framed, the fan-out's per-event call (``request.transport`` is a
        # property lookup). aiohttp drops the request's reference when the connection is lost;
        # this one then answers is_closing() True, which is all send_framed asks of it.
        self._transport = transport

    coding = IDENTITY
    frame = staticmethod(chunk)

    def send_framed(self, framed: bytes) -> bool:
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        transport.write(framed)
        return transport.get_write_buffer_size() <= self._high

    def send_lines(self, lines: Sequence[bytes], size: int) -> bool:
        transport = self._request.transport
        if transport is None or transport.is_closing():
            return False
        transport.writelines([b"%x\r\n" % size, *lines, b"\r\n"])
        return transport.get_write_buffer_size() <= self._high

    async def drain(self) -> None:
        if self.client_gone():
            raise ConnectionResetError("the watch client has gone")
        await self._writer.drain()

    async def write(self, data: bytes) -> None:
        try:
            await self._response.write(data)
        except RuntimeError as error:  # aiohttp: writing to a transport that is closing
            raise ConnectionResetError(str(error)) from None

    async def write_eof(self) -> None:
        try:
            await self._response.write_eof()
        except RuntimeError as error:
            raise ConnectionResetError(str(error)) from None

    def client_gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.abort()

    def close(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.close()


def gzip_chunk(data: bytes) -> bytes:
    """``data`` as one gzip member in one HTTP/1.1 chunk."""
    return chunk(gzip_member(data))


class GzipResponseSink(ResponseSink):
    """A watch response with ``Content-Encoding: gzip``: every write is one gzip member.

    What a client that asks for gzip gets, as kube-apiserver 1.37 gives it (see
    :mod:`watchproxy.kube.contentcoding`). The fan-out compresses each batch of events once per
    coding and hands the same member to every gzip client writing those events; a client's own
    initial events and bookmarks are compressed for it alone, as the apiserver does for each of
    its clients.
    """

    coding = GZIP
    frame = staticmethod(gzip_chunk)

    def send_lines(self, lines: Sequence[bytes], size: int) -> bool:
        # Compressing copies the lines anyway: one member of them all, in one chunk.
        return self.send_framed(gzip_chunk(b"".join(lines)))

    async def write(self, data: bytes) -> None:
        await super().write(gzip_member(data))


class _Starter:
    """Sends the watch's 200 and headers when the hub asks; keeps the response to return."""

    def __init__(self, request: web.Request, coding: str) -> None:
        self._request = request
        self._coding = coding
        self.response: web.StreamResponse | None = None

    async def start(self, content_type: str) -> ResponseSink:
        response = web.StreamResponse(status=200)
        response.headers["Content-Type"] = content_type
        response.enable_chunked_encoding()
        response.headers["Cache-Control"] = "no-cache, private"
        gzipped = self._coding == GZIP
        if gzipped:
            response.headers["Content-Encoding"] = GZIP
            response.headers.add("Vary", "Accept-Encoding")
        self.response = response
        writer = await response.prepare(self._request)
        started(self._request, response)
        if writer is None:  # pragma: no cover - prepare returns the writer it made
            raise ConnectionResetError("the watch response was not prepared")
        sink = GzipResponseSink if gzipped else ResponseSink
        return sink(self._request, response, writer)


class HubEndpoint:
    """The hub behind the API handler's ``WatchServer`` protocol; its LISTs with
    resourceVersion=0 are answered by ``lists``, from the same shared watches. With ``access``
    (forward identity mode) a watch is served from a shared watch only to a client the
    apiserver authorizes to watch it now."""

    def __init__(self, hub: Hub, lists: CachedLists, access: SharedAccess | None = None) -> None:
        self.hub = hub
        self.lists = lists
        self.access = access

    async def serve(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.StreamResponse | None:
        admitted = await self._admitted(request, api_path, query)
        if admitted is not True:
            # Passed through (the apiserver answers), or the apiserver's 403.
            return admitted if isinstance(admitted, web.Response) else None
        # The apiserver reads only the first Accept-Encoding header; so does headers.get.
        starter = _Starter(request, watch_coding(query, request.headers.get("Accept-Encoding")))
        served = await self.hub.serve(api_path, query, request.headers, starter)
        return self._answer(served, starter)

    async def serve_websocket(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.StreamResponse | None:
        """A watch asked for over WebSocket: served by the hub, one event per message; None
        (relay it) for a handshake the apiserver would refuse, so that it answers it."""
        handshake = websocket.handshake(request.method, request.headers)
        if handshake is None:
            return None
        admitted = await self._admitted(request, api_path, query)
        if admitted is not True:
            # Passed through (the apiserver answers), or the apiserver's 403.
            return admitted if isinstance(admitted, web.Response) else None
        starter = WebSocketStarter(request, handshake)
        served = await self.hub.serve(api_path, query, request.headers, starter)
        return self._answer(served, starter)

    async def _admitted(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.Response | bool:
        """True when the hub may serve this watch; False to pass it through (the apiserver
        answers); or the apiserver's 403. Asked only in forward identity mode, for a watch the
        hub would share; over WebSocket the 403 comes before the handshake, as the apiserver's
        authorization filter answers it."""
        access = self.access
        if access is None or isinstance(
            self.hub.key_of(api_path, query, request.headers), Unservable
        ):
            return True
        return await access.admit(request.headers, "watch", api_path, query)

    @staticmethod
    def _answer(
        served: Refusal | str | None, starter: _Starter | WebSocketStarter
    ) -> web.StreamResponse | None:
        if served is None:
            return None
        if isinstance(served, Refusal):
            answer = web.Response(status=served.status, body=served.body)
            answer.headers["Content-Type"] = served.content_type or "application/json"
            return answer
        if starter.response is None:  # pragma: no cover - the hub streams only after start()
            raise RuntimeError("the hub streamed a watch it never started")
        return starter.response

    async def serve_list(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> web.Response | StreamedAnswer | None:
        return await self.lists.serve(request, api_path, query)
