"""A watch through watchproxy ends at the real apiserver within a second of its client going.

The apiserver's own gauge ``apiserver_longrunning_requests{verb="WATCH",resource="configmaps"}``
is the witness: it is read before a client opens a quiet watch of configmaps through watchproxy,
while the watch is open (one higher), and after the client closes its connection: back at the
baseline within ``WITHIN`` seconds for a watch the hub passes through, within the hub's linger
plus ``WITHIN`` for a shared one. Nothing is written to the collection meanwhile, so no upstream
byte tells watchproxy anything. (logs -f and exec need a kubelet, which kubetestenv has not:
those kinds are proven against the fake apiserver in tests/component/test_client_gone.py.)
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.component.test_client_gone import METADATA, TABLE, RawClient
from tests.harness import wait_for
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_apiserver import configmap, proxy

WITHIN = 1.0
LINGER = 0.5  # tests.harness.make_config's hub.linger_seconds
PROTOBUF_METADATA = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
)
PROTOBUF = "application/vnd.kubernetes.protobuf"


# One sample line of the gauge (its labels in any order); the text is scanned, not parsed,
# so that reading it costs little beside the second it is compared with.
_SAMPLE = re.compile(rb"^apiserver_longrunning_requests\{([^}]*)\} (\S+)$", re.MULTILINE)


async def configmap_watches(direct: Api) -> tuple[float, float]:
    """WATCHes of configmaps the apiserver is serving, by its own ``/metrics``, and when the
    answer had arrived (monotonic): the count held then, whatever parsing costs after."""
    body = (await direct.request("GET", "/metrics")).body
    arrived = time.monotonic()
    count = sum(
        float(value)
        for labels, value in _SAMPLE.findall(body)
        if b'verb="WATCH"' in labels and b'resource="configmaps"' in labels
    )
    return count, arrived


async def watches_become(direct: Api, count: float, *, within: float) -> float:
    """Poll the gauge until it reads ``count``; returns when an answer first said so."""
    deadline = time.monotonic() + within
    while True:
        seen, arrived = await configmap_watches(direct)
        if seen == count:
            return arrived
        if arrived > deadline:
            raise AssertionError(f"apiserver_longrunning_requests is {seen}, not {count}")


WATCHES = {
    # A client-go metadata informer's watch (the case): passed through, unshared.
    "metadata-protobuf": (PROTOBUF_METADATA + ", application/json", False),
    "metadata-json": (METADATA, False),
    # kubectl get -w, a protobuf client, a JSON client: served from a shared watch.
    "table": (TABLE, True),
    "protobuf": (PROTOBUF + ", application/json", True),
    "json": ("application/json", True),
}


@pytest.mark.parametrize(("accept", "shared"), WATCHES.values(), ids=WATCHES.keys())
async def test_a_watch_ends_at_the_apiserver_when_its_client_leaves(
    tmp_path: Path,
    real_apiserver: RealApiServer,
    direct: Api,
    namespace: str,
    accept: str,
    shared: bool,
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", cms, body=configmap("quiet", "x"))
    async with proxy(tmp_path, real_apiserver) as (running, _via):
        baseline, _ = await configmap_watches(direct)
        client = await RawClient.send(running.proxy.api_port, cms + "?watch=true", accept=accept)
        try:
            await client.head()
            await client.some_body()  # the initial ADDED; nothing is written after it
            await watches_become(direct, baseline + 1, within=10)
            shares = [w["key"] for w in running.proxy.debug_watches() if w["subscribers"]]
            assert bool(shares) == shared, shares
        finally:
            left_at = await client.leave()
        within = WITHIN + (LINGER if shared else 0.0)
        ended_at = await watches_become(direct, baseline, within=within + 5)
        assert ended_at - left_at <= within, f"the upstream watch ended {ended_at - left_at:.2f} s"
        await wait_for(
            lambda: not running.proxy.debug_watches(), timeout=2, what="no shared watch left"
        )


async def test_a_direct_watch_ends_at_the_apiserver_when_its_client_leaves(
    real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    """The control: what the apiserver does for a client that talks to it directly."""
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    baseline, _ = await configmap_watches(direct)
    async with direct.watch(cms + "?watch=true") as stream:
        assert stream.status == 200
        await watches_become(direct, baseline + 1, within=10)
    left_at = time.monotonic()
    ended_at = await watches_become(direct, baseline, within=10)
    assert ended_at - left_at <= WITHIN + 1, ended_at - left_at
