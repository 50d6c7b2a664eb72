"""*When* a client-go v0.37 informer with its defaults gets its events, direct and through
watchproxy, side by side, against the real apiserver.

The informer (``tests/clients/go137``: a SharedInformerFactory's pod informer) opens a watch-list
(``sendInitialEvents=true``) and asks for gzip, which kube-apiserver 1.37 and the hub answer with
one gzip member per flush; Go's transport decodes it with Go's own gzip reader. That reader hands
over a member's last deflate block only once it has read the next member's header (see
watchproxy/kube/contentcoding.py), so a member whose events sit in its last block reaches the
informer only with the next change: on a collection nobody writes to, the initial-events-end
bookmark waits for the next write or periodic bookmark (a minute by default) and the informer
does not sync. Readers that decode partial blocks (Python's zlib, curl) never show it, hence this
test with Go's reader, on a quiet collection and on a busy one, hub-served and passed through.

Each round starts one informer direct and one through watchproxy at the same moment. A sync time
is from the informer's start to the moment its end bookmark came out of Go's gzip reader (the
program's WIRE line for it); a delivery time is from the write's answer to the event coming out
of the reader. The bounds are loose enough for a loaded two-core machine and far below what a
stalled stream takes (until the next write, or the 60 s periodic bookmark).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clients.build import build_informer137
from tests.clients.process import ClientProcess, Line
from tests.harness import proxy_for_upstream
from tests.realapi.fixture import RealApiServer, version_tuple
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_clients import built, pod

pytestmark = pytest.mark.timeout(180, func_only=True)

SYNC_WITHIN = 1.0  # s from an informer's start to its end bookmark, on a quiet collection
SLOWER_BY_AT_MOST = 0.25  # s: how much later than direct watchproxy may sync or deliver
DELIVERED_WITHIN = 1.0  # s from a write's answer to its event, for the last write of a burst
BUSY_SECONDS = 3.0  # how long the busy collection is written to
BUSY_INTERVAL = 0.02  # s between writes: about 50 a second, as fast as one writer goes


@dataclass
class Synced:
    """One informer's run: when it started (unix ns) and the lines it wrote."""

    name: str
    client: ClientProcess
    started_ns: int

    def wire(self) -> list[Line]:
        return [line for line in self.client.lines if line["type"] == "WIRE"]

    def end_bookmark(self) -> Line | None:
        return next((line for line in self.wire() if line.get("initialEventsEnd")), None)

    def sync_seconds(self) -> float:
        end = self.end_bookmark()
        assert end is not None, self.client.report(["no end bookmark"])
        return (int(end["at"]) - self.started_ns) / 1e9

    def arrivals(self) -> dict[str, int]:
        """Unix ns at which each watch event after the end bookmark came out, by RV."""
        out: dict[str, int] = {}
        after = False
        for line in self.wire():
            if line.get("initialEventsEnd"):
                after = True
            elif after and line["event"] in ("ADDED", "MODIFIED", "DELETED"):
                out.setdefault(line["resourceVersion"], int(line["at"]))
        return out

    def gzipped(self) -> bool:
        watches = [line for line in self.client.lines if line["type"] == "WATCH"]
        return bool(watches) and bool(watches[0].get("gzip"))


def has_end_bookmark(lines: list[Line]) -> bool:
    return any(line["type"] == "WIRE" and line.get("initialEventsEnd") for line in lines)


@contextlib.asynccontextmanager
async def side_by_side(
    binary: Path, kubeconfigs: dict[str, str], namespace: str, tmp_path: Path, label: str
) -> AsyncIterator[dict[str, Synced]]:
    """One informer per kubeconfig, all started at once; stopped on the way out."""
    runs: dict[str, Synced] = {}
    try:
        for name, kubeconfig in kubeconfigs.items():
            client = ClientProcess(
                f"{label}-{name}",
                [str(binary), f"--namespace={namespace}"],
                env={**os.environ, "KUBECONFIG": kubeconfig},
                log_path=tmp_path / f"{label}-{name}.stderr",
            )
            runs[name] = Synced(name, client, time.time_ns())
            await client.start()
        yield runs
    finally:
        for run in runs.values():
            await run.client.stop()


async def synced(runs: dict[str, Synced], *, timeout: float) -> dict[str, float]:
    """Each informer's sync time, once every one has its end bookmark; an informer that has
    none after ``timeout`` s (a stalled stream) fails the test with its lines."""
    await asyncio.gather(
        *(
            run.client.wait_until(has_end_bookmark, what="its end bookmark", timeout=timeout)
            for run in runs.values()
        )
    )
    for run in runs.values():
        assert run.gzipped(), run.client.report(["its watch-list came uncompressed"])
    return {name: run.sync_seconds() for name, run in runs.items()}


async def delivered(runs: dict[str, Synced], rv: str, written_ns: int) -> dict[str, float]:
    """Seconds from ``written_ns`` until the event at ``rv`` came out of each informer's reader
    (at most DELIVERED_WITHIN + 5 s of waiting: a stalled stream fails with the lines)."""
    await asyncio.gather(
        *(
            run.client.wait_until(
                lambda lines: any(
                    line["type"] == "WIRE" and line.get("resourceVersion") == rv for line in lines
                ),
                what=f"the event at resourceVersion {rv}",
                timeout=DELIVERED_WITHIN + 5,
            )
            for run in runs.values()
        )
    )
    return {name: (run.arrivals()[rv] - written_ns) / 1e9 for name, run in runs.items()}


