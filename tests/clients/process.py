"""Run one real client program that prints a JSON line per event it receives."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

Line = dict[str, Any]


class ClientProcess:
    """A client subprocess and the lines it has printed so far.

    The reader task belongs to this object: ``stop()`` ends the process (SIGTERM, then SIGKILL
    if it lingers), waits for it and for the reader. stderr goes to ``log_path`` so that a
    failure can show what the client said.
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
                limit=1 << 20,  # one event line can be a whole large object
            )
        self._reader = asyncio.get_running_loop().create_task(
            self._read(), name=f"client-{self.name}"
        )

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
        self, predicate: Callable[[list[Line]], bool], *, timeout: float = 10.0, what: str
    ) -> None:
        """Return once ``predicate(lines)`` holds; an AssertionError after ``timeout`` s or if
        the client exits first. Woken by each new line, so it never polls."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self.lines):
                    if self._eof:
                        raise AssertionError(f"{self.name} exited before {what}\n{self.report()}")
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{self.name}: timed out after {timeout} s waiting for {what}\n{self.report()}"
            ) from None

    async def stop(self, timeout: float = 10.0) -> int:
        """End the client (SIGTERM: it exits cleanly) and return its exit code."""
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            try:
                self.returncode = await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                process.kill()
                await process.wait()
                self.returncode = -signal.SIGKILL
        reader, self._reader = self._reader, None
        if reader is not None:
            # The pipe closes with the process, so the reader ends on its own.
            await asyncio.wait_for(reader, timeout)
        assert self.returncode is not None
        return self.returncode

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text[-limit:]

    def report(self, last: int = 15) -> str:
        """The client's last lines and stderr, for assertion messages."""
        shown = "\n".join(json.dumps(line) for line in self.lines[-last:])
        return (
            f"--- last {last} of {len(self.lines)} lines of {self.name}:\n{shown}\n"
            f"--- stderr of {self.name}:\n{self.stderr_tail()}"
        )

    async def __aenter__(self) -> ClientProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


@contextlib.asynccontextmanager
async def running_client(
    name: str,
    argv: Sequence[str],
    *,
    kubeconfig: str,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[ClientProcess]:
    """Start a client with ``KUBECONFIG`` pointing at ``kubeconfig``; stop it on exit."""
    env = {**os.environ, "KUBECONFIG": kubeconfig, **(extra_env or {})}
    async with ClientProcess(name, argv, env=env, log_path=log_dir / f"{name}.stderr") as client:
        yield client
