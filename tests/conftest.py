"""Shared fixtures: a fake apiserver per test, started and stopped around it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import uvloop

from watchproxy.fakeapi import FakeApiServer


def pytest_asyncio_loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run every test on uvloop, the loop watchproxy runs on in production."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeApiServer]:
    """A running FakeApiServer (TLS, token "fake-token", bookmarks every 0.2 s)."""
    async with FakeApiServer(bookmark_interval=0.2) as server:
        yield server
