"""What the fake apiserver saw: every request, watch opens, open watches, outage connects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query_string: str
    headers: dict[str, str]
    time: float  # time.monotonic()
    watch: bool


@dataclass
class Stats:
    """Counters for tests. ``wait_until`` lets a test await a condition instead of sleeping."""

    requests: list[RequestRecord] = field(default_factory=list)
    active_watches: int = 0
    # Requests whose handler is still running (watches, log follows and exec sessions too).
    in_flight: int = 0
    outage_connection_attempts: int = 0
    watch_paths: list[str] = field(default_factory=list)
    _waiters: list[tuple[Callable[[Stats], bool], asyncio.Future[None]]] = field(
        default_factory=list, repr=False
    )

    def watch_opens(self, path: str | None = None) -> int:
        """Watch streams that were opened (status 200 sent), for one exact path or all."""
        return sum(1 for p in self.watch_paths if path is None or p == path)

    def reset(self) -> None:
        """Forget requests and counters (open watches stay counted in ``active_watches``)."""
        self.requests.clear()
        self.watch_paths.clear()
        self.outage_connection_attempts = 0
        self.changed()

    def record_request(self, record: RequestRecord) -> None:
        self.requests.append(record)
        self.changed()

    def request_started(self) -> None:
        self.in_flight += 1
        self.changed()

    def request_finished(self) -> None:
        self.in_flight -= 1
        self.changed()

    def watch_opened(self, path: str) -> None:
        self.watch_paths.append(path)
        self.active_watches += 1
        self.changed()

    def watch_closed(self) -> None:
        self.active_watches -= 1
        self.changed()

    def connection_attempt(self) -> None:
        self.outage_connection_attempts += 1
        self.changed()

    def changed(self) -> None:
        """Wake the waiters whose condition now holds."""
        still: list[tuple[Callable[[Stats], bool], asyncio.Future[None]]] = []
        for pred, fut in self._waiters:
            if fut.done():
                continue
            if pred(self):
                fut.set_result(None)
            else:
                still.append((pred, fut))
        self._waiters = still

    async def wait_until(self, pred: Callable[[Stats], bool], within: float = 5.0) -> None:
        """Return once ``pred(stats)`` holds (TimeoutError after ``within`` seconds)."""
        if pred(self):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((pred, fut))
        async with asyncio.timeout(within):
            await fut


def now() -> float:
    return time.monotonic()
