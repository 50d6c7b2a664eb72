"""Shared fixtures (a fake apiserver per test, started and stopped around it) and tier markers.

Tiers are folders: ``unit`` (pure, milliseconds), ``component`` (one real proxy and fake on
loopback), ``e2e`` (real clients: kubectl, the Python clients, Go/Rust/Node programs),
``fakeapi`` (the fake apiserver itself), ``deploy`` (manifests, image, packaging), ``realapi``
(watchproxy against a real kube-apiserver built from Go modules). Each folder's
tests carry the marker of the same name, so ``pytest -m unit`` runs one tier.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import uvloop

from kubefake import FakeApiServer

TIERS = ("unit", "component", "e2e", "fakeapi", "deploy", "realapi", "realnode")
# A failed comparison of longer sequences is explained in this many items a side: with CI=true
# pytest truncates no explanation, and its diff of two lists prints every item (a client's
# 200,000 lines were a 200,000-line failure).
SHOWN_ITEMS = 20
SHOWN_CHARS = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    # Tests marked ``long(seconds)`` go first, the longest first: pytest-xdist hands the first
    # quarter of the collection out round-robin, so each starts at once on a worker of its own
    # while the short tests fill the others. In file order they could start late and run on
    # after the rest had finished (the conformance test alone is about three minutes).
    items.sort(key=lambda item: -_long_seconds(item))


def _long_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("long")
    return 0.0 if marker is None else float(marker.args[0])


def pytest_assertrepr_compare(op: str, left: Any, right: Any) -> list[str] | None:
    """A bounded explanation of ``left == right`` for long sequences (None: pytest's own)."""
    if op != "==" or not all(_is_long_sequence(side) for side in (left, right)):
        return None
    if len(left) + len(right) <= 2 * SHOWN_ITEMS:
        return None
    first = next(
        (i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b),
        min(len(left), len(right)),
    )
    lines = [
        f"sequences of {len(left)} and {len(right)} items differ; first at index {first}:",
    ]
    for name, side in (("left", left), ("right", right)):
        lines.append(f"{name}[{first}:{first + SHOWN_ITEMS}]:")
        lines += [f"  {item!r}"[:SHOWN_CHARS] for item in side[first : first + SHOWN_ITEMS]]
    return lines


def _is_long_sequence(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray)


def pytest_asyncio_loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run every test on uvloop, the loop watchproxy runs on in production."""
    return {"uvloop": uvloop.new_event_loop}


# The test file of the test before, on this worker (``collect_leaks``).
_module_of_last_test: Path | None = None


@pytest.fixture(autouse=True)
def collect_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Finalize what the test left unreferenced while it is still the current test: an unclosed
    socket or transport then fails it (ResourceWarning is an error, see pyproject.toml).

    What outlives a test's collection is set aside (``gc.freeze``), so that the next test's
    collection walks only what that test made. Walking everything took 20-500 ms a test: a
    worker tracks 110,000 objects once collection is done, 150,000-230,000 once tests have
    imported the Python clients' API models. In the unit tier alone that was 97 of its 154 s of
    test time; in the whole suite the collections now take 37 s of its test time, and the suite
    354 s instead of 512 s on three workers. A module's fixtures are torn down after its last
    test's collection, so the first test of another module walks everything once more: what
    those fixtures left unclosed fails that test, as before.
    """
    global _module_of_last_test
    if request.path != _module_of_last_test:
        gc.unfreeze()
        _module_of_last_test = request.path
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeApiServer]:
    """A running FakeApiServer (TLS, token "fake-token", bookmarks every 0.2 s)."""
    async with FakeApiServer(bookmark_interval=0.2) as server:
        yield server
