"""What the hub needs from the world, as small protocols, so that it stays free of I/O libraries.

The hub imports neither aiohttp nor ``watchproxy.upstream``: the upstream side is a
:class:`WatchSource` (implemented by ``watchproxy.upstream.watchsource``) and an
:class:`UpstreamHealth` (``watchproxy.upstream.connectivity.Connectivity`` fits it as it is);
a client's stream is a :class:`WatchSink` (``watchproxy.server.watchsink``). ``app.py`` wires
them together.

Errors cross these seams as :mod:`watchproxy.errors` types only: a source raises
``ProxyError`` subclasses (``UpstreamUnavailable`` when no HTTP answer came or the stream broke,
``UpstreamTimeout`` when a read timed out), a sink raises ``ConnectionError`` when the client
has gone.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Protocol


class UpstreamAnswer(Protocol):
    """One upstream HTTP answer whose body has not been read yet. The caller closes it."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    @property
    def retry_after(self) -> float | None:
        """The answer's ``Retry-After`` in seconds, if it has one."""
        ...

    async def body(self) -> bytes: ...

    def pieces(self) -> AsyncGenerator[bytes, None]:
        """The body, decoded, in pieces as it arrives (a LIST page parsed as it comes); a
        body inflated past the source's bound raises ``UpstreamBodyTooLarge``. The caller
        ``aclose()``s it when it stops reading early."""
        ...

    def lines(self) -> AsyncGenerator[bytes, None]:
        """The body as ``\\n``-terminated lines of any size up to the source's limit.

        The caller ``aclose()``s it when it stops reading early.
        """
        ...

    def line_batches(self) -> AsyncGenerator[tuple[list[bytes], int], None]:
        """What :meth:`lines` yields, a piece of the body's worth at a time, with its size in
        bytes (a cold key's initial events, taken by the thousand)."""
        ...

    def frames(self) -> AsyncGenerator[bytes, None]:
        """The body as length-prefixed frames (a protobuf watch), each with its prefix."""
        ...

    def close(self) -> None:
        """Release the connection; after a body was read whole it may be reused."""
        ...


class WatchSource(Protocol):
    """Opens the upstream LISTs and WATCHes of shared watches (GET, the proxy's identity)."""

    async def open(
        self, path_qs: str, *, accept: str, verb: str, forwarded_auth: str | None
    ) -> UpstreamAnswer:
        """Send one GET; raise a ``ProxyError`` when no HTTP answer comes.

        ``verb`` is "list" or "watch"; a watch has no total deadline.
        """
        ...


class UpstreamHealth(Protocol):
    """Is the apiserver reachable? One prober decides; shared watches wait on it."""

    @property
    def down(self) -> bool: ...

    async def wait_up(self) -> None: ...

    def retry_after(self) -> float: ...


class WatchSink(Protocol):
    """One client's watch response, headers already sent (200, chunked).

    Each write (``write``, ``send_lines``, ``frame``) is one flush of the stream: for a sink
    whose ``coding`` is gzip, one complete gzip member, as kube-apiserver 1.37 flushes.
    """

    @property
    def coding(self) -> str:
        """The body's content coding; sinks of the same coding frame alike."""
        ...

    async def write(self, data: bytes) -> None:
        """Write and flush; ``ConnectionError`` when the client has gone."""
        ...

    def frame(self, data: bytes) -> bytes:
        """``data`` as it goes on the wire (one HTTP chunk, encoded in the sink's coding);
        the same for every sink of that coding."""
        ...

    def send_framed(self, framed: bytes) -> bool:
        """Queue bytes from :meth:`frame` without waiting.

        False when the client has gone or its write buffer is over the high-water mark after
        this write: write nothing more until :meth:`drain` returns.
        """
        ...

    def send_lines(self, lines: Sequence[bytes], size: int) -> bool:
        """Queue ``lines`` (``size`` bytes together) as one chunk, without joining them: the
        transport keeps references to the shared lines. Returns as :meth:`send_framed`."""
        ...

    async def drain(self) -> None:
        """Until the write buffer is under its low-water mark; ``ConnectionError`` if gone."""
        ...

    async def write_eof(self) -> None: ...

    def client_gone(self) -> bool: ...

    def abort(self) -> None:
        """Drop the connection at once (wakes a write blocked on a client that reads nothing)."""
        ...

    def close(self) -> None: ...


class WatchStarter(Protocol):
    """Sends a client watch's 200 and headers when the hub is ready to stream."""

    async def start(self, content_type: str) -> WatchSink:
        """``ConnectionError`` when the client has gone already."""
        ...
