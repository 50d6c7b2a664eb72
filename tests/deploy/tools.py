"""Finding the command-line tools the deploy tests run (helm, promtool).

`scripts/test.sh` builds them from the Go module proxy into a cache (scripts/tools.sh) and
exports HELM and PROMTOOL; then a missing tool is an error. Run without it (plain pytest), a
tool found on PATH or in that cache is used, and the tests that need it are skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CACHE = Path(
    os.environ.get("WATCHPROXY_TOOLS_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "watchproxy-tools"
)


def find_tool(name: str) -> str | None:
    configured = os.environ.get(name.upper())
    if configured:
        assert os.access(configured, os.X_OK), f"{name.upper()}={configured} is not executable"
        return configured
    cached = sorted(CACHE.glob(f"*/{name}"))
    return str(cached[-1]) if cached else shutil.which(name)


def require_tool(name: str) -> str:
    """The tool's path, or skip (fail when scripts/test.sh promised it)."""
    path = find_tool(name)
    if path is None:
        if os.environ.get(name.upper()):
            pytest.fail(f"{name} is missing though {name.upper()} is set")
        pytest.skip(f"{name} not found: scripts/test.sh builds it (scripts/tools.sh)")
    return path
