"""Compressed answers through watchproxy, against the real apiserver.

kube-apiserver gzips a LIST over 128 KiB for a client that sends ``Accept-Encoding: gzip``,
and from 1.37 a watch-list too, one gzip member per flush (``Vary: Accept-Encoding``).
What watchproxy passes through keeps ``Content-Encoding`` and the bytes as the apiserver
sent them; a client that does not ask for gzip never gets it, from the hub or not. The hub
answers a watch with the encoding headers the apiserver gives the same watch and the same
events, decoded (1.37: gzip for a watch-list that allows bookmarks and whose Accept-Encoding
holds the bare token gzip; see watchproxy/kube/contentcoding.py).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.clientconnector import SerialConnector
from tests.harness import proxy_for_upstream
from tests.realapi.fixture import RealApiServer, version_tuple
from tests.realapi.kubeapi import Api
from watchproxy.upstream.bodies import GzipMembers

pytestmark = pytest.mark.timeout(120, func_only=True)

END = b'"k8s.io/initial-events-end":"true"'
WATCH_LIST = (
    "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
)


@pytest.fixture
async def raw() -> AsyncIterator[aiohttp.ClientSession]:
    """A session that neither asks for nor decodes any encoding on its own."""
    connector = SerialConnector(is_down=lambda: False, on_failure=lambda _error: None)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, skip_auto_headers=("Accept-Encoding",)
    ) as client:
        yield client
    await connector.wait_closed(5.0)


async def filled(direct: Api, namespace: str, count: int = 300) -> str:
    """``count`` configmaps of about 1 KiB: their LIST is well over the 128 KiB threshold."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(count):
        body = {"metadata": {"name": f"cm-{i:04d}"}, "data": {"v": secrets.token_hex(400)}}
        await direct.ok("POST", path, body=body)
    return path


async def read_until_end(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    *,
    then: Callable[[], Awaitable[bytes]] | None = None,
    **kwargs: Any,
) -> tuple[dict[str, str], bytes, bytes, int]:
    """A watch-list's headers, its raw bytes and decoded bytes up to the end bookmark (and,
    with ``then``, on until the marker ``then()`` returns after the end bookmark), and how
    many gzip members that was (0 for an identity body)."""
    async with session.get(url, headers=headers, **kwargs) as response:
        assert response.status == 200, await response.text()
        raw = bytearray()
        members = GzipMembers()
        decoded = bytearray()
        gzipped = response.headers.get("Content-Encoding") == "gzip"
        marker = END
        async for chunk in response.content.iter_any():
            raw += chunk
            decoded += members.feed(chunk) if gzipped else chunk
            if marker in decoded:
                if marker is not END or then is None:
                    break
                marker = await then()
        return dict(response.headers), bytes(raw), bytes(decoded), members.members


def events(decoded: bytes) -> list[tuple[str, str, str]]:
    out = []
    for line in decoded.splitlines():
        if line.strip():
            event = json.loads(line)
            meta = event["object"]["metadata"]
            out.append((event["type"], meta.get("name", ""), meta["resourceVersion"]))
    return out


async def test_passthrough_keeps_a_gzip_list_byte_for_byte(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    raw: aiohttp.ClientSession,
) -> None:
    path = await filled(direct, namespace)
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    gzip_json = {"Accept": "application/json", "Accept-Encoding": "gzip"}
    async with proxy_for_upstream(tmp_path, upstream, {"hub.enabled": False}) as running:
        rv = (await direct.ok("GET", path))["metadata"]["resourceVersion"]
        # The same RV (exact) both ways: the same list, so the same gzip stream.
        query = f"?resourceVersion={rv}&resourceVersionMatch=Exact"
        async with raw.get(
            real_apiserver.url + path + query,
            headers={**gzip_json, **real_apiserver.auth()},
            ssl=real_apiserver.ssl_context(),
        ) as answer:
            direct_body, direct_headers = await answer.read(), answer.headers.copy()
        async with raw.get(running.url + path + query, headers=gzip_json) as answer:
            proxied_body, proxied_headers = await answer.read(), answer.headers.copy()
    assert direct_headers.get("Content-Encoding") == "gzip", dict(direct_headers)
    assert proxied_headers.get("Content-Encoding") == "gzip", dict(proxied_headers)
    assert proxied_body == direct_body


