"""Header values with obs-text bytes, as the real kube-apiserver judges them: it accepts them,
directly and through watchproxy (which refused them with a codec error before), and a credential
made of such bytes is refused with the apiserver's own 401, also in forward-identity mode where
watchproxy keys shared state by a digest of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.component.test_bad_input import send_raw
from tests.harness import RunningProxy, proxy_for_upstream
from tests.realapi.fixture import RealApiServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

TARGET = "/api/v1/namespaces/default/configmaps"
VALUES = [b"caf\xe9", b"caf\xc3\xa9", b"\xff\x80 ok"]


def _get(value: bytes, *, token: str | bytes | None = None, target: str = TARGET) -> bytes:
    if isinstance(token, str):
        token = token.encode()
    auth = b"" if token is None else b"Authorization: Bearer " + token + b"\r\n"
    return (
        b"GET " + target.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"X-Caller-Note: " + value + b"\r\nConnection: close\r\n\r\n"
    )  # fmt: skip


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxied(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningProxy]:
    tmp: Path = tmp_path_factory.mktemp("header-bytes-real")
    upstream = real_apiserver.write_kubeconfig(
        tmp / "upstream.kubeconfig", token=real_apiserver.token
    )
    async with proxy_for_upstream(tmp, upstream, {}) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def forwarding(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningProxy]:
    tmp: Path = tmp_path_factory.mktemp("header-bytes-forward")
    upstream = real_apiserver.write_kubeconfig(
        tmp / "upstream.kubeconfig", token=real_apiserver.token
    )
    async with proxy_for_upstream(tmp, upstream, {"security.identity": "forward"}) as running:
        yield running


@pytest.mark.parametrize("value", VALUES, ids=["latin-1", "utf-8", "mixed"])
async def test_obs_text_values_are_accepted_as_the_apiserver_accepts_them(
    real_apiserver: RealApiServer, proxied: RunningProxy, value: bytes
) -> None:
    direct = await send_raw(
        real_apiserver.port,
        _get(value, token=real_apiserver.token),
        ssl_context=real_apiserver.ssl_context(),
    )
    assert direct.status == 200, direct.body[:300]
    through = await send_raw(proxied.proxy.api_port, _get(value))
    assert through.status == 200, through.body[:300]


# A watch (served by the hub, keyed by the credential's digest) and the LISTs the hub may
# answer (resourceVersion=0, consistent): each path that looks at the credential.
FORWARDED = [
    TARGET + "?watch=1&timeoutSeconds=1",
    TARGET + "?resourceVersion=0",
    TARGET,
]


@pytest.mark.parametrize("target", FORWARDED, ids=["watch", "list-rv0", "list"])
@pytest.mark.parametrize("token", VALUES, ids=["latin-1", "utf-8", "mixed"])
async def test_obs_text_credentials_get_the_apiservers_401_in_forward_identity_mode(
    real_apiserver: RealApiServer, forwarding: RunningProxy, token: bytes, target: str
) -> None:
    direct = await send_raw(
        real_apiserver.port, _get(b"x", token=token, target=target),
        ssl_context=real_apiserver.ssl_context(),
    )  # fmt: skip
    assert direct.status == 401, direct.body[:300]
    through = await send_raw(forwarding.proxy.api_port, _get(b"x", token=token, target=target))
    assert (through.status, through.body) == (direct.status, direct.body), through.body[:400]
