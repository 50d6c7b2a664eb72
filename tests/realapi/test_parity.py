"""The parity table of tests/component/test_apiserver_parity.py, asked of a real kube-apiserver:
directly (each row's recorded status is the real one) and through watchproxy in front of it
(the proxy answers as the real apiserver does, except where a row says why it differs)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.component.test_apiserver_parity import CM, CM1, ROWS, Row
from tests.component.test_bad_input import Answer, request, send_raw
from tests.harness import RunningProxy, proxy_for_upstream
from tests.realapi.fixture import RealApiServer

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _proxy_in_front(
    real_apiserver: RealApiServer, tmp: Path, overrides: dict[str, Any]
) -> AsyncIterator[RunningProxy]:
    created = await send_raw(
        real_apiserver.port,
        request(
            "POST",
            CM,
            headers=[
                ("Authorization", f"Bearer {real_apiserver.token}"),
                ("Content-Type", "application/json"),
            ],
            body=json.dumps(CM1).encode(),
        ),
        ssl_context=real_apiserver.ssl_context(),
    )
    assert created.status in (201, 409), created.body[:300]
    upstream = real_apiserver.write_kubeconfig(
        tmp / "upstream.kubeconfig", token=real_apiserver.token
    )
    async with proxy_for_upstream(tmp, upstream, overrides) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def through_proxy(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningProxy]:
    """Watches served by the hub."""
    tmp = tmp_path_factory.mktemp("parity-real")
    async for running in _proxy_in_front(real_apiserver, tmp, {}):
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def through_passthrough(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningProxy]:
    """Every watch passed through (the hub off)."""
    tmp = tmp_path_factory.mktemp("parity-real-passthrough")
    async for running in _proxy_in_front(real_apiserver, tmp, {"hub.enabled": False}):
        yield running


async def _direct(real_apiserver: RealApiServer, row: Row, *, head_only: bool = True) -> Answer:
    return await send_raw(
        real_apiserver.port,
        request(
            row.method, row.target, headers=[("Authorization", f"Bearer {real_apiserver.token}")]
        ),
        ssl_context=real_apiserver.ssl_context(),
        head_only=head_only,
    )


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_the_real_apiserver_answers_as_recorded(
    real_apiserver: RealApiServer, through_proxy: RunningProxy, row: Row
) -> None:
    direct = await _direct(real_apiserver, row)
    assert direct.status == row.real, (row.id, direct.status, direct.body[:200])


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_the_proxy_answers_as_the_real_apiserver(
    through_proxy: RunningProxy, row: Row
) -> None:
    port = through_proxy.proxy.api_port
    answer = await send_raw(port, request(row.method, row.target), head_only=True)
    assert answer.status == row.proxy_status, (row.id, answer.status, answer.body[:200])
    assert answer.status < 500


# The watch-list refusals: client-go's reflector falls back to LIST + WATCH on any of them that
# it cannot retry, so each must reach it with the apiserver's code and reason, hub or not.
WATCH_LIST_ROWS = [row for row in ROWS if "sie" in row.id or row.id.startswith("watch-match")]


@pytest.mark.parametrize("row", WATCH_LIST_ROWS, ids=[row.id for row in WATCH_LIST_ROWS])
@pytest.mark.parametrize("hub", [True, False], ids=["hub", "passthrough"])
async def test_watch_list_refusals_reach_the_client_as_the_apiserver_sends_them(
    real_apiserver: RealApiServer,
    through_proxy: RunningProxy,
    through_passthrough: RunningProxy,
    row: Row,
    hub: bool,
) -> None:
    direct = await _direct(real_apiserver, row, head_only=row.stream)
    port = (through_proxy if hub else through_passthrough).proxy.api_port
    answer = await send_raw(port, request(row.method, row.target), head_only=row.stream)
    assert answer.status == direct.status == row.proxy_status, (row.id, answer.body[:200])
    if direct.status >= 400:
        mine, theirs = answer.status_object, direct.status_object
        assert mine is not None and theirs is not None, (answer.body[:200], direct.body[:200])
        assert (mine["code"], mine["reason"]) == (theirs["code"], theirs["reason"]), (mine, theirs)
