"""An answer from the apiserver, as every part of the proxy sees it.

:meth:`Upstream.open <watchproxy.upstream.client.Upstream.open>` returns an
:class:`UpstreamResponse` whichever way the request went (a pooled connection of
``upstream.pool`` for one-shot requests, aiohttp's client for streams). Reading it raises only
:mod:`watchproxy.errors` types: ``UpstreamUnavailable`` when the answer broke off,
``UpstreamTimeout`` when it went silent for longer than its read timeout. aiohttp's errors are
mapped here and nowhere else, ``from None``, so that no aiohttp exception (and through its
traceback, no connection) outlives the read that failed.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from watchproxy.errors import UpstreamTimeout, UpstreamUnavailable
from watchproxy.upstream.http1 import Broken, ResponseHead

if TYPE_CHECKING:
    from watchproxy.upstream.keepalive import PooledConnection
    from watchproxy.upstream.pool import ConnectionPool


class UpstreamResponse(abc.ABC):
    """One answer. Its owner ends it exactly once: :meth:`release` after reading its body to
    the end (the connection may serve again), :meth:`cut` to stop before that."""

    status: int
    reason: str
    # The head's bytes as they came from the apiserver (HTTP/1.1 on a pooled connection), for
    # a caller that may pass them on unchanged; empty where they are not kept.
    raw_head: bytes = b""
    # Whether ``raw_head`` may go to a client unchanged: no hop-by-hop field, one Content-Length.
    passable: bool = False

    @property
    @abc.abstractmethod
    def headers(self) -> CIMultiDict[str] | CIMultiDictProxy[str]: ...

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def whole_body(self) -> bytes | None:
        """The body, when all of it has already arrived (nothing to wait for); else None."""
        return None

    @abc.abstractmethod
    async def read(self) -> bytes:
        """The rest of the body."""

    @abc.abstractmethod
    def chunks(self) -> Chunks:
        """The rest of the body, as it arrives."""

    @abc.abstractmethod
    def release(self) -> None: ...

    @abc.abstractmethod
    def cut(self) -> None: ...


def _broken(error: BaseException | str) -> UpstreamUnavailable:
    return UpstreamUnavailable(f"the upstream answer broke: {error}")


def _silent(read_timeout: float | None) -> UpstreamTimeout:
    return UpstreamTimeout(f"the upstream answer sent nothing for {read_timeout}s")


class Chunks(Protocol):
    """A body's parts as they arrive; ``aclose`` stops reading early (the answer's owner still
    ends the answer). Iterator classes, not async generators: mypyc compiles this module."""

    def __aiter__(self) -> Chunks: ...

    async def __anext__(self) -> bytes: ...

    async def aclose(self) -> None: ...


class _PooledChunks:
    __slots__ = ("_connection", "_read_timeout")

    def __init__(self, connection: PooledConnection, read_timeout: float | None) -> None:
        self._connection: PooledConnection | None = connection
        self._read_timeout = read_timeout

    def __aiter__(self) -> _PooledChunks:
        return self

    async def __anext__(self) -> bytes:
        connection = self._connection
        if connection is None:
            raise StopAsyncIteration
        # The failure is raised after the ``except``, so that nothing keeps the exception it
        # replaces (and its traceback) alive.
        failure: BaseException | None = None
        try:
            async with asyncio.timeout(self._read_timeout):
                chunk = await connection.next_chunk()
        except Broken as error:
            failure = _broken(error)
        except TimeoutError:
            failure = _silent(self._read_timeout)
        if failure is not None:
            self._connection = None
            raise failure
        if chunk is None:
            self._connection = None
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self._connection = None


class _StreamChunks:
    __slots__ = ("_iterator",)

    def __init__(self, iterator: AsyncIterator[bytes]) -> None:
        self._iterator: AsyncIterator[bytes] | None = iterator

    def __aiter__(self) -> _StreamChunks:
        return self

    async def __anext__(self) -> bytes:
        iterator = self._iterator
        if iterator is None:
            raise StopAsyncIteration
        # The failure becomes a message inside the ``except`` and is raised after it, so the
        # aiohttp exception, its traceback and the connection it holds are released before
        # anyone awaits anything.
        failure: BaseException | None = None
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            self._iterator = None
            raise
        except TimeoutError:
            failure = UpstreamTimeout("the upstream stream stopped sending")
        except (aiohttp.ClientError, OSError) as error:
            failure = _broken(_describe_read(error))
        self._iterator = None
        raise failure

    async def aclose(self) -> None:
        self._iterator = None


class PooledAnswer(UpstreamResponse):
    """An answer on a pooled keep-alive connection (``upstream.pool``)."""

    def __init__(
        self,
        pool: ConnectionPool,
        connection: PooledConnection,
        head: ResponseHead,
        read_timeout: float | None,
    ) -> None:
        self._pool = pool
        self._connection: PooledConnection | None = connection
        self._read_timeout = read_timeout
        self._head = head
        self.status = head.status
        self.reason = head.reason
        self.raw_head = head.raw
        self.passable = head.passable

    @property
    def headers(self) -> CIMultiDict[str]:
        return self._head.headers  # parsed now, the first time (http1.ResponseHead)

    @property
    def content_length(self) -> int | None:
        return self._head.content_length

    def whole_body(self) -> bytes | None:
        connection = self._connection
        if connection is None or not connection.complete:
            return None
        return connection.take_all()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def chunks(self) -> Chunks:
        connection = self._connection
        assert connection is not None, "read after release"
        return _PooledChunks(connection, self._read_timeout)

    def release(self) -> None:
        """A connection whose answer was read to its end goes back to the pool (bytes of the
        body nobody read are dropped); any other is closed."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.reusable:
            connection.take_all()
            self._pool.put(connection)
        else:
            connection.close()

    def cut(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class StreamAnswer(UpstreamResponse):
    """A streamed answer (a watch, ``logs -f``) on aiohttp's client."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.reason = response.reason or ""

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._response.headers

    async def read(self) -> bytes:
        failure: BaseException | None = None
        try:
            return await self._response.read()
        except TimeoutError:  # aiohttp's read timeout (also a ClientError subclass)
            failure = UpstreamTimeout("the upstream answer went silent")
        except (aiohttp.ClientError, OSError) as error:
            failure = _broken(_describe_read(error))
        raise failure

    def chunks(self) -> Chunks:
        return _StreamChunks(self._response.content.iter_any())

    def release(self) -> None:
        self._response.release()

    def cut(self) -> None:
        """Close before the end. Closing a TLS connection starts its shutdown (close_notify
        both ways), which ends later, in ``connection_lost``: ``Upstream.close`` waits for it."""
        self._response.close()


def _describe_read(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
