"""Watches over WebSocket (fabric8's default), through watchproxy against the fake apiserver,
read by a real WebSocket client (aiohttp's): served by the hub like any watch, one event per
text message, ended by a close frame with status 1000, relayed when the hub cannot serve them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from tests.harness import Running, read_watch, running_proxy, rv_of, wait_for

PODS = "/api/v1/namespaces/default/pods"
# fabric8 sends an Origin on its watches; the apiserver's WebSocket handler refuses none (403).
ORIGIN = {"Origin": "http://127.0.0.1"}


def pod(name: str, app: str = "web", phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": phase},
    }


def set_phase(phase: str) -> Any:
    def apply(obj: dict[str, Any]) -> None:
        obj.setdefault("status", {})["phase"] = phase

    return apply


def watch_opens(running: Running, path: str = PODS) -> int:
    return sum(1 for p in running.fake.stats.watch_paths if p == path)


def ws_url(running: Running, target: str) -> str:
    return running.url.replace("http://", "ws://", 1) + target


def names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in events]


class Messages:
    """What one WebSocket watch client received: every message, and how the stream ended."""

    def __init__(self) -> None:
        self.raw: list[aiohttp.WSMessage] = []
        self.events: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.protocol: str | None = None


async def read_ws_watch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    until: Any = lambda events: False,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
    protocols: tuple[str, ...] = (),
) -> Messages:
    """Read one WebSocket watch until ``until(events)`` holds or the server closes it. Each
    message must be one text message holding exactly one event line (its ``\\n`` included)."""
    got = Messages()

    async def consume() -> None:
        async with session.ws_connect(
            url, headers=headers or ORIGIN, autoping=True, protocols=protocols
        ) as ws:
            got.protocol = ws.protocol
            async for message in ws:
                got.raw.append(message)
                assert message.type is aiohttp.WSMsgType.TEXT, message
                assert message.data.endswith("\n") and message.data.count("\n") == 1
                got.events.append(json.loads(message.data))
                if until(got.events):
                    return
            got.close_code = ws.close_code

    await asyncio.wait_for(consume(), timeout)
    return got


async def test_websocket_watchers_share_one_upstream_watch_with_http_watchers(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        for i in range(3):
            store.create("pods", "default", pod(f"web-{i}"))
        target = PODS + "?watch=true&labelSelector=app%3Dweb"

        def until(events: list[dict[str, Any]]) -> bool:
            return len(events) >= 3 + 10

        ws_clients = [
            asyncio.ensure_future(
                read_ws_watch(
                    session, ws_url(running, target), until=until, protocols=("p",) * (i % 2)
                )
            )
            for i in range(8)
        ]
        http_client = asyncio.ensure_future(read_watch(session, running.url + target, until=until))
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: sum(len(w.cursors) for w in hub.watches.values()) == 9)
        for i in range(10):
            store.modify("pods", "default", f"web-{i % 3}", set_phase(f"P{i}"))
        results = await asyncio.wait_for(asyncio.gather(*ws_clients), 20)
        over_http = await asyncio.wait_for(http_client, 20)

        assert watch_opens(running) == 1
        assert not [r for r in running.fake.stats.requests if "Upgrade" in r.headers]
        for i, got in enumerate(results):
            assert got.protocol == ("p" if i % 2 else None)  # the one offered is echoed
            assert got.events == over_http  # the same events, one per message, in order
        rvs = [rv_of(e) for e in over_http[3:]]
        assert rvs == sorted(rvs) and len(set(rvs)) == 10


async def test_websocket_watch_resource_version_semantics(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        for i in range(3):
            store.create("pods", "default", pod(f"p{i}"))
        # RV unset: the current state as ADDED events.
        fresh = await read_ws_watch(
            session, ws_url(running, PODS + "?watch=1"), until=lambda e: len(e) == 3
        )
        assert names(fresh.events) == [("ADDED", f"p{i}") for i in range(3)]
        mid = store.modify("pods", "default", "p1", set_phase("Running"))
        store.delete("pods", "default", "p2")
        store.create("pods", "default", pod("p3"))
        await asyncio.sleep(0.2)  # let the shared watch take in the changes
        # RV "0": any state, as ADDED events.
        zero = await read_ws_watch(
            session,
            ws_url(running, PODS + "?watch=1&resourceVersion=0"),
            until=lambda e: len(e) == 3,
        )
        assert sorted(names(zero.events)) == [("ADDED", n) for n in ("p0", "p1", "p3")]
        # RV N (inside the shared watch's history): only what came after N.
        rv = mid["metadata"]["resourceVersion"]
        resumed = await read_ws_watch(
            session,
            ws_url(running, PODS + f"?watch=1&resourceVersion={rv}"),
            until=lambda e: len(e) == 2,
        )
        assert names(resumed.events) == [("DELETED", "p2"), ("ADDED", "p3")]
        assert all(rv_of(e) > int(rv) for e in resumed.events)
        assert watch_opens(running) == 1  # all of it from one shared upstream watch


async def test_websocket_watch_bookmarks_and_timeout_end_with_close_1000(tmp_path: Any) -> None:
    overrides = {"hub.bookmark_interval_seconds": 0.2}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("p"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await read_ws_watch(
            session,
            ws_url(running, PODS + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=1"),
        )
        elapsed = loop.time() - started
        assert 0.9 <= elapsed < 3
        assert got.close_code == 1000
        types = [e["type"] for e in got.events]
        assert types[0] == "ADDED" and types.count("BOOKMARK") >= 2
        assert set(got.events[-1]["object"]["metadata"]) == {"resourceVersion"}


async def test_websocket_watch_rv_outside_the_window_gets_the_apiservers_410_message(
    tmp_path: Any,
) -> None:
    overrides = {"hub.history_size": 3}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        first = store.create("pods", "default", pod("p"))
        await read_ws_watch(session, ws_url(running, PODS + "?watch=1"), until=lambda e: e)
        for i in range(6):
            store.modify("pods", "default", "p", set_phase(f"P{i}"))
        store.compact()
        old_rv = first["metadata"]["resourceVersion"]
        got = await read_ws_watch(
            session, ws_url(running, PODS + f"?watch=1&resourceVersion={old_rv}")
        )
        [event] = got.events
        assert event["type"] == "ERROR"
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
        assert got.close_code == 1000
        # Older than the hub's history: relayed to the apiserver as the upgrade it is.
        relayed = [r for r in running.fake.stats.requests if r.watch and "Upgrade" in r.headers]
        assert len(relayed) == 1
        passed = running.proxy.metrics.passthrough_watches.labels("outside-window")
        assert passed._value.get() == 1  # type: ignore[attr-defined]


async def test_websocket_watch_stays_open_through_an_outage_and_loses_nothing(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        for i in range(2):
            store.create("pods", "default", pod(f"p{i}"))
        events: list[dict[str, Any]] = []
        done = asyncio.Event()

        def until(got: list[dict[str, Any]]) -> bool:
            events[:] = got
            names_seen = names(got)
            return ("DELETED", "p1") in names_seen and ("MODIFIED", "p0") in names_seen

        reader = asyncio.ensure_future(
            read_ws_watch(session, ws_url(running, PODS + "?watch=1"), until=until, timeout=30)
        )
        hub = running.proxy.hub
        assert hub is not None
        await wait_for(lambda: sum(len(w.cursors) for w in hub.watches.values()) == 1)
        await wait_for(lambda: len(events) == 2)
        await running.fake.faults.outage("reset")
        store.create("pods", "default", pod("p9"))
        store.delete("pods", "default", "p1")
        store.modify("pods", "default", "p0", set_phase("Running"))
        await asyncio.sleep(0.5)  # the outage lasts: the client's stream stays open meanwhile
        assert not reader.done()
        await running.fake.faults.recover()
        got = await asyncio.wait_for(reader, 30)
        done.set()
        assert names(got.events) == [
            ("ADDED", "p0"),
            ("ADDED", "p1"),
            ("ADDED", "p9"),
            ("DELETED", "p1"),
            ("MODIFIED", "p0"),
        ]
        rvs = [rv_of(e) for e in got.events[2:]]
        assert rvs == sorted(rvs) and len(set(rvs)) == 3


async def test_websocket_watch_answers_ping_and_ends_on_the_clients_close(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("p"))
        hub = running.proxy.hub
        assert hub is not None
        async with session.ws_connect(
            ws_url(running, PODS + "?watch=1"), headers=ORIGIN, autoping=False
        ) as ws:
            first = await asyncio.wait_for(ws.receive(), 5)
            assert first.type is aiohttp.WSMsgType.TEXT
            await ws.send_str("ignored: a watch client has nothing to say")
            await ws.ping(b"are you there")
            pong = await asyncio.wait_for(ws.receive(), 5)
            assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, b"are you there")
            await wait_for(lambda: sum(len(w.cursors) for w in hub.watches.values()) == 1)
            await asyncio.wait_for(ws.close(code=1000), 5)
            assert ws.close_code == 1000  # the server's answering close
        await wait_for(lambda: sum(len(w.cursors) for w in hub.watches.values()) == 0)


async def test_a_websocket_watch_the_hub_does_not_serve_is_relayed_as_an_upgrade(
    tmp_path: Any,
) -> None:
    overrides = {"hub.enabled": False}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("p"))
        got = await read_ws_watch(
            session,
            ws_url(running, PODS + "?watch=1&timeoutSeconds=1"),
            protocols=("v4.channel.k8s.io",),
        )
        assert got.protocol == "v4.channel.k8s.io"
        assert names(got.events) == [("ADDED", "p")]
        assert got.close_code == 1000
        [relayed] = [r for r in running.fake.stats.requests if r.watch]
        assert relayed.headers["Upgrade"] == "websocket"


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 403), ({**ORIGIN, "Sec-WebSocket-Protocol": "a, b"}, 400)],
    ids=["no-origin", "two-subprotocols"],
)
async def test_a_handshake_the_apiserver_refuses_gets_its_own_answer(
    tmp_path: Any, headers: dict[str, str], status: int
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(ws_url(running, PODS + "?watch=1"), headers=headers)
        assert refused.value.status == status
        # Relayed: the refusal is the apiserver's own.
        relayed = [r for r in running.fake.stats.requests if r.watch and "Upgrade" in r.headers]
        assert len(relayed) == 1


async def test_a_refused_upgrade_is_counted_each_time_and_logged_once_per_client(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        rejected = running.proxy.metrics.rejected.labels("upgrade-not-relayed")
        caplog.set_level(logging.WARNING, logger="watchproxy.server")
        for _ in range(3):
            async with session.get(
                running.url + PODS + "?watch=1",
                headers={"Upgrade": "h2c", "Connection": "Upgrade"},
            ) as response:
                assert response.status == 400
        for agent in ("one", "other"):
            async with session.get(
                running.url + PODS + "?watch=1",
                headers={"Upgrade": "h2c", "Connection": "Upgrade", "User-Agent": agent},
            ) as response:
                assert response.status == 400
        assert rejected._value.get() == 5  # type: ignore[attr-defined]
        logged = [r for r in caplog.records if "refused an upgrade" in r.getMessage()]
        assert len(logged) == 3  # one per client (User-Agent), not per request
        assert watch_opens(running) == 0


def annotate(blob: str, i: int) -> Any:
    def apply(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("annotations", {})["blob"] = f"{i}-{blob}"

    return apply


async def test_a_websocket_client_that_reads_nothing_is_ended_alone(tmp_path: Any) -> None:
    overrides = {
        "hub.slow_subscriber_timeout_seconds": 1.0,
        "hub.history_size": 50,
        "hub.max_subscriber_lag": 40,
    }
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        store = running.fake.store
        store.create("pods", "default", pod("big"))
        hub = running.proxy.hub
        assert hub is not None
        # A WebSocket client that completes its handshake and then never reads a byte.
        reader, writer = await asyncio.open_connection("127.0.0.1", running.proxy.api_port)
        writer.write(
            (
                f"GET {PODS}?watch=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101 ")
        assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head
        await wait_for(lambda: hub.active_clients == 1)
        blob = "x" * 70000  # each event a frame with a 64-bit length
        healthy = asyncio.ensure_future(
            read_ws_watch(
                session, ws_url(running, PODS + "?watch=1"), until=lambda e: len(e) == 201
            )
        )
        await wait_for(lambda: hub.active_clients == 2)
        # Both subscribed before the changes start: a client counted as active may still be
        # waiting for a current state, and then starts from a newer one, with fewer changes
        # to come than this test waits for (the compiled build got there after 40 of 200).
        await wait_for(lambda: sum(len(w.cursors) for w in hub.watches.values()) == 2)
        for i in range(200):
            store.modify("pods", "default", "big", annotate(blob, i))
            if i % 20 == 19:
                await asyncio.sleep(0.01)
        got = await asyncio.wait_for(healthy, 30)
        rvs = [rv_of(e) for e in got.events[1:]]
        assert len(rvs) == 200 and rvs == sorted(set(rvs))  # the healthy client got everything
        assert got.events[-1]["object"]["metadata"]["annotations"]["blob"] == f"199-{blob}"
        await wait_for(lambda: hub.active_clients == 0, timeout=15)
        assert running.proxy.metrics.slow_subscribers._value.get() == 1  # type: ignore[attr-defined]
        writer.close()


async def test_a_stopping_proxy_ends_a_websocket_watch_with_close_1000(
    tmp_path: Any,
) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("pods", "default", pod("p"))
        hub = running.proxy.hub
        assert hub is not None
        async with session.ws_connect(ws_url(running, PODS + "?watch=1"), headers=ORIGIN) as ws:
            first = await asyncio.wait_for(ws.receive(), 5)
            assert first.type is aiohttp.WSMsgType.TEXT
            stopping = asyncio.ensure_future(running.proxy.stop())
            end = await asyncio.wait_for(ws.receive(), 10)
            assert (end.type, end.data) == (aiohttp.WSMsgType.CLOSE, 1000)
            await asyncio.wait_for(stopping, 30)


async def test_a_websocket_resume_the_hubs_relist_made_ambiguous_gets_its_410_message(
    tmp_path: Any,
) -> None:
    overrides = {"backoff.initial_seconds": 0.05, "backoff.max_seconds": 0.2}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        store, faults = running.fake.store, running.fake.faults
        store.create("pods", "default", pod("p0"))
        events: list[dict[str, Any]] = []

        def follow(got: list[dict[str, Any]]) -> bool:
            events[:] = got
            return ("ADDED", "p2") in names(got)

        follower = asyncio.ensure_future(
            read_ws_watch(session, ws_url(running, PODS + "?watch=1"), until=follow, timeout=30)
        )
        await wait_for(lambda: len(events) == 1)
        # Writes the hub cannot see, then compacted away: its resume gets 410 and it relists,
        # so an RV between its last one and the relist's is one it cannot answer exactly.
        await faults.outage("refuse")
        between = store.create("pods", "default", pod("p1"))["metadata"]["resourceVersion"]
        store.create("pods", "default", pod("p2"))
        store.compact()
        await faults.recover()
        await asyncio.wait_for(follower, 30)
        got = await read_ws_watch(
            session, ws_url(running, PODS + f"?watch=1&resourceVersion={between}")
        )
        [event] = got.events
        assert (event["type"], event["object"]["code"]) == ("ERROR", 410)
        assert got.close_code == 1000
        assert running.proxy.metrics.expired._value.get() == 1  # type: ignore[attr-defined]
        assert not [r for r in running.fake.stats.requests if "Upgrade" in r.headers]
