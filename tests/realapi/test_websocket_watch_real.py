"""Watches over WebSocket (fabric8's default) against the real kube-apiserver, directly and
through watchproxy: the same handshake answers, the same message types and payloads (one event
per message), the same end (close 1000) at ``timeoutSeconds``, the same in-stream 410, pings
answered and the client's close answered alike. Through watchproxy the watch is the hub's."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_apiserver import configmap, pod, proxy

PROTOBUF = "application/vnd.kubernetes.protobuf"


class Side:
    """One way to the apiserver: its WebSocket URL base, headers and TLS."""

    def __init__(self, base: str, headers: dict[str, str], ssl: Any) -> None:
        self.base = base.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        self.headers = {"Origin": base, **headers}
        self.ssl = ssl

    def connect(
        self,
        session: aiohttp.ClientSession,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        protocols: tuple[str, ...] = (),
        autoping: bool = True,
    ) -> Any:
        # autoclose off: a test reads the server's close frame itself (see read_to_close).
        sent = {**self.headers, **(headers or {})}
        return session.ws_connect(
            self.base + target,
            headers={k: v for k, v in sent.items() if v},
            ssl=self.ssl,
            protocols=protocols,
            autoping=autoping,
            autoclose=False,
        )


def sides(real: RealApiServer, running_url: str) -> dict[str, Side]:
    return {
        "direct": Side(real.url, real.auth(), real.ssl_context()),
        "watchproxy": Side(running_url, {}, True),  # plain ws://: no TLS to verify
    }


async def read_until(
    ws: aiohttp.ClientWebSocketResponse,
    messages: list[aiohttp.WSMessage],
    done: Callable[[list[aiohttp.WSMessage]], bool],
    timeout: float = 15,
) -> None:
    async with asyncio.timeout(timeout):
        while not done(messages):
            message = await ws.receive()
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                raise AssertionError(f"closed early after {len(messages)} messages")
            messages.append(message)


async def read_to_close(ws: aiohttp.ClientWebSocketResponse, timeout: float = 15) -> Any:
    """The messages up to the server's close frame, and the status that frame carries.

    Not ``ws.close_code``: the apiserver closes its connection right after its close frame,
    and the client's answering close then fails on TLS (1006) and not on loopback HTTP."""
    messages: list[aiohttp.WSMessage] = []
    async with asyncio.timeout(timeout):
        while True:
            message = await ws.receive()
            if message.type is aiohttp.WSMsgType.CLOSE:
                return messages, message.data
            assert message.type not in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
            messages.append(message)


def hub_clients(running: Any) -> int:
    return int(running.proxy.hub.active_clients)


