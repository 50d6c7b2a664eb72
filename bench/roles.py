"""What every benchmark role process shares: the line protocol with the orchestrator.

Each role (``bench.fake``, ``bench.proxy``, ``bench.ceiling``, ``bench.subscribers``) is its own
OS process with its own event loop (uvloop). It reads one command per line on stdin and answers
with one JSON object per line on stdout; logs go to stderr. End of stdin means the orchestrator
is gone: the role stops, so nothing outlives a crashed or killed run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

# Our event lines carry this annotation: the generator's time.time_ns() just before the write.
STAMP_KEY = "bench/sent-ns"
NAMESPACE = "default"
RESOURCE = "configmaps"
WATCH_PATH = f"/api/v1/namespaces/{NAMESPACE}/{RESOURCE}"


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency of watchproxy
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def emit(message: dict[str, Any]) -> None:
    """One JSON line to the orchestrator."""
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(sys.stdin.fileno(), "rb", 0)
    )
    return reader


async def serve_commands(
    handle: Callable[[list[str]], Coroutine[Any, Any, dict[str, Any] | None]],
) -> None:
    """Answer commands until ``quit`` or end of stdin. ``handle`` returns the reply (or None)."""
    reader = await stdin_reader()
    while True:
        raw = await reader.readline()
        if not raw:
            return  # the orchestrator went away
        words = raw.decode().split()
        if not words:
            continue
        if words[0] == "quit":
            return
        reply = await handle(words)
        if reply is not None:
            emit(reply)


async def generate(
    write_one: Callable[[], Awaitable[int]], events: int, rate: float
) -> dict[str, Any]:
    """The generator of the upstream roles: ``events`` writes (``write_one`` returns the RV it
    wrote) at ``rate``/s, or as fast as possible (yielding after each write so the watch streams
    interleave) when ``rate`` <= 0. The ``gen`` command's answer: first/last wall time and RV,
    and how far the paced schedule slipped at worst (``late_ms``)."""
    loop = asyncio.get_running_loop()
    first_ns = time.time_ns()
    start = loop.time()
    rv_first = rv_last = -1
    late = 0.0
    for done in range(events):
        if rate > 0:
            # Paced against the start time so the rate does not drift with write cost.
            delay = start + done / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late = max(late, -delay)
        rv_last = await write_one()
        if done == 0:
            rv_first = rv_last
        if rate <= 0:
            await asyncio.sleep(0)
    return {
        "first_ns": first_ns,
        "last_ns": time.time_ns(),
        "rv_first": rv_first,
        "rv_last": rv_last,
        "late_ms": round(late * 1000, 3),
    }


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    install_uvloop()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole process group
        asyncio.run(main())
