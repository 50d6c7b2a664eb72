"""The shared watch's one loop (SharedWatch._run): every way it ends leaves the machine stopped."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from watchproxy.config import HubConfig
from watchproxy.hub.sharedwatch import SharedWatch
from watchproxy.hub.transitions import TRANSITIONS, Phase
from watchproxy.hub.watchkey import WatchKey
from watchproxy.kube.representation import JsonRepresentation
from watchproxy.metrics import Metrics
from watchproxy.policy.backoff import BackoffPolicy


class UpHealth:
    down = False

    async def wait_up(self) -> None:
        return None

    def retry_after(self) -> float:
        return 1.0


class BuggySource:
    """A source with a bug: it raises what no upstream failure is (not a ProxyError)."""

    opens = 0

    async def open(self, path_qs: str, **_: Any) -> Any:
        self.opens += 1
        raise RuntimeError("a bug in the source")


class HangingSource:
    """A source whose LIST never answers: the loop is parked in an await when it is closed."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def open(self, path_qs: str, **_: Any) -> Any:
        self.opened.set()
        await asyncio.get_running_loop().create_future()


def shared_watch(source: Any) -> SharedWatch:
    key = WatchKey("/api/v1/namespaces/ns/pods", "v1/pods", "", "", "json", "", "")
    return SharedWatch(
        key,
        JsonRepresentation(),
        source=source,
        health=UpHealth(),
        hub_config=HubConfig(),
        backoff_policy=BackoffPolicy(),
        metrics=Metrics(),
        rng=random.Random(1),
    )


async def test_closing_a_watch_that_never_started_stops_its_machine() -> None:
    shared = shared_watch(None)
    await shared.close()
    assert shared.machine.phase is Phase.STOPPED and shared.closed
    taken = [TRANSITIONS[i].label for i, n in enumerate(shared.machine.counters.moves) if n]
    assert taken == ["idle --Stop--> stopped"]


async def test_closing_a_watch_parked_in_a_request_stops_its_machine() -> None:
    source = HangingSource()
    shared = shared_watch(source)
    shared.start()
    await asyncio.wait_for(source.opened.wait(), 5)
    assert shared.machine.phase is Phase.LISTING
    await asyncio.wait_for(shared.close(), 5)
    assert shared.machine.phase is Phase.STOPPED and not shared.machine.in_flight


async def test_a_bug_is_logged_and_ends_the_key(caplog: pytest.LogCaptureFixture) -> None:
    source = BuggySource()
    shared = shared_watch(source)
    ended = asyncio.Event()
    shared.on_idle = lambda _shared: ended.set()
    with caplog.at_level(logging.ERROR, logger="watchproxy.hub"):
        shared.start()
        await asyncio.wait_for(ended.wait(), 5)
    assert shared.machine.phase is Phase.STOPPED and source.opens == 1
    assert any("unexpected error" in r.getMessage() and r.exc_info for r in caplog.records)
    await shared.close()  # what the hub does on_idle: nothing left to stop
    assert shared.machine.phase is Phase.STOPPED
