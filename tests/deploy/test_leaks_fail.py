"""The suite's own guard: a test that leaks a socket, a transport or a coroutine fails.

Each case runs pytest in a subprocess on one deliberately leaky test, with this project's
pytest configuration and its uvloop fixture, and expects a failure that names the leak.
"""

from __future__ import annotations

import re
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


# Leaks only the collector can find (a socket in a reference cycle), where the suite's
# collection sets aside what outlived the tests before (tests/conftest.py, ``collect_leaks``):
# the test that must fail (alone), and the test files.
CYCLE_LEAKS = {
    "in a test after others": (
        "test_then_leaks_a_socket_in_a_cycle",
        {
            "test_later.py": """
            import socket

            def test_first_makes_nothing():
                pass

            def test_then_leaks_a_socket_in_a_cycle():
                holder = []
                holder.append((holder, socket.socket()))
        """,
        },
    ),
    "by a module fixture, found by the next module's test": (
        "test_after_it",
        {
            "test_a_module.py": """
            import socket

            import pytest

            @pytest.fixture(scope="module")
            def held():
                holder = []
                holder.append((holder, socket.socket()))
                yield holder  # dropped unclosed at the module's teardown

            def test_uses_it(held):
                pass
        """,
            "test_b_module.py": """
            def test_after_it():
                pass
        """,
        },
    ),
}


def run_pytest(tmp_path: Path, files: dict[str, str]) -> tuple[int, str]:
    for name, source in files.items():
        (tmp_path / name).write_text(textwrap.dedent(source))
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
            *(str(tmp_path / name) for name in sorted(files)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_a_leak_fails_the_test_that_made_it(leak: str, tmp_path: Path) -> None:
    returncode, output = run_pytest(tmp_path, {f"test_leak_{leak}.py": LEAKS[leak]})
    assert returncode == 1, output
    assert "1 passed" not in output, output
    expected = {"socket": "ResourceWarning", "transport": "ResourceWarning"}.get(
        leak, "never awaited"
    )
    assert expected in output, output


@pytest.mark.parametrize("leak", sorted(CYCLE_LEAKS))
def test_a_leak_in_a_cycle_fails_a_test(leak: str, tmp_path: Path) -> None:
    failing, files = CYCLE_LEAKS[leak]
    returncode, output = run_pytest(tmp_path, files)
    assert returncode == 1, output
    assert "ResourceWarning" in output, output
    assert re.findall(r"^(?:FAILED|ERROR) \S+::(\w+)", output, re.MULTILINE) == [failing], output
