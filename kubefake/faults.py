"""Fault injection: outages (refused, reset, 503), throttling, failures, broken watches."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import struct
from collections.abc import AsyncIterator
from typing import Protocol

from .errors import ApiError, Forbidden, ServiceUnavailable, TooManyRequests, error_for_code
from .stats import Stats

OUTAGE_MODES = ("refuse", "reset", "503")


class Listener(Protocol):
    """What Faults needs from the server: its address, and control of its listening socket."""

    host: str
    port: int

    async def stop_listening(self) -> None: ...

    async def start_listening(self) -> None: ...

    def cut_streams(self, *, watches_only: bool = False) -> int: ...

    def lag_watches(self, seconds: float) -> int: ...

    def abort_connections(self) -> None: ...


def _retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


class Faults:
    """The faults currently injected. Every setter takes effect on the next request or event."""

    def __init__(self, listener: Listener, stats: Stats) -> None:
        self._listener = listener
        self._stats = stats
        self.outage_mode: str | None = None
        self._raw: asyncio.Server | None = None
        self._throttle: float | None = None
        self._fail: list[tuple[int, float | None]] = []
        self.hang: bool = False
        self.watch_delay = 0.0
        self._garbage = 0
        self._list_gate: asyncio.Event | None = None
        self.lists_held = 0
        self._initial_gate: tuple[int, asyncio.Event] | None = None
        self.initial_events_held = 0
        self._forbidden: set[str] = set()
        self._max_in_flight: int | None = None
        self._service_seconds = 0.0
        self._jitter: random.Random | None = None
        self.in_flight = 0  # API requests under limit_in_flight being served
        self.capacity_refusals = 0

    # -- outages ---------------------------------------------------------------------------

    async def outage(self, mode: str = "refuse") -> None:
        """Start an outage; open streams are cut in every mode."""
        if mode not in OUTAGE_MODES:
            raise ValueError(f"outage mode must be one of {OUTAGE_MODES}, not {mode!r}")
        await self.recover()
        self.outage_mode = mode
        self._listener.cut_streams()
        if mode == "503":
            return
        await self._listener.stop_listening()
        self._listener.abort_connections()
        if mode == "reset":
            self._raw = await asyncio.start_server(
                self._reset_connection, self._listener.host, self._listener.port
            )

    async def recover(self) -> None:
        """End any outage: serve normally again on the same port."""
        mode, self.outage_mode = self.outage_mode, None
        if self._raw is not None:
            raw, self._raw = self._raw, None
            raw.close()
            await raw.wait_closed()
        if mode in ("refuse", "reset"):
            await self._listener.start_listening()

    async def _reset_connection(
        self, _r: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._stats.connection_attempt()
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Linger 0: close() sends an RST instead of a FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    # -- request faults --------------------------------------------------------------------

    def hold_lists(self, hold: bool) -> None:
        """While held, LISTs wait before reading the store (``lists_held`` counts them);
        releasing lets them read it, in arrival order."""
        if hold and self._list_gate is None:
            self._list_gate = asyncio.Event()
        elif not hold and self._list_gate is not None:
            self._list_gate.set()
            self._list_gate = None

    async def before_list(self) -> None:
        gate = self._list_gate
        if gate is not None:
            self.lists_held += 1
            await gate.wait()

    def hold_initial_events(self, after: int | None) -> None:
        """While set, a watch's initial events stop after the first ``after`` of them, written
        and flushed (``initial_events_held`` counts the watches held); None lets them go on."""
        gate = self._initial_gate
        if after is not None and gate is None:
            self._initial_gate = (after, asyncio.Event())
        elif after is None and gate is not None:
            gate[1].set()
            self._initial_gate = None

    async def before_initial_event(self, index: int) -> None:
        gate = self._initial_gate
        if gate is not None and index == gate[0]:
            self.initial_events_held += 1
            await gate[1].wait()

    def throttle(self, retry_after: float | None) -> None:
        """While set, every API request gets 429 with ``Retry-After``; None clears it."""
        self._throttle = retry_after

    def limit_in_flight(
        self, max_in_flight: int | None, service_seconds: float = 0.0, *, jitter: bool = False
    ) -> None:
        """Serve like an apiserver with ``--max-requests-inflight``: each API request that is not
        a watch takes ``service_seconds`` of (simulated) work, and one that finds
        ``max_in_flight`` such requests already in flight gets 429 with ``Retry-After: 1`` at
        once (counted in ``capacity_refusals``). None lifts the limit. With ``jitter`` the work
        takes 0.5 to 1.5 times ``service_seconds`` (seeded), as a real apiserver's varies: with
        equal times, requests admitted together finish together, and the clients move in
        lock-step batches no real server produces."""
        self._max_in_flight = max_in_flight
        self._service_seconds = service_seconds
        self._jitter = random.Random(1) if jitter else None

    @contextlib.asynccontextmanager
    async def serving(self, *, long_running: bool) -> AsyncIterator[None]:
        """Around one API request: the capacity of :meth:`limit_in_flight`."""
        limit = self._max_in_flight
        if limit is None or long_running:
            yield
            return
        if self.in_flight >= limit:
            self.capacity_refusals += 1
            raise _too_many(1.0)
        self.in_flight += 1
        try:
            if self._service_seconds:
                scale = 1.0 if self._jitter is None else 0.5 + self._jitter.random()
                await asyncio.sleep(self._service_seconds * scale)
            yield
        finally:
            self.in_flight -= 1

    def fail_next(self, n: int, status: int, retry_after: float | None = None) -> None:
        """The next ``n`` API requests get ``status`` and a Status body."""
        self._fail.extend([(status, retry_after)] * n)

    def forbid(self, resource: str, forbidden: bool = True) -> None:
        """Requests on ``resource`` (such as ``pods/exec``) get the apiserver's RBAC 403."""
        (self._forbidden.add if forbidden else self._forbidden.discard)(resource)

    def allows(self, resource: str) -> bool:
        """Whether the one user may act on ``resource`` (``pods/exec``: with its subresource),
        as a SelfSubjectAccessReview tells it."""
        return resource not in self._forbidden

    def check_allowed(self, resource: str, name: str, namespace: str | None) -> None:
        if resource in self._forbidden:
            group_resource = resource.partition("/")[0]
            raise Forbidden(
                f'{group_resource} "{name}" is forbidden: User "system:serviceaccount:default:'
                f'default" cannot create resource "{resource}" in API group "" in the namespace '
                f'"{namespace}"',
                name=name,
                kind=group_resource,
            )

    def request_error(self) -> ApiError | None:
        """The error the next API request must get, if any (consumes one ``fail_next``)."""
        if self._throttle is not None:
            return _too_many(self._throttle)
        if self._fail:
            status, retry_after = self._fail.pop(0)
            if status == 429:
                return _too_many(retry_after if retry_after is not None else 1.0)
            err = error_for_code(status, f"injected failure (HTTP {status})")
            if retry_after is not None:
                err.details["retryAfterSeconds"] = int(_retry_after_header(retry_after))
                err.headers["Retry-After"] = _retry_after_header(retry_after)
            return err
        return None

    def outage_error(self) -> ApiError | None:
        if self.outage_mode == "503":
            return ServiceUnavailable("the server is currently unable to handle the request")
        return None

    # -- watch faults ----------------------------------------------------------------------

    def cut_watches(self) -> int:
        """Abort every open watch stream mid-stream (no final chunk); returns how many."""
        return self._listener.cut_streams(watches_only=True)

    def delay_watch_events(self, seconds: float) -> None:
        """Every watch writes each event this long after it took it (a watch that lags)."""
        self.watch_delay = seconds

    def lag_open_watches(self, seconds: float) -> int:
        """The watches open now write each later event this long after they took it; watches
        opened later do not lag (a watcher behind the rest, or an event still on its way to one
        client while the store has it). Returns how many lag."""
        return self._listener.lag_watches(seconds)

    def hang_watches(self, hang: bool) -> None:
        """While set, new watch responses send their headers and then nothing at all."""
        self.hang = hang

    def garbage_next_watch_line(self, n: int = 1) -> None:
        """The next ``n`` watch event lines written (any watch) are truncated JSON."""
        self._garbage += n

    def take_garbage(self) -> bool:
        if self._garbage > 0:
            self._garbage -= 1
            return True
        return False

    async def close(self) -> None:
        self.outage_mode = None
        if self._raw is not None:
            raw, self._raw = self._raw, None
            raw.close()
            await raw.wait_closed()


def _too_many(retry_after: float) -> ApiError:
    header = _retry_after_header(retry_after)
    err = TooManyRequests(
        "Too many requests, please try again later.", retryAfterSeconds=int(header)
    )
    err.headers["Retry-After"] = header
    return err
