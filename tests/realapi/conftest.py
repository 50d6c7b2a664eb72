"""The ``real_apiserver`` fixture (one real kube-apiserver + etcd for the whole session), the
per-module ``watchlist_off`` (one that refuses watch-lists) and the per-test ``session``,
``direct`` (its admin) and ``namespace`` fixtures."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.clientconnector import SerialConnector
from tests.realapi.fixture import APISERVER_ARGS, RealApiServer, start_or_skip
from tests.realapi.kubeapi import Api


@pytest.fixture(scope="session")
def real_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    """A running kubetestenv (TLS on 127.0.0.1, admin token, RBAC, APF, short compaction).

    Skipped when the binary was not built, except in CI (CI=true), where that fails the tier.
    """
    server = start_or_skip(tmp_path_factory.mktemp("kubetestenv"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def watchlist_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    """An apiserver that refuses watch-lists (``--feature-gates=WatchList=false``)."""
    server = start_or_skip(
        tmp_path_factory.mktemp("kubetestenv-watchlist-off"),
        extra=("-apiserver-args", APISERVER_ARGS + " --feature-gates=WatchList=false"),
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # The proxy's own connector: it keeps track of every connection it dialed, so teardown can
    # wait for the TLS shutdowns that the Go apiserver answers late (see wait_closed) instead
    # of letting a transport outlive the test's loop.
    connector = SerialConnector(is_down=lambda: False, on_failure=lambda _error: None)
    async with aiohttp.ClientSession(connector=connector) as client:
        yield client
    await connector.wait_closed(5.0)


@pytest.fixture
def direct(real_apiserver: RealApiServer, session: aiohttp.ClientSession) -> Api:
    """The real apiserver as its admin (system:masters)."""
    return Api(
        session,
        real_apiserver.url,
        token=real_apiserver.token,
        ssl_context=real_apiserver.ssl_context(),
    )


@pytest.fixture
async def namespace(direct: Api) -> str:
    """A fresh namespace (left behind: no namespace controller runs to finalize a delete)."""
    name = f"t-{secrets.token_hex(4)}"
    await direct.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name
