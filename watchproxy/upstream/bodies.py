"""Reading a streamed body: newline-delimited JSON lines and length-prefixed protobuf frames,
gzip-encoded or not.

Upstream answers are never decompressed on the way in (pass-through keeps ``Content-Encoding``
byte for byte), so a gzip body the hub asked for is decoded here, by :class:`GzipMembers`.
kube-apiserver 1.37 writes one gzip member per flush of a compressed watch-list; aiohttp before
3.14 kept only the first member, and from 3.14.4 refuses more than 1,024 members in one
decompress call, so the hub does not leave it to aiohttp.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from io import BytesIO

# zlib's window bits for a gzip wrapper (16 + the largest window).
_GZIP_WBITS = 16 + zlib.MAX_WBITS


# Most bytes one decompress call may produce: a gzip member expands up to about 1,000 times
# (a "gzip bomb"), so a 256 KiB read could otherwise become 256 MiB at once. What is not yet
# inflated stays in zlib's ``unconsumed_tail`` until the reader takes the next piece.
DECODED_PIECE_BYTES = 256 * 1024


class GzipMembers:
    """Decodes a gzip body of any number of members (RFC 1952 allows a series), fed in pieces
    as they arrive; members may end and begin anywhere in a piece.

    ``pieces`` yields what is decodable so far in pieces of at most ``DECODED_PIECE_BYTES``,
    inflating the next one only when asked for it, so a reader that stops (a line over its
    limit) never holds more; ``feed`` returns them joined. Past ``max_decoded`` bytes in all
    (None: no total bound) either raises :class:`BodyTooLarge`. ``finish`` raises
    :class:`BadBody` when the body ended inside a member (a truncated body is never taken for a
    complete one).
    """

    def __init__(self, max_decoded: int | None = None) -> None:
        self._member: zlib._Decompress | None = None
        self._max_decoded = max_decoded
        self.members = 0  # members completed
        self.decoded = 0  # bytes produced so far

    def feed(self, data: bytes) -> bytes:
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        while True:
            member = self._member
            if member is None:
                if not data:
                    return
                member = self._member = zlib.decompressobj(_GZIP_WBITS)
            try:
                out = member.decompress(data, DECODED_PIECE_BYTES)
            except zlib.error as error:
                raise BadBody(f"gzip body is not valid: {error}") from None
            if out:
                self.decoded += len(out)
                if self._max_decoded is not None and self.decoded > self._max_decoded:
                    raise BodyTooLarge(self._max_decoded)
                yield out
            if member.eof:
                self.members += 1
                self._member = None
                data = member.unused_data
                continue
            # A full piece may leave input in unconsumed_tail, or output still inside zlib
            # (a long back-reference): ask again. Else the member goes on in the next read.
            data = member.unconsumed_tail
            if not data and len(out) < DECODED_PIECE_BYTES:
                return

    def finish(self) -> None:
        if self._member is not None:
            raise BadBody(f"gzip body truncated inside member {self.members + 1}")


def decoded(chunks: AsyncIterator[bytes], encoding: str) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive, decoded from ``encoding`` (its Content-Encoding:
    identity or gzip); an unknown encoding raises :class:`BadBody` once read."""
    encoding = encoding.strip().lower() or "identity"
    if encoding == "identity":
        # ``chunks`` itself: a generator that passed each piece on was one more step of
        # Python per piece, for every piece of every body.
        return chunks
    return _gunzipped(chunks, encoding)


def decoded_lists(
    part_lists: AsyncIterator[list[bytes]], encoding: str, *, max_decoded: int | None = None
) -> AsyncIterator[list[bytes]]:
    """:func:`decoded` of a body read a list of parts at a time (``part_lists``: what arrived
    between two reads): lists of decoded pieces, never joined. kube-apiserver 1.37 compresses
    a watch-list one gzip member per event: a read's members come out as one list, cut every
    ``DECODED_PIECE_BYTES`` so that a bomb never inflates a whole read at once. A gzip body
    inflated past ``max_decoded`` bytes in all raises :class:`BodyTooLarge`."""
    encoding = encoding.strip().lower() or "identity"
    if encoding == "identity":
        return part_lists
    return _gunzipped_lists(part_lists, encoding, max_decoded)


async def _gunzipped(chunks: AsyncIterable[bytes], encoding: str) -> AsyncIterator[bytes]:
    """``decoded`` of a body whose ``encoding`` (stripped, lower case) is not identity."""
    if encoding != "gzip":
        raise BadBody(f"unsupported Content-Encoding {encoding!r}")
    members = GzipMembers()
    async for chunk in chunks:
        for out in members.pieces(chunk):
            yield out
    members.finish()


