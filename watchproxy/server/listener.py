"""What aiohttp's server lacks on the API port: a deadline for request headers, a connection cap.

Every connection's protocol is wrapped in a :class:`GuardedProtocol`. A request must arrive
whole (its headers) within ``header_timeout`` of its first byte, or the client gets a 408 Status
and the connection is closed: a slowloris client cannot hold connections open by trickling
bytes. Beyond ``max_connections`` open connections, a new one gets a 503 Status and is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from watchproxy.errors import status_bytes
from watchproxy.metrics import Metrics

log = logging.getLogger("watchproxy.listener")


def _status_reply(code: int, phrase: str, reason: str, message: str) -> bytes:
    body = status_bytes(code, reason, message)
    head = (
        f"HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class ConnectionGuard:
    """Counts connections and builds the guarded protocol for each new one."""

    def __init__(
        self,
        inner_factory: Callable[[], asyncio.Protocol],
        *,
        max_connections: int,
        header_timeout: float,
        metrics: Metrics,
    ) -> None:
        self.inner_factory = inner_factory
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.metrics = metrics
        self.open = 0
        self.by_transport: dict[Any, GuardedProtocol] = {}
        metrics.count_client_connections(lambda: self.open)

    def __call__(self) -> asyncio.Protocol:
        if self.max_connections and self.open >= self.max_connections:
            self.metrics.rejected.labels("connections").inc()
            return _Refuse(
                _status_reply(
                    503,
                    "Service Unavailable",
                    "ServiceUnavailable",
                    f"watchproxy serves at most {self.max_connections} connections",
                )
            )
        return GuardedProtocol(self, self.inner_factory())

    def request_started(self, transport: Any) -> None:
        """Called by the handler once a request's headers have been parsed."""
        guarded = self.by_transport.get(transport)
        if guarded is not None:
            guarded.request_started()

    def request_finished(self, transport: Any) -> None:
        guarded = self.by_transport.get(transport)
        if guarded is not None:
            guarded.request_finished()


class StatusRequestHandler(RequestHandler):
    """aiohttp's protocol, except that unparseable requests (smuggling attempts, bad header
    lines) get a Kubernetes Status and one log line instead of text and a traceback."""

    __slots__ = ()
    metrics: Metrics | None = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        return _status_error(self.metrics, request, status, exc, message)


def status_server_factory(server: web.Server, metrics: Metrics) -> Callable[[], asyncio.Protocol]:
    """Protocol factory for ``server`` that builds :class:`StatusRequestHandler`s."""
    StatusRequestHandler.metrics = metrics
    kwargs = dict(server._kwargs)  # the handler settings the runner was given
    loop = asyncio.get_running_loop()

    def build() -> asyncio.Protocol:
        return StatusRequestHandler(server, loop=loop, **kwargs)

    return build


def _status_error(
    metrics: Metrics | None,
    request: web.BaseRequest,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> web.StreamResponse:
    reason = {400: "BadRequest", 413: "RequestEntityTooLarge", 431: "BadRequest"}.get(
        status, "InternalError"
    )
    detail = getattr(exc, "message", None) or message or HTTPStatus(status).phrase
    detail = (str(detail).strip().splitlines() or [""])[0].rstrip(":")  # one line
    if status < 500:
        if metrics is not None:
            metrics.rejected.labels("malformed").inc()
        log.warning("refused a malformed request from %s: %s", request.remote, detail)
    else:
        log.error("error handling a request from %s: %s", request.remote, detail, exc_info=exc)
        detail = "internal error"
    response = web.Response(
        status=status,
        body=status_bytes(status, reason, str(detail)),
        content_type="application/json",
    )
    response.force_close()
    return response


class _Refuse(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance here.
        writer = cast(asyncio.WriteTransport, transport)
        writer.write(self.reply)
        writer.close()


class GuardedProtocol(asyncio.Protocol):
    """Delegates to aiohttp's protocol; adds the header deadline and the connection count."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._guard.open += 1
        self._guard.by_transport[transport] = self
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._guard.open -= 1
        if self._transport is not None:
            self._guard.by_transport.pop(self._transport, None)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._timer is None and self._guard.header_timeout > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._guard.header_timeout, self._too_slow)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def request_started(self) -> None:
        self._in_request = True
        self._cancel_timer()

    def request_finished(self) -> None:
        self._in_request = False

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        if self._in_request or self._transport is None or self._transport.is_closing():
            return
        self._guard.metrics.rejected.labels("header-timeout").inc()
        self._transport.write(
            _status_reply(
                408,
                "Request Timeout",
                "Timeout",
                f"request headers not received within {self._guard.header_timeout:g}s",
            )
        )
        self._transport.close()
