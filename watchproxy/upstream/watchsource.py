"""The hub's :class:`~watchproxy.hub.ports.WatchSource`, made of the one upstream client.

Every failure leaves as a :mod:`watchproxy.errors` type: reading an ``UpstreamResponse`` raises
nothing else, and an event over the size limit is turned into one here.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

from watchproxy.config import UpstreamConfig
from watchproxy.errors import UpstreamBodyTooLarge, UpstreamUnavailable
from watchproxy.policy.ratelimit import parse_retry_after
from watchproxy.upstream.bodies import (
    BadBody,
    BodyTooLarge,
    LineTooLong,
    decoded,
    decoded_lists,
    decoded_whole,
    read_frames,
    read_line_batches,
    read_lines,
)
from watchproxy.upstream.client import Upstream
from watchproxy.upstream.response import UpstreamResponse

_Record = TypeVar("_Record")


class _Answer:
    """One upstream response, seen through the hub's ``UpstreamAnswer`` protocol."""

    def __init__(self, response: UpstreamResponse, max_line: int, max_decoded: int | None) -> None:
        self._response = response
        self._max_line = max_line
        self._max_decoded = max_decoded
        self._whole = False

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def content_type(self) -> str:
        return self._response.headers.get("Content-Type", "application/json")

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self._response.headers.get("Retry-After"), time.time())

    @property
    def _encoding(self) -> str:
        return self._response.headers.get("Content-Encoding", "identity")

    async def body(self) -> bytes:
        body = self._response.whole_body()
        if body is None:
            body = await self._response.read()
        self._whole = True
        try:
            return decoded_whole(body, self._encoding, self._max_decoded)
        except BodyTooLarge as error:
            raise UpstreamBodyTooLarge(f"the upstream answer is too large: {error}") from None
        except BadBody as error:
            raise UpstreamUnavailable(f"the upstream answer broke: {error}") from None

    async def pieces(self) -> AsyncGenerator[bytes, None]:
        part_lists = decoded_lists(
            self._response.part_lists(), self._encoding, max_decoded=self._max_decoded
        )
        failure: Exception | None = None
        try:
            async for parts in part_lists:
                yield b"".join(parts) if len(parts) != 1 else parts[0]
        except BodyTooLarge as error:
            failure = UpstreamBodyTooLarge(f"the upstream answer is too large: {error}")
        except BadBody as error:
            failure = UpstreamUnavailable(f"the upstream answer broke: {error}")
        finally:
            await part_lists.aclose()  # type: ignore[attr-defined]
        if failure is not None:
            raise failure
        self._whole = True  # read to its end: the connection may serve again

    def lines(self) -> AsyncGenerator[bytes, None]:
        chunks = decoded(self._response.chunks(), self._encoding)
        return self._records(read_lines(chunks, self._max_line))

    def line_batches(self) -> AsyncGenerator[tuple[list[bytes], int], None]:
        part_lists = decoded_lists(self._response.part_lists(), self._encoding)
        return self._records(read_line_batches(part_lists, self._max_line))

    def frames(self) -> AsyncGenerator[bytes, None]:
        chunks = decoded(self._response.chunks(), self._encoding)
        return self._records(read_frames(chunks, self._max_line))

    async def _records(self, inner: AsyncIterator[_Record]) -> AsyncGenerator[_Record, None]:
        failure: str | None = None
        try:
            async for line in inner:
                yield line
        except (LineTooLong, BadBody) as error:
            failure = str(error)
        finally:
            # Closed here, by its owner, rather than by the loop's finalizer in a task.
            await inner.aclose()  # type: ignore[attr-defined]
        if failure is not None:
            raise UpstreamUnavailable(f"the upstream watch broke: {failure}")

    def close(self) -> None:
        if self._whole:
            self._response.release()  # read to the end: the connection may serve again
        else:
            self._response.cut()


class UpstreamWatchSource:
    """Shared watches' LISTs and WATCHes, through :meth:`Upstream.open` like every request."""

    def __init__(
        self, upstream: Upstream, config: UpstreamConfig, *, max_decoded_body: int | None = None
    ) -> None:
        self._upstream = upstream
        self._config = config
        # A whole answer (a page of the hub's LIST) inflated past this fails (None: no bound);
        # a streamed one is bounded per piece and per line instead (upstream/bodies.py).
        self._max_decoded_body = max_decoded_body

    async def open(
        self, path_qs: str, *, accept: str, verb: str, forwarded_auth: str | None
    ) -> _Answer:
        streaming = verb == "watch"
        response = await self._upstream.open(
            "GET",
            path_qs,
            # gzip: the apiserver compresses what it would compress for the clients themselves
            # (a LIST over 128 KiB; from 1.37 a watch-list), one member per flush; the hub
            # decodes it (upstream/bodies.py), so the wire carries no more than direct.
            headers={"Accept": accept, "Accept-Encoding": "gzip", "User-Agent": "watchproxy"},
            verb=verb,
            streaming=streaming,
            read_timeout=self._config.watch_read_timeout_seconds if streaming else None,
            wait=True,
            forwarded_auth=forwarded_auth,
        )
        return _Answer(response, self._config.max_event_bytes, self._max_decoded_body)
