"""A fault-injecting TCP proxy for tests: put it between watchproxy and the fake apiserver.

It relays raw bytes (TLS passes through end to end) and can break the path the ways networks
and apiservers do. New connections follow :attr:`FaultProxy.mode`:

- ``pass``: relayed;
- ``reset``: accepted, then reset at once (an apiserver behind a load balancer that is gone);
- ``blackhole``: accepted, read and never answered (a dead peer behind a live address).

Open connections are broken on demand: :meth:`reset_all` (RST), :meth:`freeze` (half-open: the
peer vanished, nothing more flows either way and nothing is closed), :meth:`truncate_next`
(the next reply stops half-way and the connection is closed with a FIN: a chunk cut short, in
the middle of a TLS record), :meth:`reset_mid_record` (the same with a RST), and
:attr:`trickle` (replies forwarded a few bytes at a time).

Everything it counts (connections by mode) is for the test's assertions. It binds loopback only
and :meth:`stop` closes every socket it opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from kubefake import FakeApiServer
from tests.harness import Running, make_config, wait_for
from watchproxy.app import Proxy
from watchproxy.kube.kubeconfig import render_kubeconfig
from watchproxy.upstream.credentials import from_kubeconfig

MODES = ("pass", "reset", "blackhole")


@dataclass
class Counts:
    accepted: int = 0
    by_mode: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODES, 0))
    bytes_up: int = 0  # relayed towards the target (TLS records, so a little over the payload)


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # Linger 0: closing sends a RST instead of a FIN.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One relayed connection: client <-> proxy <-> target."""

    def __init__(
        self,
        owner: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.owner = owner
        self.client_reader, self.client_writer = client
        self.target_reader, self.target_writer = target
        self.frozen = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._up(), name="faultproxy-up"),
            asyncio.create_task(self._down(), name="faultproxy-down"),
        ]

    async def _up(self) -> None:
        """Client to target, as it comes."""
        while True:
            data = await self.client_reader.read(65536)
            if self.frozen.is_set():
                await asyncio.Event().wait()  # half-open: swallow and never answer
            if not data:
                with contextlib.suppress(OSError, RuntimeError):  # already closed: fine
                    self.target_writer.write_eof()
                return
            self.owner.counts.bytes_up += len(data)
            self.target_writer.write(data)
            await self.target_writer.drain()

    async def _down(self) -> None:
        """Target to client, with the faults that concern replies."""
        while True:
            data = await self.target_reader.read(65536)
            if self.frozen.is_set():
                await asyncio.Event().wait()
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    self.client_writer.write_eof()
                return
            cut = self.owner._take_cut()
            if cut is not None:
                self.client_writer.write(data[: max(1, len(data) // 2)])
                await self.client_writer.drain()
                if cut == "reset":
                    _rst(self.client_writer)
                else:
                    self.client_writer.close()
                _rst(self.target_writer)
                return
            if self.owner.trickle is not None:
                size, pause = self.owner.trickle
                for start in range(0, len(data), size):
                    self.client_writer.write(data[start : start + size])
                    await self.client_writer.drain()
                    await asyncio.sleep(pause)
                continue
            self.client_writer.write(data)
            await self.client_writer.drain()

    def reset(self) -> None:
        _rst(self.client_writer)
        _rst(self.target_writer)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, RuntimeError):
                await task
        for writer in (self.client_writer, self.target_writer):
            writer.transport.abort()


class FaultProxy:
    """A TCP relay on 127.0.0.1 to ``target_host:target_port`` with switchable faults."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.mode = "pass"
        self.trickle: tuple[int, float] | None = None  # (bytes per write, pause between)
        self.counts = Counts()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._holes: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._cuts: list[str] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for link in list(self._links):
            await link.close()
        self._links.clear()
        for writer in list(self._holes):
            writer.transport.abort()
        self._holes.clear()
        # Each handler ends once its connections are closed; cancelling one instead would make
        # asyncio's server log the cancellation as an error.
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)
        for task in list(self._handlers):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    @property
    def open_links(self) -> int:
        """Connections relayed right now."""
        return len(self._links)

    # -- faults ----------------------------------------------------------------------------

    def reset_all(self) -> int:
        """RST every relayed connection; returns how many."""
        links = list(self._links)
        for link in links:
            link.reset()
        return len(links)

    def freeze(self) -> int:
        """Half-open every relayed connection: nothing flows any more, nothing is closed."""
        for link in self._links:
            link.frozen.set()
        return len(self._links)

    def truncate_next(self, n: int = 1) -> None:
        """The next ``n`` replies (any connection) stop half-way, then a FIN."""
        self._cuts.extend(["fin"] * n)

    def reset_mid_record(self, n: int = 1) -> None:
        """The next ``n`` replies stop half-way (inside a TLS record), then a RST."""
        self._cuts.extend(["reset"] * n)

    def _take_cut(self) -> str | None:
        return self._cuts.pop(0) if self._cuts else None

    # -- connections -----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mode = self.mode
        self.counts.accepted += 1
        self.counts.by_mode[mode] += 1
        if mode == "reset":
            _rst(writer)
            return
        if mode == "blackhole":
            self._holes.add(writer)
            try:
                while await reader.read(65536):
                    pass
            except OSError:
                pass
            finally:
                self._holes.discard(writer)
                writer.transport.abort()
            return
        try:
            target = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            _rst(writer)
            return
        link = _Link(self, (reader, writer), target)
        self._links.add(link)
        link.start()
        try:
            await asyncio.wait(link.tasks)
        finally:
            self._links.discard(link)
            await link.close()


@dataclass
class Faulty:
    """A running fake apiserver, the fault proxy in front of it, and watchproxy behind both."""

    fake: FakeApiServer
    faults: FaultProxy
    running: Running


@contextlib.asynccontextmanager
async def faulty_upstream(
    tmp_path: Any, overrides: dict[str, Any] | None = None, *, seed: int = 1
) -> AsyncIterator[Faulty]:
    """watchproxy -> FaultProxy -> FakeApiServer, all on loopback, for one test."""
    async with FakeApiServer(bookmark_interval=0.5) as fake, FaultProxy(fake.host, fake.port) as fp:
        path = os.path.join(tmp_path, "upstream.kubeconfig")
        fake.write_kubeconfig(path)
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
        document["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{fp.port}"
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(document, handle)
        proxy = Proxy(make_config(overrides), from_kubeconfig(path), rng=random.Random(seed))
        await proxy.start()
        try:
            kubeconfig = os.path.join(tmp_path, "proxy.kubeconfig")
            with open(kubeconfig, "w", encoding="utf-8") as handle:
                handle.write(
                    render_kubeconfig(f"http://127.0.0.1:{proxy.api_port}", namespace="default")
                )
            await wait_for(lambda: proxy.connectivity.up, what="proxy to reach the upstream")
            yield Faulty(fake, fp, Running(fake, proxy, kubeconfig, path))
        finally:
            await proxy.stop()
