"""The ``real_apiserver`` fixture: one real kube-apiserver + etcd for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.realapi.fixture import RealApiServer, Unavailable, ci_requires_tier, start_kubetestenv


@pytest.fixture(scope="session")
def real_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    """A running kubetestenv (TLS on 127.0.0.1, admin token, RBAC, APF, short compaction).

    Skipped when the binary was not built, except in CI (CI=true), where that fails the tier.
    """
    try:
        server = start_kubetestenv(tmp_path_factory.mktemp("kubetestenv"))
    except Unavailable as why:
        if ci_requires_tier():
            pytest.fail(f"CI=true and the real apiserver is unavailable: {why}")
        pytest.skip(str(why))
    try:
        yield server
    finally:
        server.stop()
