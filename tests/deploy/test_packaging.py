"""The wheel as pip would build it: the product only, with complete metadata."""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from watchproxy import __version__

ROOT = Path(__file__).resolve().parents[2]
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the test extra brings setuptools, so this needs no network.
    subprocess.run(
        [*PIP_WHEEL, "--wheel-dir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (path,) = out.glob("watchproxy-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def test_the_wheel_holds_watchproxy_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    assert top == {"watchproxy", f"watchproxy-{__version__}.dist-info"}, top
    assert "watchproxy/py.typed" in wheel.namelist()


def test_the_wheel_metadata_is_complete(wheel: zipfile.ZipFile) -> None:
    meta = email.message_from_bytes(wheel.read(f"watchproxy-{__version__}.dist-info/METADATA"))
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert f"watchproxy-{__version__}.dist-info/licenses/LICENSE" in wheel.namelist()
    assert meta["Author-email"]
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    # PEP 639: with a license expression, no License :: classifier may be given.
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert meta["Requires-Python"] == ">=3.11"


def test_the_wheel_installs_the_watchproxy_command_only(wheel: zipfile.ZipFile) -> None:
    entry_points = wheel.read(f"watchproxy-{__version__}.dist-info/entry_points.txt").decode()
    assert entry_points.split() == ["[console_scripts]", "watchproxy", "=", "watchproxy.cli:main"]
