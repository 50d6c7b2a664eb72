"""A client program in a loop it cannot leave fails its test at once, in a few lines.

The clients here are stand-ins for kube-rs without back-off after its HTTP stack died: they
print the same ERROR line as fast as they can, forever, and do not leave for SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.clients.process import BROKEN_AFTER_ERRORS, ClientProcess, bounded


def flood(*, first: str, message: str) -> list[str]:
    """A program that prints ``first`` and then ``message`` as an ERROR line forever, and
    ignores SIGTERM."""
    script = (
        "import json, signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"print(json.dumps({{'type': {first!r}}}), flush=True)\n"
        "while True:\n"
        f"    print(json.dumps({{'type': 'ERROR', 'message': {message!r}}}))\n"
    )
    return [sys.executable, "-c", script]


async def test_a_client_stuck_in_an_error_loop_fails_fast_with_a_short_report(
    tmp_path: Path,
) -> None:
    argv = flood(first="InitDone", message="connection refused")
    client = ClientProcess("flood", argv, env=dict(os.environ), log_path=tmp_path / "err")
    await client.start()
    started = time.monotonic()
    try:
        with pytest.raises(AssertionError) as failed:
            await client.wait_until(lambda lines: False, timeout=60, what="RV 1000")
    finally:
        code = await client.stop()
    assert time.monotonic() - started < 30  # not the 60 s timeout: it gave up at once
    message = str(failed.value)
    assert f"{BROKEN_AFTER_ERRORS} error lines in a row" in message
    assert "connection refused" in message
    assert len(message.splitlines()) < 40, message
    assert len(client.lines) <= BROKEN_AFTER_ERRORS + 1
    assert code == -signal.SIGKILL  # killed once known broken: it ignores SIGTERM


@pytest.mark.parametrize(
    ("first", "message", "why"),
    [
        # kube-rs's client once its Buffer worker is gone: no request can succeed again.
        ("InitDone", "buffer's worker closed unexpectedly", "a fatal error"),
        # A program that said it was exiting and did not.
        ("EXIT", "connection closed before message completed", "after its EXIT line"),
    ],
)
async def test_a_client_known_broken_by_one_line_is_stopped_at_that_line(
    tmp_path: Path, first: str, message: str, why: str
) -> None:
    client = ClientProcess(
        "flood", flood(first=first, message=message), env=dict(os.environ), log_path=tmp_path / "e"
    )
    await client.start()
    try:
        with pytest.raises(AssertionError) as failed:
            await client.wait_until(lambda lines: False, timeout=60, what="RV 1000")
    finally:
        code = await client.stop()
    assert why in str(failed.value), failed.value
    assert message in str(failed.value)
    assert len(client.lines) == 2, client.report()  # its first line and the one that said so
    assert code == -signal.SIGKILL


def test_bounded_shows_a_few_items_and_how_many() -> None:
    text = bounded([f"problem {i}" for i in range(1000)], limit=5)
    assert text.splitlines() == [
        "1000 item(s):",
        *(f"problem {i}" for i in range(5)),
        "... and 995 more",
    ]