async def test_passthrough_keeps_the_members_of_a_gzip_watch_list(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    raw: aiohttp.ClientSession,
) -> None:
    if version_tuple(real_apiserver.version) < (1, 37):
        pytest.skip(f"kube-apiserver {real_apiserver.version} does not compress watch-lists")
    path = await filled(direct, namespace)
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    gzip_json = {"Accept": "application/json", "Accept-Encoding": "gzip"}

    async def one_more() -> bytes:
        """A change after the end bookmark: the apiserver flushes it as a member of its own."""
        name = f"late-{secrets.token_hex(3)}"
        await direct.ok("POST", path, body={"metadata": {"name": name}})
        return name.encode()

    async with proxy_for_upstream(tmp_path, upstream, {"hub.enabled": False}) as running:
        d_headers, _, d_decoded, _ = await read_until_end(
            raw,
            real_apiserver.url + path + WATCH_LIST,
            {**gzip_json, **real_apiserver.auth()},
            ssl=real_apiserver.ssl_context(),
        )
        p_headers, _, p_decoded, p_members = await read_until_end(
            raw, running.url + path + WATCH_LIST, gzip_json, then=one_more
        )
    assert d_headers.get("Content-Encoding") == "gzip", d_headers
    assert p_headers.get("Content-Encoding") == "gzip", p_headers
    assert "Accept-Encoding" in p_headers.get("Vary", ""), p_headers
    # Members after the first came through whole: the late change's own member among them.
    assert p_members >= 2, p_members
    proxied, straight = events(p_decoded), events(d_decoded)
    assert proxied[:300] == straight[:300]  # the 300 ADDED
    # The end bookmark carries the revision the apiserver's watch cache had reached, which
    # moves on etcd progress notifications that other writes cause, with no event in this
    # namespace: the pass-through watch-list, opened after the direct one, may end at a later
    # one (a stressed cold CI run: 845 through watchproxy, 844 direct).
    assert [kind for kind, _, _ in (proxied[300], straight[300])] == ["BOOKMARK"] * 2
    assert (
        int(proxied[300][2]) >= int(straight[300][2]) >= max(int(rv) for *_, rv in straight[:300])
    )
    assert [(kind, name) for kind, name, _ in proxied[301:]] == [("ADDED", proxied[-1][1])]


@pytest.mark.parametrize("hub", [True, False], ids=["hub", "passthrough"])
async def test_a_client_that_does_not_ask_for_gzip_never_gets_it(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    raw: aiohttp.ClientSession,
    hub: bool,
) -> None:
    path = await filled(direct, namespace)
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    plain = {"Accept": "application/json"}
    async with proxy_for_upstream(tmp_path, upstream, {"hub.enabled": hub}) as running:
        headers, raw_body, decoded, members = await read_until_end(
            raw, running.url + path + WATCH_LIST, plain
        )
        async with raw.get(running.url + path, headers=plain) as answer:
            listed = await answer.read()
            list_encoding = answer.headers.get("Content-Encoding")
    assert "Content-Encoding" not in headers, headers
    assert members == 0 and raw_body == decoded
    assert len(events(decoded)) == 301
    assert list_encoding is None
    assert len(json.loads(listed)["items"]) == 300


# (Accept, Accept-Encoding, query) cases whose headers and decoded stream must be the same
# direct and through the hub: gzip-looking values the apiserver does not take for gzip, a
# watch from "now" (a watch-list after defaulting), a watch without bookmarks, protobuf.
FROM_NOW = "?watch=1&allowWatchBookmarks=true"
PROTOBUF = "application/vnd.kubernetes.protobuf"
HUB_CASES = [
    ("application/json", "gzip", WATCH_LIST),
    ("application/json", None, WATCH_LIST),
    ("application/json", "deflate, gzip", FROM_NOW),
    ("application/json", "gzip;q=1.0", WATCH_LIST),
    ("application/json", "GZIP", WATCH_LIST),
    ("application/json", "identity", WATCH_LIST),
    ("application/json", "gzip", "?watch=1"),
    (PROTOBUF, "gzip", WATCH_LIST),
]


def comparable(decoded: bytes, accept: str) -> list[Any]:
    """The events of a stream with the end bookmark's RV left out (the hub's is its stream
    RV, not the apiserver's current one): a protobuf stream's frames up to the bookmark's."""
    if accept == PROTOBUF:
        frames, at = [], 0
        while at + 4 <= len(decoded):
            end = at + 4 + int.from_bytes(decoded[at : at + 4], "big")
            frames.append(decoded[at:end])
            at = end
        assert b"k8s.io/initial-events-end" in frames[-1]  # the last, cut at the marker
        return frames[:-1]
    out: list[Any] = []
    for line in decoded.splitlines():
        event = json.loads(line)
        if event["type"] == "BOOKMARK":
            event["object"]["metadata"].pop("resourceVersion")
        out.append(event)
    return out


