"""Role: the raw broadcast ceiling — the least work a Python fan-out can do on this machine.

``python -m bench.ceiling --upstream URL --token T [--ca PATH]`` prints ``{"port"}``. Every
GET on it is a chunked watch stream. The first client of an idle server opens ONE upstream watch
with that client's path and query (TLS + token, like watchproxy); every chunk read from it is cut
at its last newline and those bytes, never decoded, are written to every client in turn (the
same aiohttp ``StreamResponse.write`` watchproxy uses; what arrives while a round of writes is
under way goes out together in the next round). The upstream watch closes when the last
client leaves. No history, no per-client start point, no slow-client policy: clients that join a
running broadcast simply get what follows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl

import aiohttp
from aiohttp import web

from bench.roles import emit, run, serve_commands


class Broadcast:
    def __init__(self, upstream: str, token: str, ssl_context: ssl.SSLContext | bool) -> None:
        self.upstream = upstream
        self.token = token
        self.ssl = ssl_context
        self.clients: list[web.Request] = []
        self.task: asyncio.Task[None] | None = None
        self.session: aiohttp.ClientSession | None = None

    async def handler(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        await response.prepare(request)
        self.clients.append(request)
        if self.task is None:
            self.task = asyncio.create_task(self._pump(request.path_qs))
        try:
            await asyncio.Event().wait()  # until the client goes (handler cancellation)
        finally:
            if request in self.clients:
                self.clients.remove(request)
            if not self.clients and self.task is not None:
                task, self.task = self.task, None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return response

    async def _pump(self, path_qs: str) -> None:
        """Read the upstream watch; a writer task sends what accumulated to every client."""
        assert self.session is not None
        headers = {"Authorization": f"Bearer {self.token}"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        pending: list[bytes] = []
        wake = asyncio.Event()
        writer = asyncio.create_task(self._write_all(pending, wake))
        try:
            async with self.session.get(
                self.upstream + path_qs, headers=headers, ssl=self.ssl, timeout=timeout
            ) as upstream:
                rest = b""
                async for chunk in upstream.content.iter_any():
                    end = chunk.rfind(b"\n")
                    if end < 0:
                        rest += chunk
                        continue
                    pending.append(rest + chunk[: end + 1] if rest else chunk[: end + 1])
                    rest = chunk[end + 1 :]
                    wake.set()
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    async def _write_all(self, pending: list[bytes], wake: asyncio.Event) -> None:
        # The raw-write floor: whatever arrived while the previous round was being written
        # is framed as one HTTP chunk once and written to every client's transport, no await
        # and no per-client framing (a client over its buffer simply buffers more).
        while True:
            await wake.wait()
            wake.clear()
            data = b"".join(pending)
            pending.clear()
            framed = b"%x\r\n" % len(data) + data + b"\r\n"
            for request in self.clients:
                transport = request.transport
                if transport is not None and not transport.is_closing():
                    transport.write(framed)


async def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.ceiling")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--ca", default="")
    args = parser.parse_args()
    ssl_context: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=args.ca) if args.ca else False
    )
    broadcast = Broadcast(args.upstream, args.token, ssl_context)
    broadcast.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    app = web.Application()
    app.router.add_get("/{tail:.*}", broadcast.handler)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server  # asyncio.Server or uvloop's Server: both have .sockets
    assert server is not None
    try:
        emit({"port": server.sockets[0].getsockname()[1]})  # type: ignore[attr-defined]

        async def handle(words: list[str]) -> dict[str, object]:
            return {"error": f"unknown command {words[0]!r}"}

        await serve_commands(handle)
    finally:
        await runner.cleanup()
        await broadcast.session.close()


if __name__ == "__main__":
    run(main)
