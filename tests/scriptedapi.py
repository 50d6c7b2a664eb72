"""A plain-HTTP stand-in for the apiserver whose answers a test writes itself, byte for byte
(gzip members cut anywhere, bombs, collections too big for the fake apiserver to build).

A subclass adds its routes in :meth:`ScriptedApiServer.add_routes`; ``/readyz`` is served for
it. ``done`` is set on exit, so that a handler holding a stream open can end it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Self

from aiohttp import web


class ScriptedApiServer:
    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    def add_routes(self, router: web.UrlDispatcher) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/readyz", self._ok)
        self.add_routes(app.router)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.done.set()
        assert self._runner is not None
        await self._runner.cleanup()

    def kubeconfig(self, tmp_path: Path) -> str:
        """A kubeconfig for this server (a token, which it does not check)."""
        path = tmp_path / "upstream.kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "c",
                    "clusters": [{"name": "c", "cluster": {"server": self.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                }
            )
        )
        return str(path)

    async def _ok(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")
