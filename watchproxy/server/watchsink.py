"""The hub's client side: a watch response as a :class:`WatchSink`.

:class:`HubEndpoint` is what the API handler sees as its ``WatchServer``: it hands the hub the
request's path, query and headers and a starter that sends the 200 when the hub is ready, and
writes what the hub answers otherwise, so that the hub itself never sees the connection.
"""

from __future__ import annotations

from collections.abc import Sequence

from watchproxy.hub.multiplexer import Hub, Refusal
from watchproxy.hub.watchkey import Unservable
from watchproxy.kube import websocket
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.contentcoding import GZIP, IDENTITY, gzip_member, watch_coding
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.lists.answers import Answer, StreamedAnswer
from watchproxy.lists.cached import CachedLists
from watchproxy.lists.ports import ListRequest
from watchproxy.lists.sharedaccess import SharedAccess
from watchproxy.server.http import Request
from watchproxy.server.protocol import Response
from watchproxy.server.wswatch import WebSocketStarter


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


class ResponseSink:
    """One client's watch response, its head written (chunked, uncompressed).

    The hub's fan-out writes pre-framed chunks straight to the transport (``send_framed``);
    ``drain`` waits on the protocol's ``pause_writing``/``resume_writing``.
    """

    def __init__(self, response: Response) -> None:
        self._response = response
        transport = response.transport
        self._high = transport.get_write_buffer_limits()[1] if transport is not None else 0
        # Kept for send_framed, the fan-out's per-event call. Once the connection is lost it
        # answers is_closing() True, which is all send_framed asks of it.
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
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        transport.writelines([b"%x\r\n" % size, *lines, b"\r\n"])
        return transport.get_write_buffer_size() <= self._high

    async def drain(self) -> None:
        if self.client_gone():
            raise ConnectionResetError("the watch client has gone")
        await self._response.drain()

    async def write(self, data: bytes) -> None:
        if self.client_gone():
            raise ConnectionResetError("the watch client has gone")
        self._response.write(data)
        await self._response.drain()

    async def write_eof(self) -> None:
        if self.client_gone():
            raise ConnectionResetError("the watch client has gone")
        self._response.end()

    def client_gone(self) -> bool:
        return self._response.client_gone()

    def abort(self) -> None:
        transport = self._transport
        if transport is not None:
            transport.abort()

    def close(self) -> None:
        self._response.abort()


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
    """Sends the watch's 200 and headers when the hub asks."""

    def __init__(self, response: Response, coding: str) -> None:
        self._response = response
        self._coding = coding

    async def start(self, content_type: str) -> ResponseSink:
        response = self._response
        if response.client_gone():
            raise ConnectionResetError("the watch client has gone")
        headers = {"Content-Type": content_type, "Cache-Control": "no-cache, private"}
        gzipped = self._coding == GZIP
        if gzipped:
            headers["Content-Encoding"] = GZIP
            headers["Vary"] = "Accept-Encoding"
        response.start(200, "OK", headers, chunked=True)
        sink = GzipResponseSink if gzipped else ResponseSink
        return sink(response)


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
        self, request: Request, response: Response, api_path: ApiPath, query: WatchQuery
    ) -> bool:
        admitted = await self._admitted(request, api_path, query)
        if admitted is not True:
            # Passed through (the apiserver answers), or the apiserver's 403.
            return self._refused(admitted, response)
        # The apiserver reads only the first Accept-Encoding header; so does headers.get.
        coding = watch_coding(query, request.headers.get("Accept-Encoding"))
        served = await self.hub.serve(api_path, query, request.headers, _Starter(response, coding))
        return self._answer(served, response)

    async def serve_websocket(
        self, request: Request, response: Response, api_path: ApiPath, query: WatchQuery
    ) -> bool:
        """A watch asked for over WebSocket: served by the hub, one event per message; False
        (relay it) for a handshake the apiserver would refuse, so that it answers it."""
        handshake = websocket.handshake(request.method, request.headers)
        if handshake is None:
            return False
        admitted = await self._admitted(request, api_path, query)
        if admitted is not True:
            return self._refused(admitted, response)
        starter = WebSocketStarter(response, handshake)
        served = await self.hub.serve(api_path, query, request.headers, starter)
        return self._answer(served, response)

    async def _admitted(
        self, request: Request, api_path: ApiPath, query: WatchQuery
    ) -> Answer | bool:
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
    def _refused(admitted: Answer | bool, response: Response) -> bool:
        if not isinstance(admitted, Answer):
            return False
        response.send_answer(admitted)
        return True

    @staticmethod
    def _answer(served: Refusal | str | None, response: Response) -> bool:
        if served is None:
            return False
        if isinstance(served, Refusal):
            headers = {"Content-Type": served.content_type or "application/json"}
            response.send(served.status, "", headers, served.body)
            return True
        if not response.status:
            if response.client_gone():
                return True  # it left before its stream could start: nothing to answer
            raise RuntimeError("the hub streamed a watch it never started")
        return True

    async def serve_list(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> Answer | StreamedAnswer | None:
        return await self.lists.serve(request, api_path, query)
