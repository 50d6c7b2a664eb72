"""Fixtures for the end-to-end tier: real client programs, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.clients.build import ToolchainMissing, build_watchclient


@pytest.fixture(scope="session")
def watchclient() -> Path:
    """The client-go ``watchclient`` binary, built (or found up to date) once per session.

    Without Go the tests are skipped with the reason, except on CI (``CI=true``), where a
    missing toolchain must fail rather than pass quietly.
    """
    try:
        return build_watchclient()
    except ToolchainMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc} (CI=true: a missing toolchain is a failure here)")
        pytest.skip(str(exc))