def kubeconfigs(
    real_apiserver: RealApiServer, proxy_kubeconfig: str, tmp_path: Path
) -> dict[str, str]:
    direct = real_apiserver.write_kubeconfig(
        tmp_path / "direct.kubeconfig", token=real_apiserver.token
    )
    return {"direct": direct, "watchproxy": proxy_kubeconfig}


def report(what: str, times: dict[str, float]) -> str:
    return f"{what}: " + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in times.items())


@pytest.mark.parametrize("hub", [True, False], ids=["hub", "passthrough"])
async def test_an_informer_syncs_on_a_quiet_collection_as_fast_as_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, hub: bool
) -> None:
    if version_tuple(real_apiserver.version) < (1, 37):
        pytest.skip(f"kube-apiserver {real_apiserver.version} does not compress watch-lists")
    binary = built(build_informer137)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("quiet-1", "quiet-2"):
        await direct.ok("POST", pods, body=pod(name, "web"))
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=real_apiserver.token
    )
    measured: list[str] = []
    async with proxy_for_upstream(tmp_path, upstream, {"hub.enabled": hub}) as running:
        configs = kubeconfigs(real_apiserver, running.kubeconfig, tmp_path)
        # Cold: the hub's shared watch is made for this informer. Warm: it joins that watch
        # (the first pair is stopped first: the hub keeps the watch for its linger).
        for label in ("cold", "warm"):
            async with side_by_side(binary, configs, namespace, tmp_path, label) as runs:
                # A stalled stream would wait for the periodic bookmark (60 s): 10 s is ample
                # for a loaded machine and fails it clearly.
                sync = await synced(runs, timeout=10)
                measured.append(report(f"{label} sync", sync))
                # Nobody has written since: the informers' watches are quiet. One write now
                # must reach both at once, not with the next one.
                answer = await direct.ok("POST", pods, body=pod(f"after-{label}", "web"))
                written = time.time_ns()
                late = await delivered(runs, answer["metadata"]["resourceVersion"], written)
                measured.append(report(f"{label} one write on the quiet watch", late))
            problems = []
            if sync["watchproxy"] > SYNC_WITHIN:
                problems.append(f"synced {sync['watchproxy']:.3f} s after its start")
            if sync["watchproxy"] > sync["direct"] + SLOWER_BY_AT_MOST:
                problems.append("synced later than direct by more than the bound")
            if late["watchproxy"] > DELIVERED_WITHIN:
                problems.append(f"got the write {late['watchproxy']:.3f} s after it")
            if late["watchproxy"] > late["direct"] + SLOWER_BY_AT_MOST:
                problems.append("got the write later than direct by more than the bound")
            assert not problems, f"{label}: {problems}\n" + "\n".join(measured)
    print("\n" + "\n".join(measured))


@pytest.mark.parametrize("hub", [True, False], ids=["hub", "passthrough"])
async def test_an_informer_on_a_busy_collection_gets_every_write_as_fast_as_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, hub: bool
) -> None:
    if version_tuple(real_apiserver.version) < (1, 37):
        pytest.skip(f"kube-apiserver {real_apiserver.version} does not compress watch-lists")
    binary = built(build_informer137)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=real_apiserver.token
    )
    written: dict[str, int] = {}  # rv -> unix ns of the write's answer

    async def write_for(seconds: float, prefix: str) -> None:
        deadline = time.monotonic() + seconds
        count = 0
        while time.monotonic() < deadline:
            count += 1
            answer = await direct.ok("POST", pods, body=pod(f"{prefix}-{count}", "web"))
            written[answer["metadata"]["resourceVersion"]] = time.time_ns()
            await asyncio.sleep(BUSY_INTERVAL)

    async with proxy_for_upstream(tmp_path, upstream, {"hub.enabled": hub}) as running:
        configs = kubeconfigs(real_apiserver, running.kubeconfig, tmp_path)
        await write_for(0.5, "before")  # the collection is moving when the informers start
        writing = asyncio.get_running_loop().create_task(write_for(BUSY_SECONDS, "busy"))
        try:
            async with side_by_side(binary, configs, namespace, tmp_path, "busy") as runs:
                sync = await synced(runs, timeout=10)
                await writing
                # The last write of the burst is followed by none: a stalled stream holds it.
                last = max(written, key=int)
                tail = await delivered(runs, last, written[last])
                arrivals = {name: run.arrivals() for name, run in runs.items()}
        finally:
            if not writing.done():
                writing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writing
    both = [rv for rv in written if all(rv in got for got in arrivals.values())]
    assert len(both) >= 10, (len(both), len(written))
    delays = {
        name: sorted((got[rv] - written[rv]) / 1e9 for rv in both) for name, got in arrivals.items()
    }
    measured = [
        report("busy sync", sync),
        report("last write of the burst", tail),
        *(
            f"{name}: {len(both)} writes, delay p50 {statistics.median(d):.3f} s, "
            f"p99 {d[int(0.99 * (len(d) - 1))]:.3f} s, max {d[-1]:.3f} s"
            for name, d in delays.items()
        ),
    ]
    problems = []
    if sync["watchproxy"] > sync["direct"] + SLOWER_BY_AT_MOST:
        problems.append("synced later than direct by more than the bound")
    if tail["watchproxy"] > DELIVERED_WITHIN:
        problems.append(f"got the last write {tail['watchproxy']:.3f} s after it")
    if statistics.median(delays["watchproxy"]) > statistics.median(delays["direct"]) + 0.1:
        problems.append("its median delay exceeds direct's by more than 100 ms")
    assert not problems, f"{problems}\n" + "\n".join(measured)
    print("\n" + "\n".join(measured))
