"""A client program in a loop it cannot leave fails its test at once, in a few lines.

The client here is a stand-in for kube-rs without back-off after its HTTP stack died: it prints
the same ERROR line as fast as it can, forever.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.clients.process import BROKEN_AFTER_ERRORS, ClientProcess, bounded

FLOOD = (
    "import json, sys\n"
    "print(json.dumps({'type': 'InitDone'}), flush=True)\n"
    "while True:\n"
    "    print(json.dumps({'type': 'ERROR', 'message': \"buffer's worker closed unexpectedly\"}))\n"
)


async def test_a_client_stuck_in_an_error_loop_fails_fast_with_a_short_report(
    tmp_path: Path,
) -> None:
    client = ClientProcess(
        "flood", [sys.executable, "-c", FLOOD], env=dict(os.environ), log_path=tmp_path / "err"
    )
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
    assert "buffer's worker closed unexpectedly" in message
    assert len(message.splitlines()) < 40, message
    assert len(client.lines) <= BROKEN_AFTER_ERRORS + 1
    assert code == -signal.SIGTERM  # stopped by the test's client, not left running


def test_bounded_shows_a_few_items_and_how_many() -> None:
    text = bounded([f"problem {i}" for i in range(1000)], limit=5)
    assert text.splitlines() == [
        "1000 item(s):",
        *(f"problem {i}" for i in range(5)),
        "... and 995 more",
    ]
