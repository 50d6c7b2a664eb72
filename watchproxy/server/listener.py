"""The API port's connections: deadlines for request heads and bodies, a connection cap, and
the end of every connection at shutdown.

Every connection is an :class:`~watchproxy.server.protocol.HttpProtocol`, which is in one of four
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
- Each connection's loss is a future (``HttpProtocol.lost``) that resolves when the loop
  reports the connection lost: the signal on which a request's work ends with its client (see
  ``clientgone``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from watchproxy.errors import UpstreamUnavailable
from watchproxy.metrics import Metrics
from watchproxy.server.http import response_head, status_answer
from watchproxy.server.protocol import Handler, HttpProtocol, State

log = logging.getLogger("watchproxy.listener")


class ConnectionGuard:
    """Counts connections by state, sheds the cheapest at the cap, builds each one's protocol.

    Guarantees: at most ``max_connections`` connections are open once a new one is accepted
    (0 = no cap); a connection serving a request is never closed by the guard.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_connections: int,
        header_timeout: float,
        metrics: Metrics,
        body_timeout: float = 0.0,
        body_min_rate: float = 0.0,
        max_body_bytes: int = 0,
    ) -> None:
        self.handler = handler
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.body_min_rate = body_min_rate
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.open = 0
        self.connections: set[HttpProtocol] = set()
        # Set at shutdown: every answer then closes its connection.
        self.draining = False
        # Insertion order is age in the state (for a body: since its last byte): the first
        # entry is the one to shed first.
        self._sheddable: dict[State, dict[HttpProtocol, None]] = {
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
        # Every connection's server task (server.protocol), and the connections serving a
        # request now.
        self.tasks: set[asyncio.Task[None]] = set()
        self.busy: set[HttpProtocol] = set()

    def _counter(self, state: State) -> Callable[[], float]:
        return lambda: self._counts[state]

    def __call__(self) -> asyncio.Protocol:
        if self.max_connections and self.open >= self.max_connections and not self._shed_one():
            self.metrics.rejected.labels("connections").inc()
            busy = UpstreamUnavailable(
                f"watchproxy serves at most {self.max_connections} connections, all of them busy"
            )
            answer = status_answer(busy)
            return _Refuse(
                response_head(
                    answer.status, answer.reason, answer.headers, length=len(answer.body),
                    close=True,
                ) + answer.body
            )  # fmt: skip
        return HttpProtocol(self, self.handler)

    def opened(self, protocol: HttpProtocol) -> None:
        self.connections.add(protocol)

    def closed(self, protocol: HttpProtocol) -> None:
        self.connections.discard(protocol)
        self.busy.discard(protocol)

    async def drain(self, timeout: float) -> None:
        """At shutdown (``draining`` set): close the idle connections, wait up to ``timeout``
        for the requests in flight, then close every connection and end its server task."""
        for protocol in list(self.connections):
            protocol.close_idle()
        tasks = {task for task in self.tasks if not task.done()}
        if tasks:
            deadline = asyncio.get_running_loop().time() + timeout
            while self.busy and asyncio.get_running_loop().time() < deadline:
                left = deadline - asyncio.get_running_loop().time()
                await asyncio.wait(tasks, timeout=min(left, 0.05))
                tasks = {task for task in tasks if not task.done()}
                for protocol in list(self.connections):
                    protocol.close_idle()
        for protocol in list(self.connections):
            if protocol.transport is not None:
                protocol.transport.close()
        await self.close()

    async def close(self) -> None:
        """End the server tasks still there (idle ones end by themselves once their connection
        is lost; this awaits them, or ends them)."""
        tasks = set(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _shed_one(self) -> bool:
        for state in _SHED_ORDER:
            candidates = self._sheddable[state]
            if candidates:
                victim = next(iter(candidates))
                self.metrics.connections_shed.labels(state).inc()
                victim.shed()
                return True
        return False

    def moved(self, protocol: HttpProtocol, old: State | None, new: State | None) -> None:
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

    def progressed(self, protocol: HttpProtocol) -> None:
        """A byte of ``protocol``'s body came: it is now the last body to shed."""
        bodies = self._sheddable["body"]
        if protocol in bodies:  # re-inserted: to the end of the order
            del bodies[protocol]
            bodies[protocol] = None


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