async def _gunzipped_lists(
    part_lists: AsyncIterable[list[bytes]], encoding: str, max_decoded: int | None
) -> AsyncIterator[list[bytes]]:
    if encoding != "gzip":
        raise BadBody(f"unsupported Content-Encoding {encoding!r}")
    members = GzipMembers(max_decoded)
    async for parts in part_lists:
        gathered: list[bytes] = []
        size = 0
        for part in parts:
            for out in members.pieces(part):
                gathered.append(out)
                size += len(out)
                if size >= DECODED_PIECE_BYTES:
                    yield gathered
                    gathered, size = [], 0
        if gathered:
            yield gathered
    members.finish()


def decoded_whole(body: bytes, encoding: str, max_decoded: int | None = None) -> bytes:
    """A whole body, decoded from ``encoding``; :class:`BodyTooLarge` past ``max_decoded``
    bytes once decoded (None: no bound), before more than one piece over it is held."""
    encoding = encoding.strip().lower() or "identity"
    if encoding == "identity":
        return body
    if encoding != "gzip":
        raise BadBody(f"unsupported Content-Encoding {encoding!r}")
    members = GzipMembers(max_decoded)
    out = members.feed(body)
    members.finish()
    return out


async def read_lines(body: AsyncIterable[bytes], max_line: int) -> AsyncIterator[bytes]:
    """Yield ``\\n``-terminated lines of a watch body, of any size up to ``max_line``.

    aiohttp's own readline refuses long lines; one watch event can be several MiB.
    A final fragment without a newline is a truncated event and is not yielded.
    """
    buffer = bytearray()
    async for chunk in body:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                buffer += chunk[start:]
                if len(buffer) > max_line:
                    raise LineTooLong(len(buffer))
                break
            if buffer:
                buffer += chunk[start : end + 1]
                line = bytes(buffer)
                buffer.clear()
            else:
                line = chunk[start : end + 1]
            if len(line) > max_line:
                raise LineTooLong(len(line))
            yield line
            start = end + 1


async def read_line_batches(
    part_lists: AsyncIterable[list[bytes]], max_line: int
) -> AsyncIterator[tuple[list[bytes], int]]:
    """The body of a watch as lists of its ``\n``-terminated lines, a read's worth at a time
    (``part_lists``: the body's parts as they arrived, a list per read), each with its size in
    bytes (known from the parts, not summed line by line).

    What :func:`read_lines` yields, for a reader that takes lines by the thousand (a cold key's
    initial events relayed to its first client). A part that is one whole line (what an
    apiserver writes: one HTTP chunk per event) is that line, not a copy. Any other part is cut
    with ``BytesIO``, which shares the part and finds each line's end with memchr: each line a
    copy of its own, made once. A line over ``max_line`` raises ``LineTooLong`` once it is
    whole or as long; a final fragment without a newline is not yielded.
    """
    carry = b""  # a line begun in the parts before
    async for parts in part_lists:
        lines: list[bytes] = []
        size = 0
        for part in parts:
            if not carry and part[-1:] == b"\n" and part.find(b"\n", 0, -1) < 0:
                lines.append(part)
                size += len(part)
                continue
            cut = part.rfind(b"\n") + 1
            if not cut:
                carry += part
                if len(carry) > max_line:
                    raise LineTooLong(len(carry))
                continue
            cut_lines = BytesIO(part).readlines()
            size += len(carry) + cut
            if carry:  # the line begun in the parts before ends in this one
                cut_lines[0] = carry + cut_lines[0]
                if len(cut_lines[0]) > max_line:
                    raise LineTooLong(len(cut_lines[0]))
            carry = b"" if cut == len(part) else cut_lines.pop()
            lines += cut_lines
        if lines:
            yield lines, size


async def read_frames(body: AsyncIterable[bytes], max_frame: int) -> AsyncIterator[bytes]:
    """Yield the length-prefixed frames of a protobuf watch body, each with its prefix.

    The prefix is a 4-byte big-endian length; a frame over ``max_frame`` raises
    ``LineTooLong``. A truncated final frame is not yielded (as a truncated line is not).
    """
    buffer = bytearray()
    async for chunk in body:
        buffer += chunk
        start = 0
        while len(buffer) - start >= 4:
            size = int.from_bytes(buffer[start : start + 4], "big")
            if size > max_frame:
                raise LineTooLong(size)
            end = start + 4 + size
            if len(buffer) < end:
                break
            yield bytes(buffer[start:end])
            start = end
        del buffer[:start]


class LineTooLong(Exception):
    """A watch event line exceeded the configured limit."""

    def __init__(self, size: int) -> None:
        super().__init__(f"watch event line of {size} bytes exceeds the limit")


class BadBody(Exception):
    """An upstream body that cannot be decoded: truncated or corrupt gzip, unknown encoding."""


class BodyTooLarge(BadBody):
    """A compressed upstream body that inflates past the bound its reader set."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"gzip body inflates past {limit} bytes")
        self.limit = limit
