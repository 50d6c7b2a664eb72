"""Run one real client program that prints a JSON line per event it receives.

What a client prints is bounded, and a client known to be broken fails its test at once: a
client in a loop it cannot leave (kube-rs without back-off whose HTTP stack has died answers
every poll with the same error at once, hundreds of thousands of lines a minute) is stopped
after ``BROKEN_AFTER_ERRORS`` error lines in a row, ``MAX_LINES`` lines in all, a line that says
its client is dead for good (``FATAL_MESSAGES``) or any line after its own ``EXIT`` line, and
every wait on it then raises with a report of a few lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

Line = dict[str, Any]

# The line types the client programs print for an error (kube-rs and client-node: ERROR;
# the Go programs also WATCH_ERROR).
ERROR_TYPES = frozenset({"ERROR", "WATCH_ERROR"})
# A client that recovers prints a few errors and then events again; one that prints this many
# errors and nothing else is in a loop it cannot leave.
BROKEN_AFTER_ERRORS = 1000
# Error messages after which a client can never recover: kube-rs's client sends every request
# through a tower ``Buffer`` whose worker task, once gone, fails every later request at once.
FATAL_MESSAGES = ("buffer's worker closed unexpectedly",)
# The line a client prints last, when it exits (kubewatch); one printed after it is from a
# program that failed to end.
EXIT_TYPE = "EXIT"
# Lines kept in memory; a test's clients print a few thousand at most.
MAX_LINES = 100_000
# How much of one line a report shows.
LINE_CHARS = 300
# The key under which a client's lines carry the wall-clock time (time.time_ns()) at which this
# process read them, when the ClientProcess was asked to stamp them.
READ_AT = "readAt"


def bounded(items: Sequence[object], *, limit: int = 20) -> str:
    """``items`` as text of at most ``limit`` lines (each cut to LINE_CHARS), and how many."""
    shown = [str(item)[:LINE_CHARS] for item in items[:limit]]
    more = f"\n... and {len(items) - limit} more" if len(items) > limit else ""
    return f"{len(items)} item(s):\n" + "\n".join(shown) + more


class ClientProcess:
    """A client subprocess and the lines it has printed so far.

    The reader task belongs to this object: ``stop()`` ends the process (SIGTERM, then SIGKILL
    if it lingers), waits for it and for the reader. stderr goes to ``log_path`` so that a
    failure can show what the client said.

    Lines are JSON unless ``parse`` turns a raw line into a dict (e.g. kubectl's table rows);
    ``parse`` returns None for a line to leave out. With ``stamp_reads``, each line gets the
    wall-clock time it was read, in nanoseconds, under ``READ_AT`` (taken before parsing).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        log_path: Path,
        parse: Callable[[bytes], Line | None] | None = None,
        stamp_reads: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.parse = parse
        self.stamp_reads = stamp_reads
        self.started_at = 0  # time.time_ns() just before the process was started
        self.lines: list[Line] = []
        self.returncode: int | None = None
        # Why the client was stopped as broken (None: it was not), its first error line and
        # where that is in ``lines``.
        self.broken: str | None = None
        self.first_error: Line | None = None
        self.first_error_at = 0
        self.exited = False  # it printed its EXIT line
        self.errors_in_a_row = 0
        self.dropped = 0  # lines read after it was stopped as broken
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._eof = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        with open(self.log_path, "wb") as log:
            if not self.stamp_reads:
                self.started_at = time.time_ns()
                self._process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    env=self.env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    limit=1 << 20,  # one event line can be a whole large object
                )
                self._reader = loop.create_task(self._read(), name=f"client-{self.name}")
                return
            read_end, write_end = os.pipe()
            try:
                self.started_at = time.time_ns()
                self._process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    env=self.env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=write_end,
                    stderr=log,
                )
            except BaseException:
                os.close(read_end)
                raise
            finally:
                os.close(write_end)  # the child's copy is the only writer: EOF when it exits
        self._reader = loop.create_task(self._read_stamped(read_end), name=f"client-{self.name}")

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        try:
            async for raw in self._process.stdout:
                self._take(raw, 0)
        finally:
            self._eof = True
            self._changed.set()

    async def _read_stamped(self, fd: int) -> None:
        """Read ``fd`` in a thread of its own that stamps each line the moment it has it, so
        that a stamp does not wait for this loop's other work (a busy test loop delayed the
        loop's own reads by 100 ms); the lines are parsed and kept here, in order."""
        loop = asyncio.get_running_loop()
        received: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()

        def hand_over(item: tuple[bytes, int] | None) -> None:
            # The loop may be gone when a client outlives its test: nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(received.put_nowait, item)

        def pump() -> None:
            try:
                with open(fd, "rb") as pipe:
                    for raw in pipe:
                        hand_over((raw, time.time_ns()))
            finally:
                hand_over(None)

        # A thread of its own (not the loop's executor: its few workers would be taken by the
        # first clients for their whole run); it ends when the process's stdout closes.
        threading.Thread(target=pump, name=f"read-{self.name}", daemon=True).start()
        try:
            while (item := await received.get()) is not None:
                self._take(*item)
        finally:
            self._eof = True
            self._changed.set()

    def _take(self, raw: bytes, read_at: int) -> None:
        """One line read from the client at ``read_at`` (0: not stamped)."""
        if not raw.strip():
            return
        if self.broken is not None:
            self.dropped += 1  # read to the end so that the process is not blocked
            return
        line = json.loads(raw) if self.parse is None else self.parse(raw)
        if line is None:
            return
        if read_at:
            line[READ_AT] = read_at
        self.lines.append(line)
        self._note(line)
        self._changed.set()

    @property
    def ended(self) -> bool:
        """Its output has ended: the process exited (or closed its stdout)."""
        return self._eof

    def _note(self, line: Line) -> None:
        if line.get("type") in ERROR_TYPES:
            self.errors_in_a_row += 1
            if self.first_error is None:
                self.first_error = line
                self.first_error_at = len(self.lines) - 1
        else:
            self.errors_in_a_row = 0
        message = str(line.get("message", ""))
        if self.exited:
            self._give_up(f"a {line.get('type')} line after its {EXIT_TYPE} line")
        elif line.get("type") == EXIT_TYPE:
            self.exited = True
        elif any(fatal in message for fatal in FATAL_MESSAGES):
            self._give_up(f"a fatal error: {message[:LINE_CHARS]}")
        elif self.errors_in_a_row >= BROKEN_AFTER_ERRORS:
            self._give_up(f"{self.errors_in_a_row} error lines in a row")
        elif len(self.lines) >= MAX_LINES:
            self._give_up(f"more than {MAX_LINES} lines")

    def _give_up(self, why: str) -> None:
        """Known broken: kill it now (its test fails at its next wait). SIGKILL, not SIGTERM: a
        program in a loop it cannot leave may not leave it for SIGTERM either (kubewatch wedged
        in its runtime's shutdown printed errors for the 10 s until stop()'s SIGKILL)."""
        self.broken = why
        process = self._process
        if process is not None and process.returncode is None:
            process.kill()

    async def wait_until(
        self, predicate: Callable[[list[Line]], bool], *, timeout: float = 10.0, what: str
    ) -> None:
        """Return once ``predicate(lines)`` holds; an AssertionError after ``timeout`` s or if
        the client exits first. Woken by each new line, so it never polls."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self.lines):
                    if self.broken is not None:
                        raise AssertionError(
                            f"{self.name} is broken ({self.broken}) before {what}\n{self.report()}"
                        )
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
        # ``_process`` stays set while it is waited for: a line that shows it broken meanwhile
        # (errors printed after its EXIT line) kills it at once instead of after ``timeout``.
        process = self._process
        if process is not None:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            try:
                self.returncode = await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                process.kill()
                await process.wait()
                self.returncode = -signal.SIGKILL
            finally:
                self._process = None
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

    def report(self, problems: Sequence[object] = (), *, last: int = 15) -> str:
        """For assertion messages, bounded whatever the client printed: ``problems`` (the first
        few), whether it was stopped as broken, its first error, its last lines, its stderr."""
        parts = []
        if problems:
            parts.append(f"--- problems: {bounded(problems)}")
        if self.broken is not None:
            parts.append(
                f"--- stopped as broken: {self.broken} ({self.dropped} later lines not kept)"
            )
        if self.first_error is not None:
            # With the lines before it: what the client was doing (an EXIT line there says the
            # error came while it was shutting down).
            before = self.lines[max(0, self.first_error_at - 3) : self.first_error_at]
            shown_before = "".join(f"{json.dumps(line)[:LINE_CHARS]}\n" for line in before)
            parts.append(
                f"--- first error (line {self.first_error_at + 1}), after:\n{shown_before}"
                f"{json.dumps(self.first_error)[:LINE_CHARS]}"
            )
        shown = "\n".join(json.dumps(line)[:LINE_CHARS] for line in self.lines[-last:])
        parts.append(f"--- last {last} of {len(self.lines)} lines of {self.name}:\n{shown}")
        parts.append(f"--- stderr of {self.name}:\n{self.stderr_tail()}")
        return "\n".join(parts)

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
