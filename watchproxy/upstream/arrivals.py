"""An upstream answer's body as async iterators: the two async generators of
:class:`~watchproxy.upstream.response.UpstreamResponse`.

Apart from it because mypyc does not compile an async generator: this module stays Python, and
``upstream/response.py``, which every request reads, is compiled.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable


async def chunks(arrive: Callable[[], Awaitable[bytes | None]]) -> AsyncGenerator[bytes, None]:
    """What ``arrive`` brings, a part at a time, until it brings None."""
    while (chunk := await arrive()) is not None:
        yield chunk


async def part_lists(
    arrive: Callable[[], Awaitable[list[bytes] | None]],
) -> AsyncGenerator[list[bytes], None]:
    """What ``arrive`` brings, a list of parts at a time, until it brings None."""
    while (parts := await arrive()) is not None:
        yield parts
