"""Shared state of one running fake apiserver, handed to its handlers."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from aiohttp import web

from .faults import Faults
from .stats import Stats
from .store import Store

# Headers every response carries (Audit-Id, APF uids), set by the edge middleware.
BASE_HEADERS: web.RequestKey[dict[str, str]] = web.RequestKey("base_headers", dict)

CUT = object()  # queued to a stream to make its handler return at once


class OpenStream:
    """A long response (watch or log follow) that faults and shutdown can cut."""

    def __init__(self, transport: asyncio.BaseTransport | None, *, watch: bool) -> None:
        self.transport = transport
        self.watch = watch
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.cut_off = False
        self.lag = 0.0  # seconds each event waits before it is written (Faults.lag_open_watches)

    def cut(self) -> None:
        """Abort the connection (no final chunk reaches the client) and wake the handler."""
        self.cut_off = True
        if self.transport is not None and not self.transport.is_closing():
            abort = getattr(self.transport, "abort", None)
            if abort is not None:
                abort()
            else:
                self.transport.close()
        self.queue.put_nowait(CUT)


@dataclass
class ServerContext:
    store: Store
    faults: Faults
    stats: Stats
    token: str
    bookmark_interval: float
    server_address: str = "127.0.0.1:0"
    log_interval: float = 0.2
    max_watch_buffer: int = 100_000
    rng: random.Random = field(default_factory=random.Random)
    streams: set[OpenStream] = field(default_factory=set)

    def lag_watches(self, seconds: float) -> int:
        targets = [s for s in self.streams if s.watch]
        for s in targets:
            s.lag = seconds
        return len(targets)

    def cut_streams(self, *, watches_only: bool = False) -> int:
        targets = [s for s in self.streams if s.watch or not watches_only]
        for s in targets:
            s.cut()
        return len(targets)
