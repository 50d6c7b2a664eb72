"""The hub's :class:`~watchproxy.hub.ports.WatchSource`, made of the one upstream client.

aiohttp stays on this side of the seam: every failure leaves as a :mod:`watchproxy.errors`
type, raised ``from None`` so that no aiohttp exception (and through its traceback, no
connection) is kept alive by whoever handles it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator

import aiohttp

from watchproxy.config import UpstreamConfig
from watchproxy.errors import UpstreamTimeout, UpstreamUnavailable
from watchproxy.policy.ratelimit import parse_retry_after
from watchproxy.upstream.bodies import BadBody, read_body
from watchproxy.upstream.client import LineTooLong, Upstream, describe, read_frames, read_lines


class _Answer:
    """One upstream response, seen through the hub's ``UpstreamAnswer`` protocol."""

    def __init__(self, response: aiohttp.ClientResponse, max_line: int, upstream: Upstream) -> None:
        self._response = response
        self._upstream = upstream
        self._max_line = max_line
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

    async def body(self) -> bytes:
        failure: str | None = None
        try:
            body = await read_body(self._response)
        except (aiohttp.ClientError, OSError, BadBody) as error:
            failure = describe(error)
        else:
            self._whole = True
            return body
        raise UpstreamUnavailable(f"the upstream answer broke: {failure}")

    def lines(self) -> AsyncGenerator[bytes, None]:
        return self._records(read_lines(self._response, self._max_line))

    def frames(self) -> AsyncGenerator[bytes, None]:
        return self._records(read_frames(self._response, self._max_line))

    async def _records(self, inner: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        # The failure is turned into a message inside the ``except`` and raised after it, so
        # the aiohttp exception, its traceback and the connection it holds are released
        # before anyone awaits anything (see issue 10).
        failure: str | None = None
        timed_out = False
        try:
            async for line in inner:
                yield line
        except TimeoutError as error:  # aiohttp's read timeout (also a ClientError subclass)
            failure, timed_out = describe(error), True
        except (aiohttp.ClientError, OSError, LineTooLong, BadBody) as error:
            failure = describe(error)
        finally:
            # Closed here, by its owner, rather than by the loop's finalizer in a task.
            await inner.aclose()  # type: ignore[attr-defined]
        if failure is None:
            return
        if timed_out:
            raise UpstreamTimeout(f"the upstream watch stopped sending: {failure}")
        raise UpstreamUnavailable(f"the upstream watch broke: {failure}")

    def close(self) -> None:
        if self._whole:
            self._response.release()  # read to the end: the connection may serve again
        else:
            self._upstream.cut(self._response)


class UpstreamWatchSource:
    """Shared watches' LISTs and WATCHes, through :meth:`Upstream.open` like every request."""

    def __init__(self, upstream: Upstream, config: UpstreamConfig) -> None:
        self._upstream = upstream
        self._config = config

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
        return _Answer(response, self._config.max_event_bytes, self._upstream)