@pytest.mark.parametrize("accept", ["application/json", PROTOBUF], ids=["json", "protobuf"])
async def test_a_websocket_watch_through_watchproxy_is_the_apiservers_message_for_message(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    session: aiohttp.ClientSession,
    direct: Api,
    namespace: str,
    accept: str,
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(2):
        await direct.ok("POST", pods, body=pod(f"p{i}"))
    async with proxy(tmp_path, real_apiserver) as (running, _api):
        ways = sides(real_apiserver, running.url)
        target = pods + "?watch=true"
        got: dict[str, list[aiohttp.WSMessage]] = {name: [] for name in ways}
        async with (
            ways["direct"].connect(session, target, headers={"Accept": accept}) as direct_ws,
            ways["watchproxy"].connect(session, target, headers={"Accept": accept}) as proxy_ws,
        ):
            sockets = {"direct": direct_ws, "watchproxy": proxy_ws}
            for name, ws in sockets.items():
                await read_until(ws, got[name], lambda m: len(m) == 2)
            assert hub_clients(running) == 1  # the hub serves it
            await direct.ok("POST", pods, body=pod("p2"))
            await direct.ok("DELETE", f"{pods}/p0")
            for name, ws in sockets.items():
                await read_until(ws, got[name], lambda m: len(m) == 4)
        binary = accept == PROTOBUF
        kind = aiohttp.WSMsgType.BINARY if binary else aiohttp.WSMsgType.TEXT
        for name in ways:
            assert [m.type for m in got[name]] == [kind] * 4, name
        # The changes are the apiserver's own bytes, one event per message.
        assert [m.data for m in got["watchproxy"][2:]] == [m.data for m in got["direct"][2:]]
        if binary:
            assert [len(m.data) for m in got["watchproxy"]] == [len(m.data) for m in got["direct"]]
        else:
            for name in ways:
                assert all(m.data.endswith("}\n") and m.data.count("\n") == 1 for m in got[name])
            initial = {n: [json.loads(m.data) for m in got[n][:2]] for n in ways}
            assert initial["watchproxy"] == initial["direct"]


async def test_timeout_seconds_ends_a_websocket_watch_with_close_1000_as_the_apiserver(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    session: aiohttp.ClientSession,
    direct: Api,
    namespace: str,
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", cms, body=configmap("c"))
    async with proxy(tmp_path, real_apiserver) as (running, _api):
        ends: dict[str, Any] = {}
        loop = asyncio.get_running_loop()
        for name, way in sides(real_apiserver, running.url).items():
            started = loop.time()
            async with way.connect(session, cms + "?watch=true&timeoutSeconds=2") as ws:
                messages, code = await read_to_close(ws)
            took = loop.time() - started
            assert 1.9 <= took < 5, (name, took)
            ends[name] = ([json.loads(m.data)["type"] for m in messages], code)
        assert ends["watchproxy"] == ends["direct"] == (["ADDED"], 1000)


async def test_an_expired_resource_version_is_one_410_message_then_close_as_the_apiserver(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    session: aiohttp.ClientSession,
    direct: Api,
    namespace: str,
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    # resourceVersion 1 expires with the apiserver's second compaction (it compacts to the
    # revision of the one before): a fresh apiserver still serves it, so wait until it does not.
    async with asyncio.timeout(60):
        while (
            await direct.request("GET", cms + "?resourceVersion=1&resourceVersionMatch=Exact")
        ).status != 410:
            await direct.ok("POST", cms, body=configmap(f"tick-{secrets.token_hex(3)}"))
            await asyncio.sleep(0.5)
    async with proxy(tmp_path, real_apiserver) as (running, _api):
        ends: dict[str, Any] = {}
        for name, way in sides(real_apiserver, running.url).items():
            async with way.connect(session, cms + "?watch=true&resourceVersion=1") as ws:
                messages, code = await read_to_close(ws)
            events = [(m.type, json.loads(m.data)) for m in messages]
            ends[name] = (
                [(t, e["type"], e["object"]["code"], e["object"]["reason"]) for t, e in events],
                code,
            )
        expected = ([(aiohttp.WSMsgType.TEXT, "ERROR", 410, "Expired")], 1000)
        assert ends["watchproxy"] == ends["direct"] == expected


@pytest.mark.parametrize(
    ("headers", "protocols"),
    [
        ({"Origin": ""}, ()),
        ({"Origin": "null"}, ()),
        ({"Sec-WebSocket-Protocol": "a, b"}, ()),
        ({}, ("v4.channel.k8s.io",)),
        ({}, ()),
    ],
    ids=["no-origin", "null-origin", "two-subprotocols", "one-subprotocol", "plain"],
)
async def test_the_handshake_is_answered_as_the_apiserver_answers_it(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    session: aiohttp.ClientSession,
    direct: Api,
    namespace: str,
    headers: dict[str, str],
    protocols: tuple[str, ...],
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps?watch=true&timeoutSeconds=1"
    async with proxy(tmp_path, real_apiserver) as (running, _api):
        answers: dict[str, Any] = {}
        for name, way in sides(real_apiserver, running.url).items():
            try:
                async with way.connect(session, cms, headers=headers, protocols=protocols) as ws:
                    _messages, code = await read_to_close(ws)
                    answers[name] = (101, ws.protocol, code)
            except aiohttp.WSServerHandshakeError as refused:
                answers[name] = (refused.status, None, None)
        assert answers["watchproxy"] == answers["direct"]


async def test_a_ping_gets_its_pong_and_a_close_gets_the_apiservers_close(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    session: aiohttp.ClientSession,
    direct: Api,
    namespace: str,
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", cms, body=configmap("c"))
    payload = secrets.token_bytes(20)
    async with proxy(tmp_path, real_apiserver) as (running, _api):
        seen: dict[str, Any] = {}
        for name, way in sides(real_apiserver, running.url).items():
            async with way.connect(session, cms + "?watch=true", autoping=False) as ws:
                first = await asyncio.wait_for(ws.receive(), 10)
                await ws.send_str("a watch client's text is read and dropped")
                await ws.ping(payload)
                pong = await asyncio.wait_for(ws.receive(), 10)
                await asyncio.wait_for(ws.close(code=1000, message=b"bye"), 10)
                seen[name] = (first.type, pong.type, pong.data, ws.close_code)
        assert seen["watchproxy"] == seen["direct"]
        assert seen["direct"][:3] == (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.PONG, payload)
