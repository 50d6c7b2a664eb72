"""Shared fixtures (a fake apiserver per test, started and stopped around it) and tier markers.

Tiers are folders: ``unit`` (pure, milliseconds), ``component`` (one real proxy and fake on
loopback), ``e2e`` (real clients: kubectl, the Python clients, Go/Rust/Node programs),
``fakeapi`` (the fake apiserver itself), ``deploy`` (manifests, image, packaging), ``realapi``
(watchproxy against a real kube-apiserver built from Go modules). Each folder's
tests carry the marker of the same name, so ``pytest -m unit`` runs one tier.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import uvloop

from kubefake import FakeApiServer

TIERS = ("unit", "component", "e2e", "fakeapi", "deploy", "realapi")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def pytest_asyncio_loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run every test on uvloop, the loop watchproxy runs on in production."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeApiServer]:
    """A running FakeApiServer (TLS, token "fake-token", bookmarks every 0.2 s)."""
    async with FakeApiServer(bookmark_interval=0.2) as server:
        yield server
