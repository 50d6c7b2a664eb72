"""exec, attach and port-forward: relay a client's WebSocket to the apiserver, frame by frame.

kubectl >= 1.30 speaks the remote-command and port-forward protocols over WebSocket (the
``v5.channel.k8s.io`` family). The relay opens the upstream WebSocket first, with the proxy's
credential and the client's subprotocols, so that a refusal (403, 404) reaches the client as an
HTTP status rather than a broken socket; then it accepts the client with the subprotocol the
apiserver chose and copies messages both ways until either side closes. SPDY upgrades (older
clients) are refused with a Status: kubectl then reports it instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from watchproxy.errors import BadRequest, ProxyError
from watchproxy.kube.headers import forwarded_credential, request_headers
from watchproxy.upstream.client import Upstream

log = logging.getLogger("watchproxy.upgrade")

WEBSOCKET_HEADERS = (
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
)


class UpgradeRefused(ProxyError):
    """The apiserver refused the WebSocket handshake; the client gets the same status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(
            code, "BadRequest" if code < 500 else "InternalError"
        )


def is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


async def _pump(
    source: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
    sink: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
) -> None:
    async for message in source:
        if message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        else:
            break
    if not sink.closed:
        await sink.close(code=source.close_code or aiohttp.WSCloseCode.OK)


class WebSocketRelay:
    """Serves upgrade requests on pods/exec, pods/attach and pods/portforward."""

    def __init__(
        self, upstream: Upstream, *, forward_identity: bool, forward_impersonation: bool = False
    ) -> None:
        self.upstream = upstream
        self.forward_identity = forward_identity
        self.forward_impersonation = forward_impersonation

    async def relay(self, request: web.Request) -> web.StreamResponse:
        if not is_websocket(request):
            raise BadRequest(
                "watchproxy relays exec, attach and port-forward over WebSocket only "
                "(kubectl 1.30 or newer); SPDY upgrades are not supported"
            )
        protocols = [
            p.strip()
            for value in request.headers.getall("Sec-WebSocket-Protocol", [])
            for p in value.split(",")
            if p.strip()
        ]
        headers = request_headers(
            request.headers,
            forward_identity=self.forward_identity,
            forward_impersonation=self.forward_impersonation,
        )
        for name in WEBSOCKET_HEADERS:
            headers.popall(name, None)
        forwarded_auth = forwarded_credential(request.headers, self.forward_identity)
        try:
            upstream_ws = await self.upstream.websocket(
                request.raw_path,
                protocols=protocols,
                headers=headers,
                forwarded_auth=forwarded_auth,
            )
        except aiohttp.WSServerHandshakeError as refused:
            raise UpgradeRefused(
                refused.status, f"the apiserver refused the upgrade: {refused.message}"
            ) from None
        client_ws = web.WebSocketResponse(
            protocols=[upstream_ws.protocol] if upstream_ws.protocol else (),
            max_msg_size=0,
        )
        try:
            await client_ws.prepare(request)
            async with asyncio.TaskGroup() as group:
                group.create_task(_pump(client_ws, upstream_ws))
                group.create_task(_pump(upstream_ws, client_ws))
        except* (ConnectionError, aiohttp.ClientError):
            log.info("a relayed WebSocket ended abruptly: %s", request.path)
        finally:
            if not upstream_ws.closed:
                await upstream_ws.close()
        return client_ws
