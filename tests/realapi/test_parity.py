"""The parity table of tests/component/test_apiserver_parity.py, asked of a real kube-apiserver:
directly (each row's recorded status is the real one) and through watchproxy in front of it
(the proxy answers as the real apiserver does, except where a row says why it differs)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.component.test_apiserver_parity import CM, CM1, ROWS, Row
from tests.component.test_bad_input import request, send_raw
from tests.harness import RunningProxy, proxy_for_upstream
from tests.realapi.fixture import RealApiServer

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def through_proxy(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("parity-real")
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
    async with proxy_for_upstream(tmp, upstream) as running:
        yield running


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_the_real_apiserver_answers_as_recorded(
    real_apiserver: RealApiServer, through_proxy: RunningProxy, row: Row
) -> None:
    direct = await send_raw(
        real_apiserver.port,
        request(
            row.method, row.target, headers=[("Authorization", f"Bearer {real_apiserver.token}")]
        ),
        ssl_context=real_apiserver.ssl_context(),
        head_only=True,
    )
    assert direct.status == row.real, (row.id, direct.status, direct.body[:200])


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_the_proxy_answers_as_the_real_apiserver(
    through_proxy: RunningProxy, row: Row
) -> None:
    port = through_proxy.proxy.api_port
    answer = await send_raw(port, request(row.method, row.target), head_only=True)
    assert answer.status == row.proxy_status, (row.id, answer.status, answer.body[:200])
    assert answer.status < 500
