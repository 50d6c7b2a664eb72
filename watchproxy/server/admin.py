"""The admin port: liveness, readiness, Prometheus metrics and the debug view of watches.

No Host allowlist here: kubelet probes and Prometheus scrapes arrive with the pod IP as Host.
The debug view shows every shared watch's path, namespace and selectors (which can name
objects) and identity digests: by default (``admin.debug_view: loopback``) it answers only
clients whose connection comes from a loopback address — a program in the pod, or
``kubectl port-forward``, which connects inside the pod to 127.0.0.1 — and refuses everyone
who reaches the port from the network (the kubelet, Prometheus, other pods) with 403. The
peer's address is the TCP connection's, which a client cannot choose; no header is believed.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from typing import Any, Literal

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from watchproxy.metrics import Metrics


def build_admin_app(
    *,
    metrics: Metrics,
    ready: Callable[[], bool],
    debug_watches: Callable[[], list[dict[str, Any]]],
    debug_view: Literal["loopback", "anywhere", "off"] = "loopback",
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
        if not debug_view_allowed(debug_view, request.remote):
            return web.Response(
                status=403,
                text=(
                    "the debug view answers clients on a loopback address only "
                    "(admin.debug_view: loopback): use kubectl port-forward\n"
                ),
            )
        body = json.dumps({"watches": debug_watches()}, indent=2, sort_keys=True)
        return web.Response(text=body + "\n", content_type="application/json")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    if debug_view != "off":
        app.router.add_get("/debug/watches", watches)
    return app


def debug_view_allowed(setting: str, remote: str | None) -> bool:
    """Whether a client connecting from ``remote`` (the peer's address) may read the debug
    view under ``admin.debug_view``."""
    if setting == "anywhere":
        return True
    if setting != "loopback" or not remote:
        return False
    try:
        address = ipaddress.ip_address(remote.partition("%")[0])
    except ValueError:
        return False  # not an IP peer (a Unix socket is not served here): refuse
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)
