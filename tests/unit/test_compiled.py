"""Which build of the per-request modules the suite runs: compiled in the compiled tier, source
everywhere else.

``setup.py`` compiles its ``COMPILED_MODULES`` with mypyc when ``WATCHPROXY_COMPILE=1`` (the
container image). ``scripts/test.sh`` runs part of the suite a second time against such a build
(``tests.compiledtree``) with ``TEST_COMPILED=1``: there every one of them must be an extension
module, in the test process and in the processes it starts (a proxy started by a test must not
fall back to the editable install's source). Elsewhere every one must be its ``.py``: an
extension left in the source tree by an in-place build would shadow every later edit.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.compiledtree import MARKER, ROOT, compiled_modules

COMPILED = os.environ.get(MARKER) == "1"
MODULES = compiled_modules()


def _is_extension(filename: str) -> bool:
    return filename.endswith(".so")


def test_the_suite_compiles_with_the_mypy_the_image_builds_with() -> None:
    backend = (ROOT / "buildsupport" / "compiling_backend.py").read_text()
    pinned = re.search(r'MYPYC_REQUIREMENT = "([^"]+)"', backend)
    assert pinned is not None
    with open(ROOT / "pyproject.toml", "rb") as project:
        test_extra = tomllib.load(project)["project"]["optional-dependencies"]["test"]
    assert pinned.group(1) in test_extra


def test_the_list_names_the_per_request_path() -> None:
    assert {"watchproxy.server.routes", "watchproxy.policy.ratelimit"} <= set(MODULES)
    for module in MODULES:
        assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("module", MODULES)
def test_each_module_is_the_build_this_tier_runs(module: str) -> None:
    filename = importlib.import_module(module).__file__ or ""
    assert _is_extension(filename) is COMPILED, filename


def test_a_process_the_tests_start_imports_the_same_build(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", f"import {MODULES[0]} as m; print(m.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert _is_extension(child.stdout.strip()) is COMPILED, child.stdout
