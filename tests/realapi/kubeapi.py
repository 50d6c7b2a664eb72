"""Small async clients for the real-apiserver tests: plain HTTP calls, watch streams, a TCP relay.

The same :class:`Api` talks to the real apiserver directly (HTTPS, a bearer token) and to
watchproxy (plain HTTP on loopback), so each test makes one request both ways and compares.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

Event = dict[str, Any]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Api:
    """One base URL and credential; every call is bounded in time."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.session = session
        self.base = base
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else False

    def with_token(self, token: str | None) -> Api:
        api = Api(self.session, self.base, token=token)
        api.ssl = self.ssl
        return api

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        timeout: float = 20.0,
    ) -> Answer:
        send = dict(self.headers)
        send.update(headers or {})
        data: bytes | None = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            send["Content-Type"] = content_type
        async with self.session.request(
            method,
            self.base + path,
            data=data,
            headers=send,
            ssl=self.ssl,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            return Answer(response.status, dict(response.headers), await response.read())

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = await self.request(method, path, **kwargs)
        assert 200 <= answer.status < 300, f"{method} {path}: {answer.status} {answer.body[:500]!r}"
        return answer.json()

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, *, headers: dict[str, str] | None = None
    ) -> AsyncIterator[WatchStream]:
        """A watch read by a task this context owns; the stream is closed on exit."""
        send = dict(self.headers)
        send.update(headers or {})
        stream = WatchStream()
        response = await self.session.get(
            self.base + path,
            headers=send,
            ssl=self.ssl,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None),
        )
        stream.status = response.status
        reader = asyncio.create_task(stream.read(response))
        try:
            yield stream
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            # Closing a TLS connection mid-stream starts its shutdown; wait for it to end so
            # that no transport outlives the test (leaks fail the suite).
            connection = response.connection
            protocol = connection.protocol if connection is not None else None
            closed = protocol.closed if protocol is not None else None
            transport = protocol.transport if protocol is not None else None
            response.close()
            if closed is not None and not closed.done():
                done, _ = await asyncio.wait([closed], timeout=2)
                if not done and transport is not None:
                    transport.abort()  # the peer is slow to finish TLS shutdown: drop it
                    await asyncio.wait([closed], timeout=2)
            if closed is not None and closed.done() and not closed.cancelled():
                closed.exception()  # retrieved: a connection lost with an error is expected


@dataclass
class WatchStream:
    """Everything one watch delivered, and a way to wait for a condition over it."""

    status: int = 0
    events: list[Event] = field(default_factory=list)
    body: bytes = b""
    ended: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self, response: aiohttp.ClientResponse) -> None:
        try:
            if response.status != 200:
                self.body = await response.read()
                return
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self.events.append(json.loads(line))
                self._changed.set()
        except aiohttp.ClientError:
            pass
        finally:
            self.ended = True
            self._changed.set()

    async def wait_for(
        self, predicate: Callable[[list[Event]], bool], *, timeout: float = 15.0, what: str = ""
    ) -> list[Event]:
        deadline = time.monotonic() + timeout
        while not predicate(self.events):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.ended:
                raise AssertionError(
                    f"watch: timed out waiting for {what or 'condition'} "
                    f"(status {self.status}, ended {self.ended}, events {summary(self.events)}, "
                    f"body {self.body[:300]!r})"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return self.events


def summary(events: list[Event]) -> list[tuple[str, str, str]]:
    """(type, name, resourceVersion) of each event: what two streams are compared by."""
    out = []
    for event in events:
        meta = (event.get("object") or {}).get("metadata") or {}
        out.append((event.get("type", ""), meta.get("name", ""), meta.get("resourceVersion", "")))
    return out


def objects(events: list[Event]) -> list[tuple[str, str, str]]:
    """Like :func:`summary` without bookmarks."""
    return [s for s in summary(events) if s[0] != "BOOKMARK"]


def names(events: list[Event], kind: str | None = None) -> set[str]:
    return {name for event_type, name, _ in objects(events) if kind in (None, event_type)}


class TcpRelay:
    """A loopback TCP relay in front of the apiserver that a test can cut and restore.

    While cut, every open connection is closed and new ones are accepted and closed at once:
    the proxy behind it sees an outage, as with an apiserver restart.
    """

    def __init__(self, port: int) -> None:
        self.target_port = port
        self.cut = False
        self.accepted = 0  # every TCP connection it accepted: what the apiserver would see
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def __aenter__(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._drop_all()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            self._drop_all()

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side ended: end both, as a TCP middlebox that lost its peer would.
            dst.transport.abort()
            self._writers.discard(dst)


@contextlib.asynccontextmanager
async def ticking(direct: Api, collection: str, ticker: dict[str, Any]) -> AsyncIterator[None]:
    """``ticker``, created in ``collection`` and its annotation patched every 50 ms while the
    block runs.

    A consistent LIST is answered by the hub once its watch reaches the revision a probe read,
    and the apiserver's own writes (its identity lease, every 10 s) move that revision without
    an event on this watch: a quiet collection would then wait for nothing and go upstream. A
    busy one, as in a cluster, catches up within a tick."""
    await direct.ok("POST", collection, body=ticker)
    stop = asyncio.Event()

    async def tick() -> None:
        for n in range(10_000):
            if stop.is_set():
                return
            await direct.ok(
                "PATCH",
                f"{collection}/{ticker['metadata']['name']}",
                body={"metadata": {"annotations": {"tick": str(n)}}},
                content_type="application/merge-patch+json",
            )
            await asyncio.sleep(0.05)

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        stop.set()
        await task


def compare_rv(a: str, b: str) -> int:
    """-1, 0 or 1 as resourceVersion ``a`` is older than, the same as or newer than ``b``,
    compared as the apiserver compares them (apimachinery's ``CompareResourceVersion``,
    "comparable resource versions", GA in 1.35): each must be a positive decimal integer
    without leading zeros, of any length; a ValueError otherwise."""
    for rv in (a, b):
        if not rv or rv[0] == "0" or not all("0" <= c <= "9" for c in rv):
            raise ValueError(f"resource version is not well formed: {rv!r}")
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    return (a > b) - (a < b)
