"""Reading a streamed body: newline-delimited JSON lines and length-prefixed protobuf frames."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator


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
