"""FakeApiServer: the fake Kubernetes apiserver as one object you start, fault and stop."""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile
from types import TracebackType

import yaml
from aiohttp import web

from .app import build_app
from .context import ServerContext
from .faults import Faults
from .stats import Stats
from .store import Store
from .tls import client_context, make_server_tls


class FakeApiServer:
    """An in-process apiserver on loopback, faithful where clients can tell (see the package
    docstring). ``store``, ``faults`` and ``stats`` are for tests; ``stop()`` ends every stream
    and connection and leaves no task behind."""

    def __init__(
        self,
        *,
        token: str = "fake-token",
        tls: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        history_size: int = 1000,
        bookmark_interval: float = 1.0,
        log_interval: float = 0.2,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.store = Store(history_size)
        self.stats = Stats()
        self.faults = Faults(self, self.stats)
        self._ctx = ServerContext(
            self.store, self.faults, self.stats, token, bookmark_interval, log_interval=log_interval
        )
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._ssl: ssl.SSLContext | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.ca_path = ""

    @property
    def token(self) -> str:
        return self._ctx.token

    @token.setter
    def token(self, value: str) -> None:
        self._ctx.token = value

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client_ssl_context(self) -> ssl.SSLContext | None:
        """An SSL context trusting this server's CA (None without TLS)."""
        return client_context(self.ca_path) if self.tls else None

    async def start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="fakeapi-")
        if self.tls:
            server_tls = make_server_tls(self._tmp.name)
            self._ssl, self.ca_path = server_tls.context, server_tls.ca_path
        self._runner = web.AppRunner(
            build_app(self._ctx), handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        await self.start_listening()

    async def start_listening(self) -> None:
        """Bind (again) on ``port``; the first bind with port 0 picks an ephemeral port."""
        assert self._runner is not None and self._runner.server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._runner.server, self.host, self.port, ssl=self._ssl, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ctx.server_address = f"{self.host}:{self.port}"

    async def stop_listening(self) -> None:
        """Close the listening socket: new connections are refused (open ones stay)."""
        if self._server is not None:
            server, self._server = self._server, None
            server.close()

    def cut_streams(self, *, watches_only: bool = False) -> int:
        return self._ctx.cut_streams(watches_only=watches_only)

    def lag_watches(self, seconds: float) -> int:
        return self._ctx.lag_watches(seconds)

    def open_connections(self) -> int:
        """Client connections open now. aiohttp drops a connection from this count as soon as
        it is lost; its handler task, cancelled then, ends a few loop turns later."""
        if self._runner is None or self._runner.server is None:
            return 0
        return len(self._runner.server.connections)

    def abort_connections(self) -> None:
        """Abort every open client connection (resets, no goodbye)."""
        if self._runner is None or self._runner.server is None:
            return
        for conn in list(self._runner.server.connections):
            if conn.transport is not None:
                conn.transport.abort()

    async def stop(self) -> None:
        self.cut_streams()
        await self.faults.close()
        await self.stop_listening()
        self.abort_connections()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def write_kubeconfig(
        self, path: str, *, token: str | None = None, namespace: str = "default"
    ) -> str:
        """Write a kubeconfig for this server (kubectl and client libraries can use it as is)."""
        cluster: dict[str, str] = {"server": self.url}
        if self.tls:
            cluster["certificate-authority"] = os.path.abspath(self.ca_path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake", "user": {"token": token or self.token}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
            "preferences": {},
        }
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        return path
