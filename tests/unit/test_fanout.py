"""The key's fan-out: one write per batch per sink, backpressure, and the hand-back to a cursor.

The sink is a fake of the port (``WatchSink``); the fan-out and the cache are the real ones.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Sequence
from typing import Any

import pytest

from watchproxy.hub.fanout import Fanout, FanoutPacing, LiveCursor
from watchproxy.hub.watchcache import WatchCache
from watchproxy.kube.contentcoding import gzip_member
from watchproxy.kube.representation import JsonRepresentation
from watchproxy.metrics import Metrics


def pod(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


class Sink:
    """Records what was sent; ``room`` is how many more writes fit under the high-water mark."""

    coding = "identity"

    def __init__(self, room: int = 1_000_000) -> None:
        self.sent: list[bytes] = []
        self.room = room

    def frame(self, data: bytes) -> bytes:
        return data

    def send_lines(self, lines: Sequence[bytes], size: int) -> bool:
        return self.send_framed(self.frame(b"".join(lines)))

    def send_framed(self, framed: bytes) -> bool:
        self.sent.append(framed)
        self.room -= 1
        return self.room > 0


def make() -> tuple[WatchCache, Fanout, Metrics]:
    cache = WatchCache(JsonRepresentation(), capacity=1000, max_age=1e9, clock=lambda: 0.0)
    cache.replace([pod("a", 1)], "1")
    metrics = Metrics()
    return cache, Fanout(cache, metrics, "pods", lambda: False), metrics


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_events_of_one_iteration_reach_each_sink_as_one_write() -> None:
    cache, fanout, metrics = make()
    sinks = [Sink() for _ in range(5)]
    lives = [LiveCursor(s, cache.next_seq, -1, -1) for s in sinks]  # type: ignore[arg-type]
    waits = [asyncio.create_task(fanout.wait(live, 5.0)) for live in lives]
    await settle()
    lines = []
    for rv in range(2, 12):
        event = cache.apply("MODIFIED", pod("a", rv))
        assert event is not None
        lines.append(event.line)
        fanout.schedule()
    await settle()
    for sink in sinks:
        assert sink.sent == [b"".join(lines)]
    assert len(fanout) == 5 and not any(w.done() for w in waits)
    sent = metrics.events_sent.labels("pods")._value.get()
    assert sent == 10 * 5
    for task in waits:
        task.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    assert len(fanout) == 0


class GzipSink(Sink):
    """Frames as the gzip response sink does (one member per write), counting its framings."""

    coding = "gzip"
    framings = 0

    def frame(self, data: bytes) -> bytes:
        GzipSink.framings += 1
        return gzip_member(data)


async def test_gzip_clients_at_one_point_share_one_member_per_batch() -> None:
    cache, fanout, _ = make()
    GzipSink.framings = 0
    plain = [Sink() for _ in range(3)]
    gzipped = [GzipSink() for _ in range(30)]
    # Different start RVs (clients that joined at different moments) are different groups,
    # but they read the same events: one member serves them all.
    lives = [LiveCursor(s, cache.next_seq, -1, -1) for s in plain]  # type: ignore[arg-type]
    lives += [
        LiveCursor(s, cache.next_seq, i % 3 - 1, -1)  # type: ignore[arg-type]
        for i, s in enumerate(gzipped)
    ]
    waits = [asyncio.create_task(fanout.wait(live, 5.0)) for live in lives]
    await settle()
    batches = []
    for batch in range(3):
        lines = []
        for rv in range(10 * batch + 2, 10 * batch + 7):
            event = cache.apply("MODIFIED", pod("a", rv))
            assert event is not None
            lines.append(event.line)
            fanout.schedule()
        await settle()
        batches.append(b"".join(lines))
    assert GzipSink.framings == 3  # one per batch, not one per client or per group
    for sink in plain:
        assert sink.sent == batches
    members = gzipped[0].sent
    assert [zlib.decompress(m, 31) for m in members] == batches
    for sink in gzipped:
        assert all(a is b for a, b in zip(sink.sent, members, strict=True))  # the same bytes
    for task in waits:
        task.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


def test_a_catch_up_write_shares_the_framing_of_the_same_events() -> None:
    cache, fanout, _ = make()
    GzipSink.framings = 0
    for rv in range(2, 6):
        cache.apply("MODIFIED", pod("a", rv))
    events = cache.events_from(cache.next_seq - 4)
    assert events is not None
    # Two subscribers catching up from the same cursor, with min RVs both below the events.
    first = fanout.framed(events, -1, GzipSink())  # type: ignore[arg-type]
    second = fanout.framed(events, 1, GzipSink())  # type: ignore[arg-type]
    assert first is second and GzipSink.framings == 1
    assert zlib.decompress(first[0], 31) == b"".join(e.line for e in events)
    assert first[1:] == (4, len(b"".join(e.line for e in events)))
    # Another coding or other events: framed on their own.
    assert fanout.framed(events, -1, Sink())[0] == b"".join(e.line for e in events)  # type: ignore[arg-type]
    later = fanout.framed(events, 3, GzipSink())  # type: ignore[arg-type]
    assert zlib.decompress(later[0], 31) == b"".join(e.line for e in events if e.rv > 3)
    assert GzipSink.framings == 2


async def test_a_full_sink_is_kicked_and_resumes_from_its_cursor_without_loss() -> None:
    cache, fanout, _ = make()
    slow, fast = Sink(room=2), Sink()
    slow_live = LiveCursor(slow, cache.next_seq, -1, -1)  # type: ignore[arg-type]
    fast_live = LiveCursor(fast, cache.next_seq, -1, -1)  # type: ignore[arg-type]
    fast_wait = asyncio.create_task(fanout.wait(fast_live, 5.0))
    slow_wait = asyncio.create_task(fanout.wait(slow_live, 5.0))
    await settle()
    expected = []
    for rv in range(2, 8):
        event = cache.apply("MODIFIED", pod("a", rv))
        assert event is not None
        expected.append(event.line)
        fanout.schedule()
        await settle()
    # Over its high-water mark after the 2nd write: kicked, and nothing more written to it.
    assert slow_wait.done() and slow_live.paused
    assert len(slow.sent) == 2
    assert b"".join(fast.sent) == b"".join(expected)
    # Its task reads the rest from the shared history at its own cursor, then parks again.
    rest = cache.events_from(slow_live.cursor)
    assert rest is not None
    slow.sent.append(b"".join(e.line for e in rest))
    slow_live.cursor = rest[-1].seq + 1
    slow.room = 100
    slow_wait = asyncio.create_task(fanout.wait(slow_live, 5.0))
    await settle()
    event = cache.apply("MODIFIED", pod("a", 99))
    assert event is not None
    expected.append(event.line)
    fanout.schedule()
    await settle()
    assert b"".join(slow.sent) == b"".join(expected)
    assert b"".join(fast.sent) == b"".join(expected)
    for task in (fast_wait, slow_wait):
        task.cancel()
    await asyncio.gather(fast_wait, slow_wait, return_exceptions=True)


async def test_a_closed_key_wakes_every_parked_cursor() -> None:
    cache, _, metrics = make()
    closed = False
    fanout = Fanout(cache, metrics, "pods", lambda: closed)
    live = LiveCursor(Sink(), cache.next_seq, -1, -1)  # type: ignore[arg-type]
    wait = asyncio.create_task(fanout.wait(live, 5.0))
    await settle()
    closed = True
    fanout.schedule()
    await asyncio.wait_for(wait, 1.0)
    assert len(fanout) == 0


def test_pacing_holds_a_busy_fanout_to_its_cpu_share_and_no_longer_than_the_max_delay() -> None:
    assert FanoutPacing().pause_after(1.0) == 0.0  # unpaced: every pass at once
    assert FanoutPacing(max_delay=0.0, cpu_share=0.1).pause_after(1.0) == 0.0
    pacing = FanoutPacing(max_delay=0.025, cpu_share=0.1)
    # A pass of d seconds, then a pause of 9 d: the fan-out gets at most a tenth of the loop.
    assert pacing.pause_after(0.001) == pytest.approx(0.009)
    assert pacing.pause_after(0.0) == 0.0
    assert pacing.pause_after(0.01) == 0.025  # capped: no event waits longer than max_delay
    assert FanoutPacing(max_delay=0.025, cpu_share=1.0).pause_after(0.01) == 0.0


class SlowSink(Sink):
    """A sink whose every write uses ``cost`` seconds of CPU, like 500 real writes do;
    ``arrived`` is set at each write."""

    def __init__(self, cost: float) -> None:
        super().__init__()
        self.cost = cost
        self.arrived = asyncio.Event()

    def send_framed(self, framed: bytes) -> bool:
        spent = time.thread_time() + self.cost  # CPU, as the pass is timed: not a sleep
        while time.thread_time() < spent:
            pass
        self.arrived.set()
        return super().send_framed(framed)


async def test_events_after_a_costly_pass_wait_for_the_pause_and_go_out_in_one_write() -> None:
    cache = WatchCache(JsonRepresentation(), capacity=1000, max_age=1e9, clock=lambda: 0.0)
    cache.replace([pod("a", 1)], "1")
    metrics = Metrics()
    pacing = FanoutPacing(max_delay=0.5, cpu_share=0.05)
    fanout = Fanout(cache, metrics, "pods", lambda: False, pacing)
    sink = SlowSink(cost=0.01)  # a pass of >= 10 ms, so a pause of >= 190 ms (share 1/20)
    wait = asyncio.create_task(fanout.wait(LiveCursor(sink, cache.next_seq, -1, -1), 30.0))  # type: ignore[arg-type]
    await settle()
    first = cache.apply("MODIFIED", pod("a", 2))
    assert first is not None
    fanout.schedule()
    await asyncio.wait_for(sink.arrived.wait(), 5.0)  # the first pass is not held
    assert sink.sent == [first.line]
    sink.arrived.clear()
    later = [cache.apply("MODIFIED", pod("a", rv)) for rv in (3, 4)]
    fanout.schedule()
    await asyncio.sleep(0)
    later.append(cache.apply("MODIFIED", pod("a", 5)))
    fanout.schedule()
    held_since = time.monotonic()
    await settle()
    assert sink.sent == [first.line]  # held: the pass ran within the pause
    await asyncio.wait_for(sink.arrived.wait(), 5.0)
    held = time.monotonic() - held_since
    assert sink.sent == [first.line, b"".join(e.line for e in later if e is not None)]
    assert 0.1 < held < 0.5 + 0.25  # about 19 x the 10 ms pass, never past max_delay
    delays = metrics.fanout_delay.labels("pods")
    assert delays._sum.get() > 0.1  # the held pass was observed with its delay
    wait.cancel()
    await asyncio.gather(wait, return_exceptions=True)


async def test_a_key_closed_during_the_pause_wakes_its_cursors_at_once() -> None:
    cache = WatchCache(JsonRepresentation(), capacity=1000, max_age=1e9, clock=lambda: 0.0)
    cache.replace([pod("a", 1)], "1")
    closed = False
    pacing = FanoutPacing(max_delay=60.0, cpu_share=0.0001)
    fanout = Fanout(cache, Metrics(), "pods", lambda: closed, pacing)
    sink = SlowSink(cost=0.005)
    live = LiveCursor(sink, cache.next_seq, -1, -1)  # type: ignore[arg-type]
    wait = asyncio.create_task(fanout.wait(live, 120.0))
    await settle()
    cache.apply("MODIFIED", pod("a", 2))
    fanout.schedule()
    await asyncio.wait_for(sink.arrived.wait(), 5.0)
    cache.apply("MODIFIED", pod("a", 3))
    fanout.schedule()  # held for up to a minute...
    await settle()
    assert not wait.done() and len(sink.sent) == 1
    closed = True
    fanout.schedule()  # ...but the end is not
    await asyncio.wait_for(wait, 1.0)
    # The held event was not written by the closing pass: the task resumes at its cursor and
    # ends the stream itself, so it reads the rest from the history.
    assert len(sink.sent) == 1 and live.cursor == cache.next_seq - 1
