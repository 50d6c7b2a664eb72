"""A client program run as a subprocess, and the JSON lines it has printed so far."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Line = dict[str, Any]


class LineClient:
    """One client subprocess; ``lines`` grows as it prints. Owns its reader task: ``stop()``
    sends SIGTERM (SIGKILL after 10 s), waits for the process and for the reader.

    stdout is read by a task (so a client that prints fast never blocks on a full pipe);
    stderr goes to ``log_path`` so a failure can show what the client said.
    """

    def __init__(
        self, name: str, argv: Sequence[str], *, env: dict[str, str], log_path: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.lines: list[Line] = []
        self.returncode: int | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._eof = False

    async def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self.argv,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=1 << 20,
            )
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=self.name)

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        try:
            async for raw in self._process.stdout:
                if raw.strip():
                    self.lines.append(json.loads(raw))
                    self._changed.set()
        finally:
            self._eof = True
            self._changed.set()

    async def wait_until(
        self, predicate: Callable[[list[Line]], bool], *, what: str, timeout: float = 15.0
    ) -> None:
        """Return once ``predicate(lines)`` holds; AssertionError after ``timeout`` s or when the
        client exits first. Woken by every new line: no polling."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self.lines):
                    if self._eof:
                        raise AssertionError(f"{self.name} exited before {what}\n{self.report()}")
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{self.name}: no {what} within {timeout} s\n{self.report()}"
            ) from None

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
            self.returncode = process.returncode
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                await asyncio.wait_for(reader, 10)
            except TimeoutError:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

    def report(self, last: int = 40) -> str:
        """The client's last lines and its stderr, for assertion messages."""
        shown = "\n".join(json.dumps(line) for line in self.lines[-last:])
        try:
            stderr = self.log_path.read_text(errors="replace")[-2000:]
        except FileNotFoundError:
            stderr = ""
        head = f"--- {self.name}: last {last} of {len(self.lines)} lines"
        return f"{head}\n{shown}\n--- stderr\n{stderr}"
