"""client-go v0.37 informers with their own defaults (WatchList on) through watchproxy's hub,
against the real apiserver.

Each informer (``tests/clients/go137``, a SharedInformerFactory's pod informer) opens one watch
with ``sendInitialEvents=true`` and waits for the bookmark annotated
``k8s.io/initial-events-end``; a proxy that drops, delays or mis-stamps it makes informers
hang. Several informers share one upstream watch; one more joins the shared watch while it
runs. The test's own direct watch is the apiserver's record (``ApiRecord``). Each informer's
store and handler calls must be that record: its initial list is the apiserver's state at the
bookmark's resourceVersion, and the changes after it follow once each, in order. On the wire
(the program taps its own watch bodies), the end bookmark comes within 1 s of the last initial
ADDED and its resourceVersion is no older than any initial object's, compared as the apiserver
compares them (``compare_rv``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

from tests.clients.build import build_informer137
from tests.clients.expect import ChangeLog, Segment, check_segments
from tests.clients.process import ClientProcess, Line
from tests.clients.streams import client_state
from tests.harness import RunningProxy, proxy_for_upstream, wait_for
from tests.realapi.fixture import RealApiServer, version_tuple
from tests.realapi.kubeapi import Api, compare_rv
from tests.realapi.test_real_clients import built, hub_cursors, opened, recorded_pods

pytestmark = pytest.mark.timeout(120, func_only=True)

OVERRIDES: dict[str, Any] = {"hub.bookmark_interval_seconds": 1.0}
HANDLER_TYPES = {"ADDED": "ADDED", "MODIFIED": "MODIFIED", "DELETED": "DELETED"}
BOOKMARK_WITHIN = 1.0  # seconds between the last initial ADDED and the end bookmark


def ready(lines: list[Line]) -> bool:
    return any(line["type"] == "READY" for line in lines)


async def start_informer(
    binary: Path, running: RunningProxy, namespace: str, tmp_path: Path, name: str
) -> ClientProcess:
    client = ClientProcess(
        name,
        [str(binary), f"--namespace={namespace}"],
        env={**os.environ, "KUBECONFIG": running.kubeconfig},
        log_path=tmp_path / f"{name}.stderr",
    )
    await client.start()
    return client


def handler_problems(lines: list[Line], log: ChangeLog) -> tuple[list[str], dict[str, int]]:
    """The informer's initial list must be a state of the record and its later handler calls
    the record's changes after it; returns the problems and the initial list."""
    segment = Segment({}, [], [])
    problems: list[str] = []
    for line in lines:
        kind = line["type"]
        if kind == "ADDED" and line.get("initial"):
            if line["name"] in segment.listed:
                segment.duplicates_in_list.append(line["name"])
            segment.listed[line["name"]] = int(line["resourceVersion"])
        elif kind in HANDLER_TYPES:
            segment.events.append((kind, line["name"], int(line["resourceVersion"])))
        elif kind in ("SYNC", "WATCH_ERROR"):
            problems.append(f"{kind}: {line}")
    return problems + check_segments([segment], log, HANDLER_TYPES), segment.listed


def wire_problems(
    lines: list[Line], log: ChangeLog, listed: dict[str, int], *, gzipped: bool
) -> list[str]:
    """The first watch was a watch-list whose end bookmark came in time, stamped with a
    resourceVersion at which the apiserver held exactly the informer's initial list; with
    ``gzipped``, its body came gzip-compressed (client-go asks for gzip, and kube-apiserver
    1.37 compresses a watch-list for it: the hub does the same)."""
    watches = [line for line in lines if line["type"] == "WATCH"]
    if not watches or "sendInitialEvents=true" not in watches[0]["query"]:
        return [f"the informer's first watch was not a watch-list: {watches[:1]}"]
    if gzipped and not watches[0].get("gzip"):
        return [f"the informer's watch-list came uncompressed: {watches[0]}"]
    wire = [line for line in lines if line["type"] == "WIRE"]
    ends = [i for i, line in enumerate(wire) if line.get("initialEventsEnd")]
    if not ends:
        return ["no k8s.io/initial-events-end bookmark reached the informer"]
    end = wire[ends[0]]
    initial = wire[: ends[0]]
    problems: list[str] = []
    if end["event"] != "BOOKMARK":
        problems.append(f"the end mark came on a {end['event']}")
    if any(line["event"] != "ADDED" for line in initial):
        problems.append(f"not only ADDED before the end bookmark: {initial}")
    if len(initial) != len(listed):
        problems.append(f"{len(initial)} initial events on the wire, {len(listed)} listed")
    if initial:
        late = (end["at"] - initial[-1]["at"]) / 1e9
        if late > BOOKMARK_WITHIN:
            problems.append(f"the end bookmark came {late:.3f} s after the last initial ADDED")
        newest = max(
            (line["resourceVersion"] for line in initial), key=functools.cmp_to_key(compare_rv)
        )
        if compare_rv(end["resourceVersion"], newest) < 0:
            problems.append(f"the end bookmark's RV {end['resourceVersion']} < {newest}")
    at_bookmark = log.state_at(int(end["resourceVersion"]))
    if at_bookmark != listed:
        problems.append(
            f"the apiserver's state at the bookmark's RV {end['resourceVersion']} is "
            f"{at_bookmark}, the informer listed {listed}"
        )
    return problems


async def test_watchlist_informers_share_one_upstream_watch_and_each_gets_the_record(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    binary = built(build_informer137)
    record, log, writer = await recorded_pods(direct, namespace)
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=real_apiserver.token
    )
    informers: dict[str, ClientProcess] = {}
    try:
        async with (
            record.recording() as recorded_up_to,
            proxy_for_upstream(tmp_path, upstream, OVERRIDES) as running,
        ):
            for _ in range(8):
                await writer.step()  # the initial events: 16 pods made, some deleted
            first = await start_informer(binary, running, namespace, tmp_path, "informer-0")
            informers[first.name] = first
            await first.wait_until(ready, what="its initial list", timeout=30)
            opens = opened(running)
            for index in (1, 2):
                name = f"informer-{index}"
                informers[name] = await start_informer(binary, running, namespace, tmp_path, name)
            for client in informers.values():
                await client.wait_until(ready, what="its initial list", timeout=30)
            # Three informers, one shared watch, and nothing more opened upstream for two of
            # them.
            hub = running.proxy.hub
            assert hub is not None
            assert len(hub.watches) == 1, list(hub.watches)
            assert opened(running) == opens
            for _ in range(6):
                await writer.step()
            # One more joins the running shared watch.
            joiner = await start_informer(binary, running, namespace, tmp_path, "informer-late")
            informers[joiner.name] = joiner
            await joiner.wait_until(ready, what="its initial list", timeout=30)
            await wait_for(lambda: hub_cursors(running) >= 4, what="four hub-served watches")
            assert opened(running) == opens
            for _ in range(4):
                await writer.step()
            await recorded_up_to(writer.last_rv)
            final = log.state_at(writer.last_rv)
            for client in informers.values():
                await client.wait_until(
                    lambda ls: client_state(_handler_lines(ls)) == final,
                    what="the apiserver's final state",
                    timeout=30,
                )
    finally:
        for client in informers.values():
            await client.stop()
        log.close()
    report = []
    for client in informers.values():
        problems, listed = handler_problems(client.lines, log)
        gzipped = version_tuple(real_apiserver.version) >= (1, 37)
        problems += wire_problems(client.lines, log, listed, gzipped=gzipped)
        if problems:
            report.append(client.report(problems))
    assert not report, "\n".join(report)


def _handler_lines(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line["type"] in ("ADDED", "MODIFIED", "DELETED")]
