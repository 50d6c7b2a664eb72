"""An answer from the apiserver, as every part of the proxy sees it.

:meth:`Upstream.open <watchproxy.upstream.client.Upstream.open>` returns an
:class:`UpstreamResponse` for every kind of request: one-shot, streamed (a watch, ``logs -f``)
or an upgrade (exec, attach, port-forward). Reading it raises only :mod:`watchproxy.errors`
types: ``UpstreamUnavailable`` when the answer broke off, ``UpstreamTimeout`` when it went
silent for longer than its read timeout.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

from multidict import CIMultiDict

from watchproxy.errors import UpstreamTimeout, UpstreamUnavailable
from watchproxy.upstream import arrivals
from watchproxy.upstream.connection import Broken, Connection, ResponseHead

# How long a closed upgraded stream may take over its TLS shutdown before it is aborted.
CLOSE_WAIT_SECONDS = 2.0
# What an upgraded stream's reader buffers before the connection stops being read.
STREAM_LIMIT = 1 << 16

_Part = TypeVar("_Part", bytes | None, list[bytes] | None)


class UpstreamResponse:
    """One answer. Its owner ends it exactly once: :meth:`release` after reading its body to
    the end (the connection may serve again), :meth:`cut` to stop before that, or, for an
    upgrade, ``await`` :meth:`close`."""

    __slots__ = (
        "_connection",
        "_head",
        "_put_back",
        "_read_timeout",
        "_stream",
        "max_body",
        "passable",
        "raw_head",
        "reason",
        "status",
    )

    def __init__(
        self,
        connection: Connection,
        head: ResponseHead,
        read_timeout: float | None,
        put_back: Callable[[Connection], None],
    ) -> None:
        self._connection: Connection | None = connection
        self._head = head
        self._read_timeout = read_timeout
        self._put_back = put_back  # the pool's: takes a connection that may serve again
        self._stream: asyncio.StreamWriter | None = None
        self.status = head.status
        self.reason = head.reason
        # The head's bytes as they came from the apiserver, for a caller that may pass them on
        # unchanged when ``passable``: HTTP/1.1, no hop-by-hop field, one Content-Length.
        self.raw_head = head.raw
        self.passable = head.passable
        # :meth:`read` stops there and drops the rest (None: no bound).
        self.max_body: int | None = None

    @property
    def headers(self) -> CIMultiDict[str]:
        return self._head.headers  # parsed now, the first time

    @property
    def content_length(self) -> int | None:
        return self._head.content_length

    def head_passes_with(self, body: bytes) -> bool:
        """Whether the head may go to a client as it came, followed by ``body``: ``passable``,
        and its one Content-Length is ``body``'s (a 204 or 304 frames no body at all)."""
        return (
            self.passable
            and self.content_length == len(body)
            and self.status != 204
            and self.status != 304
        )

    @property
    def switched(self) -> bool:
        """The apiserver switched protocols (101): :meth:`take_stream` has the bytes."""
        return self.status == 101

    def whole_body(self) -> bytes | None:
        """The body, when all of it has already arrived (nothing to wait for); else None."""
        connection = self._connection
        if connection is None or not connection.complete:
            return None
        return connection.take_all()

    async def read(self) -> bytes:
        """The rest of the body (at most ``max_body`` bytes of it)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            parts.append(chunk)
            size += len(chunk)
            if self.max_body is not None and size >= self.max_body:
                return b"".join(parts)[: self.max_body]
        return b"".join(parts)

    def chunks(self) -> AsyncGenerator[bytes, None]:
        """The rest of the body, a part at a time as it arrives."""
        connection = self._connection
        assert connection is not None, "read after release"
        return arrivals.chunks(lambda: self._arrival(connection.next_chunk()))

    def part_lists(self) -> AsyncGenerator[list[bytes], None]:
        """The rest of the body as it arrives: every part that arrived since the last list was
        taken, as a list (see ``Connection.next_parts``)."""
        connection = self._connection
        assert connection is not None, "read after release"
        return arrivals.part_lists(lambda: self._arrival(connection.next_parts()))

    async def _arrival(self, arrival: Awaitable[_Part]) -> _Part:
        """What ``arrival`` brings, within the read timeout."""
        read_timeout = self._read_timeout
        # The failure is raised after the ``except``, so that nothing keeps the exception it
        # replaces (and its traceback) alive.
        failure: BaseException
        try:
            async with asyncio.timeout(read_timeout):
                return await arrival
        except Broken as error:
            failure = UpstreamUnavailable(f"the upstream answer broke: {error}")
        except TimeoutError:
            failure = UpstreamTimeout(f"the upstream answer sent nothing for {read_timeout}s")
        raise failure

    def take_stream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """After a 101: the upgraded connection as a byte stream, owned by the caller from here
        (this answer's :meth:`close` still closes it)."""
        connection, self._connection = self._connection, None
        assert connection is not None and self.switched, "no upgraded connection to take"
        reader, writer = connection.take_stream(STREAM_LIMIT)
        self._stream = writer
        return reader, writer

    def release(self) -> None:
        """A connection whose answer was read to its end goes back to the pool (bytes of the
        body nobody read are dropped); any other is closed."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.reusable:
            connection.take_all()
            self._put_back(connection)
        else:
            connection.close()

    def cut(self) -> None:
        """Close before the end. Closing a TLS connection starts its shutdown (close_notify
        both ways), which ends later, in ``connection_lost``: ``Upstream.close`` waits for it."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
        if self._stream is not None:
            self._stream.close()

    async def close(self) -> None:
        """Cut, and wait (a bounded time) for the connection's TLS shutdown: what an upgrade's
        owner calls once its session ends."""
        connection, stream = self._connection, self._stream
        self.cut()
        closed = False
        try:
            async with asyncio.timeout(CLOSE_WAIT_SECONDS):
                if stream is not None:
                    await stream.wait_closed()
                elif connection is not None:
                    await connection.closed
            closed = True
        except (TimeoutError, OSError, ssl.SSLError):
            pass
        finally:
            # The peer never finished the TLS shutdown, or the owner was cancelled meanwhile
            # (a proxy stopping): nothing more is wanted from it; drop it, or the connection
            # would outlive the loop that owns it.
            if not closed:
                if stream is not None:
                    stream.transport.abort()
                elif connection is not None:
                    connection.abort()
