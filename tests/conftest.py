"""Shared fixtures: a fake apiserver per test, started and stopped around it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from watchproxy.fakeapi import FakeApiServer


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeApiServer]:
    """A running FakeApiServer (TLS, token "fake-token", bookmarks every 0.2 s)."""
    async with FakeApiServer(bookmark_interval=0.2) as server:
        yield server
