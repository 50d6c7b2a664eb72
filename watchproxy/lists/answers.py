"""LIST answers: whole values, or streams of pieces written at the pace each client reads.

A LIST answer is either an :class:`Answer` (a value with its whole body: one write) or a
:class:`StreamedAnswer`, whose body
is handed over piece by piece, each once the client has taken the last: a batch member's view of
one upstream answer (``lists.sharedbody``), or a LIST from the hub encoded from its cached
objects as it is written (:class:`EncodedAnswer`). Nothing here holds a whole answer per client:
a slow client holds one piece in its socket's buffer. The API port writes
:meth:`StreamedAnswer.chunks`, the body as an async iterator
(``server.protocol.Response.send_stream``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import NamedTuple

from multidict import CIMultiDict

from watchproxy.kube.headers import Headers

log = logging.getLogger("watchproxy.passthrough")

# A whole answer larger than this is written in pieces of this size, each once its client took
# the last (one write would hand the transport all of it: a copy per slow client); the hub
# encodes a streamed LIST in pieces of about this size.
PACED_BODY_BYTES = 256 * 1024


class Answer(NamedTuple):
    """A whole answer as a value: what a LIST service, a refusal or an error hands the API
    port's writer (``server.protocol.Response.send_answer``), which adds Content-Length."""

    status: int
    reason: str
    headers: Headers
    body: bytes


class ReaderCut(Exception):
    """This reader fell behind the window for too long, or the upstream body broke."""


class StreamedAnswer:
    """An answer whose body comes in pieces: :meth:`next` until None, then (or when its client
    leaves) :meth:`leave`, exactly once."""

    def __init__(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers

    async def next(self) -> bytes | None:
        """The next piece of the body; None at its end. Raises :class:`ReaderCut`: the client
        read too slowly, or the upstream body broke (the client's answer cannot be completed)."""
        raise NotImplementedError

    def leave(self) -> None:
        """Its client is done with it (read to the end, or left): what it held goes."""

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as an async iterator; leaves when the iteration ends or is closed."""
        try:
            while (chunk := await self.next()) is not None:
                yield chunk
        finally:
            self.leave()


class EncodedAnswer(StreamedAnswer):
    """A body encoded piece by piece as it is written (``pieces``: a generator over references
    to the hub's cached objects, taken when the LIST was answered): a LIST of a large
    collection never exists as one bytes object."""

    def __init__(
        self, status: int, headers: CIMultiDict[str], first: bytes, pieces: Iterator[bytes]
    ) -> None:
        super().__init__(status, "OK", headers)
        self._first: bytes | None = first
        self._pieces: Iterator[bytes] | None = pieces

    async def next(self) -> bytes | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._pieces is None:
            return None
        return next(self._pieces, None)

    def leave(self) -> None:
        self._first = None
        self._pieces = None  # the references to the cached objects go with it


def encoded(content_type: str, pieces: Iterator[bytes]) -> bytes | EncodedAnswer:
    """A LIST body from the hub: whole bytes when it is one piece, else streamed."""
    first = next(pieces, b"")
    second = next(pieces, None)
    if second is None:
        return first
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": content_type})

    def rest() -> Iterator[bytes]:
        yield second
        yield from pieces

    return EncodedAnswer(200, headers, first, rest())


async def paced_chunks(body: bytes) -> AsyncIterator[bytes]:
    """A large whole answer in pieces of PACED_BODY_BYTES, for a writer that hands the
    transport each once the client took the last: the batch's members share its one body, and
    a slow client holds one piece in its buffer, not a copy of the whole."""
    for start in range(0, len(body), PACED_BODY_BYTES):
        yield body[start : start + PACED_BODY_BYTES]
