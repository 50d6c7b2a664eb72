"""What aiohttp's server lacks on the API port: deadlines for request heads and bodies, a
connection cap.

Every connection's protocol is wrapped in a :class:`GuardedProtocol`, which is in one of four
states: ``head`` (open, no whole request head yet), ``body`` (a head is in, its body is still
arriving), ``active`` (a request is being served: a list, a watch stream, an exec relay) or
``idle`` (keep-alive between requests).

- A connection must deliver a whole request head within ``header_timeout`` of opening, or of its
  first byte after being idle: a slowloris client cannot hold connections open by trickling
  bytes, nor by sending nothing at all. One that sent part of a head gets a 408 Status first.
- A body must keep arriving: ``body_timeout`` at most between two reads, and on average at
  least ``body_min_rate`` bytes per second after its first ``body_timeout`` seconds. A late
  body gets a 408 Status and its connection is closed. Time in which the proxy itself does not
  read (a body streamed upstream no faster than the apiserver takes it) is not counted.
- At ``max_connections`` a new connection does not get refused while cheaper ones exist: the
  guard closes the oldest idle keep-alive connection (its client reconnects at the next
  request), else the oldest unfinished head, else the body that has been silent longest, and
  accepts the new one. ``active`` connections are never shed; only when every connection is
  active does the new one get a 503 Status. A flood of idle connections, slow heads or slow
  bodies thus costs the proxy at most ``max_connections`` connections and cannot lock anyone
  out.
- Each connection's loss is a future (:meth:`ConnectionGuard.lost_signal`) that resolves when
  the loop reports the connection lost: the signal on which a request's work ends with its
  client (see ``clientgone``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from watchproxy.metrics import Metrics
from watchproxy.server.clientgone import already_lost
from watchproxy.server.connection import GuardedProtocol, Payload, State, status_reply

if TYPE_CHECKING:
    from watchproxy.server.fastlane import FastLane

log = logging.getLogger("watchproxy.listener")


class ConnectionGuard:
    """Counts connections by state, sheds the cheapest at the cap, builds each one's protocol.

    Guarantees: at most ``max_connections`` connections are open once a new one is accepted
    (0 = no cap); a connection serving a request is never closed by the guard.
    """

    def __init__(
        self,
        inner_factory: Callable[[], asyncio.Protocol],
        *,
        max_connections: int,
        header_timeout: float,
        metrics: Metrics,
        body_timeout: float = 0.0,
        body_min_rate: float = 0.0,
    ) -> None:
        self.inner_factory = inner_factory
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.body_min_rate = body_min_rate
        self.metrics = metrics
        self.open = 0
        self.by_transport: dict[Any, GuardedProtocol] = {}
        # Insertion order is age in the state (for a body: since its last byte): the first
        # entry is the one to shed first.
        self._sheddable: dict[State, dict[GuardedProtocol, None]] = {
            "idle": {},
            "head": {},
            "body": {},
        }
        # Counted in plain ints and read by the gauges at scrape time: a connection moves
        # between states three times per request, and a gauge's inc/dec takes a lock each.
        self._counts: dict[State, int] = dict.fromkeys(_STATES, 0)
        for state in _STATES:
            metrics.connections.labels(state).set_function(self._counter(state))
        metrics.count_client_connections(lambda: self.open)
        # Set once the API handler exists: requests the connections serve themselves.
        self.fast_lane: FastLane | None = None
        # Every connection's fast-lane server task (server.lanes), and those of them
        # serving a request now.
        self.connection_tasks: set[asyncio.Task[None]] = set()
        self.fast_tasks: set[asyncio.Task[None]] = set()

    async def finish_fast_lane(self, timeout: float) -> None:
        """At shutdown: wait up to ``timeout`` for the fast lane's requests in flight, then
        cancel the rest (their clients' connections close next)."""
        tasks = set(self.fast_tasks)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        """After the connections closed: end the server tasks still there (idle ones end by
        themselves once their connection is lost; this awaits them, or ends them)."""
        tasks = set(self.connection_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _counter(self, state: State) -> Callable[[], float]:
        return lambda: self._counts[state]

    def __call__(self) -> asyncio.Protocol:
        if self.max_connections and self.open >= self.max_connections and not self._shed_one():
            self.metrics.rejected.labels("connections").inc()
            return _Refuse(
                status_reply(
                    503,
                    "Service Unavailable",
                    "ServiceUnavailable",
                    f"watchproxy serves at most {self.max_connections} connections, "
                    "all of them busy",
                )
            )
        return GuardedProtocol(self, self.inner_factory())

    def _shed_one(self) -> bool:
        for state in _SHED_ORDER:
            candidates = self._sheddable[state]
            if candidates:
                victim = next(iter(candidates))
                self.metrics.connections_shed.labels(state).inc()
                victim.shed()
                return True
        return False

    def moved(self, protocol: GuardedProtocol, old: State | None, new: State | None) -> None:
        """Book-keeping of ``protocol`` leaving state ``old`` for ``new`` (None: not open)."""
        # Three moves per request: no dict made for a state that sheds nothing.
        if old is not None:
            self._counts[old] -= 1
            left = self._sheddable.get(old)
            if left is not None:
                left.pop(protocol, None)
            if new is None:
                self.open -= 1
        if new is not None:
            self._counts[new] += 1
            entered = self._sheddable.get(new)
            if entered is not None:
                entered[protocol] = None
            if old is None:
                self.open += 1

    def progressed(self, protocol: GuardedProtocol) -> None:
        """A byte of ``protocol``'s body came: it is now the last body to shed."""
        bodies = self._sheddable["body"]
        if protocol in bodies:  # re-inserted: to the end of the order
            del bodies[protocol]
            bodies[protocol] = None

    def lost_signal(self, transport: Any) -> asyncio.Future[None]:
        """Resolves when the connection of ``transport`` is lost (already resolved if it is).

        aiohttp sets a request's transport to None when its connection is lost, and the guard
        forgets a connection at the same moment: either way the client has gone."""
        guarded = self.by_transport.get(transport) if transport is not None else None
        return guarded.lost if guarded is not None else already_lost()

    def request_started(self, transport: Any, payload: Payload | None = None) -> None:
        """Called by the handler once a request's headers have been parsed; ``payload``: its
        body as aiohttp reads it."""
        guarded = self.by_transport.get(transport)
        if guarded is not None:
            guarded.request_started(payload)

    def request_finished(self, transport: Any) -> None:
        guarded = self.by_transport.get(transport)
        if guarded is not None:
            guarded.request_finished()


_STATES: tuple[State, ...] = ("head", "body", "idle", "active")
# Who makes room first: an idle connection costs its client a reconnect; an unfinished head,
# a request not yet made; a silent body, a request the client has begun.
_SHED_ORDER: tuple[State, ...] = ("idle", "head", "body")


class _Refuse(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance here.
        writer = cast(asyncio.WriteTransport, transport)
        writer.write(self.reply)
        writer.close()
