"""aiohttp's protocol for the API port, answering requests it cannot parse with a Status.

Apart from ``server.listener`` (whose guard wraps each of these protocols) because this class
extends aiohttp's ``RequestHandler``, which mypyc cannot compile a subclass of (it has
``__slots__``): the listener is compiled, this module is not (``setup.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import ClassVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from watchproxy.errors import status_bytes
from watchproxy.metrics import Metrics

log = logging.getLogger("watchproxy.listener")


class StatusRequestHandler(RequestHandler):
    """aiohttp's protocol, except that unparseable requests (smuggling attempts, bad header
    lines) get a Kubernetes Status and one log line instead of text and a traceback."""

    __slots__ = ()
    metrics: ClassVar[Metrics | None] = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        return _status_error(self.metrics, request, status, exc, message)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's contract
        """A client's FIN. On a connection the upgrade relay took over, its stand-in payload
        parser decides (server/upgrade.py: the transport stays open for what the apiserver
        still sends); otherwise aiohttp's answer (None: the transport closes)."""
        hook = getattr(getattr(self, "_payload_parser", None), "eof_received", None)
        if hook is not None:
            return bool(hook())
        return super().eof_received()


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
