"""The admin port: liveness, readiness, Prometheus metrics and the debug view of watches.

No Host allowlist here: kubelet probes and Prometheus scrapes arrive with the pod IP as Host.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from watchproxy.metrics import Metrics


def build_admin_app(
    *,
    metrics: Metrics,
    ready: Callable[[], bool],
    debug_watches: Callable[[], list[dict[str, Any]]],
) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="upstream not reachable\n")

    async def metrics_handler(request: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def watches(request: web.Request) -> web.Response:
        body = json.dumps({"watches": debug_watches()}, indent=2, sort_keys=True)
        return web.Response(text=body + "\n", content_type="application/json")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/debug/watches", watches)
    return app
