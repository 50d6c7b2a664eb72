"""Shared watches that die quietly, outages over many keys, and a resume at a relist's RV.

Issue 10 items 4, 5 (hub half) and 8, against the fake apiserver on loopback.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from tests.component.test_pitfalls import Stream, annotate, pod
from tests.harness import running_proxy, rv_of, wait_for

PODS = "/api/v1/namespaces/default/pods"
SCALE = 0.1  # the default back-off (0.8 s, x2, cap 30 s) and a 30 s outage, scaled down
BACKOFF = {
    "backoff.initial_seconds": 0.8 * SCALE,
    "backoff.max_seconds": 30 * SCALE,
    "backoff.jitter": "proportional",
}


async def test_a_silent_upstream_watch_is_resumed_from_its_last_rv(tmp_path: Any) -> None:
    overrides = {
        "hub.upstream_silence_seconds": 1.0,
        # Far beyond the test: only the silence timer can notice the dead watch.
        "upstream.watch_read_timeout_seconds": 600,
        "backoff.initial_seconds": 0.05,
    }
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as s:
        store, faults = running.fake.store, running.fake.faults
        store.create("pods", "default", pod("a"))
        stream = Stream(s, running.url + PODS + "?watch=1")
        await stream.wait(lambda st: st.seen("ADDED", "a"))
        # The connection stays up but carries nothing: no event, no bookmark.
        faults.hang_watches(True)
        faults.cut_watches()
        opens = running.fake.stats.watch_opens(PODS)
        await running.fake.stats.wait_until(lambda st: st.watch_opens(PODS) > opens)
        store.modify("pods", "default", "a", annotate("while-hung"))  # lost in the hung watch
        faults.hang_watches(False)
        started = time.monotonic()
        await stream.wait(lambda st: st.seen("MODIFIED", "a"), timeout=10)
        assert time.monotonic() - started < 5  # one silence period, not the read timeout
        hub = running.proxy.hub
        assert hub is not None
        [shared] = hub.watches.values()
        assert shared.machine.counters.silences >= 1
        rvs = [rv_of(e) for e in stream.changes()]
        assert rvs == sorted(set(rvs))
        await stream.close()


async def test_an_outage_over_many_keys_costs_few_attempts_and_recovers_at_once(
    tmp_path: Any,
) -> None:
    keys = [f"app%3Dk{i}" for i in range(6)]
    async with running_proxy(tmp_path, BACKOFF) as running, aiohttp.ClientSession() as s:
        store, faults, stats = running.fake.store, running.fake.faults, running.fake.stats
        for i in range(len(keys)):
            store.create("pods", "default", pod(f"p{i}", app=f"k{i}"))
        streams = [
            Stream(s, running.url + PODS + f"?watch=1&labelSelector={key}")
            for key in keys
            for _ in range(3)
        ]
        for n, stream in enumerate(streams):
            await stream.wait(lambda st, n=n: st.seen("ADDED", f"p{n // 3}"))
        stats.reset()
        await faults.outage("reset")
        await asyncio.sleep(30 * SCALE)
        attempts = stats.outage_connection_attempts
        proxy = running.proxy
        assert proxy.connectivity.down
        await faults.recover()
        await wait_for(lambda: proxy.connectivity.up, timeout=10, what="the prober to see it")
        back = time.monotonic()
        for i in range(len(keys)):
            store.modify("pods", "default", f"p{i}", annotate("after"))
        for n, stream in enumerate(streams):
            await stream.wait(lambda st, n=n: st.seen("MODIFIED", f"p{n // 3}"), timeout=10)
        recovered = time.monotonic() - back
        # One prober for the proxy, not one schedule per key: the same bound as for one key.
        assert attempts <= 8, attempts
        # Every key resumes within the jitter window once the prober has seen the upstream.
        assert recovered < 1.0 + 0.5, recovered
        for stream in streams:
            await stream.close()


async def test_a_client_resuming_at_a_relist_group_rv_gets_no_event_twice(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path, BACKOFF) as running, aiohttp.ClientSession() as s:
        store, faults = running.fake.store, running.fake.faults
        names = [f"p{i}" for i in range(10)]
        for name in names:
            store.create("pods", "default", pod(name))
        follower = Stream(s, running.url + PODS + "?watch=1")
        await follower.wait(lambda st: len(st.changes()) == 10)
        # Deletes while the hub cannot see them, then the history is compacted away: the
        # hub's resume gets 410, it relists, and the DELETEs it synthesises share one RV.
        await faults.outage("refuse")
        gone = names[1:9]
        for name in gone:
            store.delete("pods", "default", name)
        store.compact()
        await faults.recover()
        await follower.wait(lambda st: sum(e["type"] == "DELETED" for e in st.events) == 8)
        assert running.proxy.metrics.relists._value.get() >= 1
        deletes = [e for e in follower.events if e["type"] == "DELETED"]
        group_rv = rv_of(deletes[-1])
        assert {rv_of(e) for e in deletes} == {group_rv}
        # It re-watches at the RV it holds, as every informer does (a client-go Watch on a
        # timer, or after a bookmark at that RV): the group it has had must not come again.
        resumed = Stream(s, running.url + PODS + f"?watch=1&resourceVersion={group_rv}")
        store.create("pods", "default", pod("after"))
        await resumed.wait(lambda st: bool(st.events))
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in resumed.events] == [
            ("ADDED", "after")
        ]
        for stream in (follower, resumed):
            await stream.close()