async def test_the_hub_answers_gzip_watches_as_the_apiserver_does(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    raw: aiohttp.ClientSession,
) -> None:
    """The same watch direct and through the hub: the same encoding headers, the same events;
    for a gzip watch-list, a change after the end bookmark comes as a member of its own."""
    if version_tuple(real_apiserver.version) < (1, 37):
        # The hub compresses watch-lists as 1.37 does whatever the version behind it (a client
        # that sends Accept-Encoding: gzip takes gzip): not the answer of an older apiserver.
        pytest.skip(f"kube-apiserver {real_apiserver.version} does not compress watch-lists")
    path = await filled(direct, namespace, count=60)
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    last = f"cm-{59:04d}".encode()
    async with proxy_for_upstream(tmp_path, upstream, {"hub.enabled": True}) as running:
        assert running.proxy.hub is not None
        for accept, encoding, query in HUB_CASES:
            headers = {"Accept": accept}
            if encoding is not None:
                headers["Accept-Encoding"] = encoding
            # A watch without bookmarks has no end bookmark: read up to its last object.
            marker = last if "allowWatchBookmarks" not in query else b"initial-events-end"
            direct_answer = await read_to(
                raw,
                real_apiserver.url + path + query,
                {**headers, **real_apiserver.auth()},
                marker,
                ssl=real_apiserver.ssl_context(),
            )
            proxied_answer = await read_to(raw, running.url + path + query, headers, marker)
            (d_headers, d_decoded, _), (p_headers, p_decoded, p_members) = (
                direct_answer,
                proxied_answer,
            )
            case = f"{accept} {encoding!r} {query}"
            for name in ("Content-Encoding", "Vary", "Content-Type"):
                assert d_headers.get(name) == p_headers.get(name), (
                    case,
                    name,
                    d_headers,
                    p_headers,
                )
            gzipped = encoding == "gzip" or encoding == "deflate, gzip"
            expected = "gzip" if gzipped and "allowWatchBookmarks" in query else None
            assert p_headers.get("Content-Encoding") == expected, case
            assert (p_members > 0) == (expected == "gzip"), case
            assert comparable(p_decoded, accept) == comparable(d_decoded, accept), case
        # Served from the hub: one shared watch per representation, not one per client.
        assert len(running.proxy.hub.watches) == 2, running.proxy.hub.debug()

        async def one_more() -> bytes:
            name = f"late-{secrets.token_hex(3)}"
            await direct.ok("POST", path, body={"metadata": {"name": name}})
            return name.encode()

        gzip_json = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        _, _, decoded, members = await read_until_end(
            raw, running.url + path + WATCH_LIST, gzip_json, then=one_more
        )
    # The initial events and the end bookmark (in members of up to 64 KiB: the hub writes an
    # initial sync in such batches), then the late change, a member of its own: read whole.
    assert members >= 2, members
    assert [kind for kind, _, _ in events(decoded)[-2:]] == ["BOOKMARK", "ADDED"]


async def read_to(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    marker: bytes,
    **kwargs: Any,
) -> tuple[dict[str, str], bytes, int]:
    """A watch's headers, its decoded bytes up to the line holding ``marker``, its members."""
    async with session.get(url, headers=headers, **kwargs) as response:
        assert response.status == 200, await response.text()
        members = GzipMembers()
        decoded = bytearray()
        gzipped = response.headers.get("Content-Encoding") == "gzip"
        async for chunk in response.content.iter_any():
            decoded += members.feed(chunk) if gzipped else chunk
            at = decoded.find(marker)
            if at < 0:
                continue
            # Up to the marker's line (JSON), or the marker itself (protobuf: both streams are
            # cut at the same point of the same bytes).
            end = decoded.find(b"\n", at) + 1 if b"json" in headers["Accept"].encode() else 0
            if end or PROTOBUF in headers["Accept"]:
                return (
                    dict(response.headers),
                    bytes(decoded[: end or at + len(marker)]),
                    (members.members),
                )
        raise AssertionError(f"{url}: the stream ended before {marker!r}")
