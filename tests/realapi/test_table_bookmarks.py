"""A ``Table`` watch's bookmark through watchproxy's hub is the apiserver's, line for line.

The apiserver runs the resource's table convertor on a bookmark's object (an empty object of the
kind with the resourceVersion and, at the end of a watch-list's initial events, the
``k8s.io/initial-events-end`` annotation): its row has the cells the convertor prints for an
empty object, and the Table has ``columnDefinitions: null`` unless the bookmark is the stream's
first event (see watchproxy/kube/tables.py). Roles are served by the default table convertor
(name, created at), whose empty row watchproxy computes; kinds with their own printers are
learned from the apiserver's own (periodic) bookmarks, which a test cannot wait a minute for.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.clientconnector import SerialConnector
from tests.harness import proxy_for_upstream
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api

pytestmark = pytest.mark.timeout(120, func_only=True)

TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"
WATCH_LIST = (
    "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
)
ROLES = "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"


@pytest.fixture
async def raw() -> AsyncIterator[aiohttp.ClientSession]:
    connector = SerialConnector(is_down=lambda: False, on_failure=lambda _error: None)
    async with aiohttp.ClientSession(connector=connector) as client:
        yield client
    await connector.wait_closed(5.0)


async def lines_to_end(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], **kwargs: Any
) -> list[bytes]:
    """A watch-list's lines up to and including its initial-events-end bookmark."""
    lines: list[bytes] = []
    async with session.get(url, headers=headers, **kwargs) as response:
        assert response.status == 200, await response.text()
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                lines.append(line)
                if b'"k8s.io/initial-events-end":"true"' in line:
                    return lines
    raise AssertionError(f"{url}: the stream ended before its end bookmark: {lines}")


def without_rvs(line: bytes) -> Any:
    """A bookmark line's event with its resourceVersions left out (the hub's bookmark carries
    its stream's RV, the apiserver its watch cache's), and the Table's key order kept."""
    event = json.loads(line)
    table = event["object"]
    table["metadata"].pop("resourceVersion")
    for row in table["rows"]:
        row["object"]["metadata"].pop("resourceVersion")
    return event, list(table)


@pytest.mark.parametrize("objects", [2, 0], ids=["after-objects", "first-event"])
async def test_a_table_watch_lists_bookmark_through_the_hub_is_the_apiservers(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    raw: aiohttp.ClientSession,
    objects: int,
) -> None:
    path = ROLES.format(namespace=namespace)
    for index in range(objects):
        role = {"metadata": {"name": f"role-{index}"}, "rules": []}
        await direct.ok("POST", path, body=role)
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "up.kubeconfig", token=real_apiserver.token
    )
    async with proxy_for_upstream(tmp_path, upstream, {"hub.enabled": True}) as running:
        straight = await lines_to_end(
            raw,
            real_apiserver.url + path + WATCH_LIST,
            {"Accept": TABLE, **real_apiserver.auth()},
            ssl=real_apiserver.ssl_context(),
        )
        proxied = await lines_to_end(raw, running.url + path + WATCH_LIST, {"Accept": TABLE})
        assert running.proxy.hub is not None and len(running.proxy.hub.watches) == 1
    assert len(proxied) == len(straight) == objects + 1, (proxied, straight)
    assert without_rvs(proxied[-1]) == without_rvs(straight[-1]), (proxied[-1], straight[-1])
    # The initial events too, byte for byte (the default convertor's cells hold no age): the
    # first with the columns, the others with null, each in the apiserver's key order.
    assert proxied[:-1] == straight[:-1]
