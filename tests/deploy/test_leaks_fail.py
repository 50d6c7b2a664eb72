"""The suite's own guard: a test that leaks a socket, a transport or a coroutine fails.

Each case runs pytest in a subprocess on one deliberately leaky test, with this project's
pytest configuration and its uvloop fixture, and expects a failure that names the leak.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LEAKS = {
    "socket": """
        import socket

        def test_leaks_a_socket():
            socket.socket()
    """,
    "transport": """
        import asyncio

        async def test_leaks_a_uvloop_transport():
            server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            await asyncio.open_connection("127.0.0.1", port)  # never closed
            server.close()
    """,
    "coroutine": """
        import asyncio

        async def test_never_awaits_a_coroutine():
            asyncio.sleep(0)
    """,
}


@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_a_leak_fails_the_test_that_made_it(leak: str, tmp_path: Path) -> None:
    test_file = tmp_path / f"test_leak_{leak}.py"
    test_file.write_text(textwrap.dedent(LEAKS[leak]))
    # The project's conftest gives the uvloop loop and the per-test collection.
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            str(test_file),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 passed" not in output, output
    expected = {"socket": "ResourceWarning", "transport": "ResourceWarning"}.get(
        leak, "never awaited"
    )
    assert expected in output, output
