"""kube-rs with its gzip feature on and off, direct and through watchproxy, against the real
apiserver: each sees what the apiserver recorded, and so what it sees direct.

kube's ``gzip`` feature (on in ``kubewatch``) sends ``Accept-Encoding: gzip`` with its LISTs,
which the apiserver compresses above 128 KiB; on its watches kube 5.0 sends
``Accept-Encoding: identity`` whatever the feature (its answer to 1.37's gzip watch-lists of one
member per flush, which its decoder stopped reading after the first). ``--gzip off`` sets the
kubeconfig's ``disable-compression``, as a build without the feature has it: no
``Accept-Encoding`` at all. Each kube-rs watcher starts with a watch-list (``--initial-list
streaming``) or with a LIST in pages of 500 and a WATCH, on a namespace of a few hundred pods (a
LIST above the compression threshold), then follows changes; every event on the way and its
store at the end must be the apiserver's own record (``ApiRecord``), direct and through the hub
alike.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.clients.build_rust_node import build_kubewatch
from tests.clients.expect import check_kubers, kubers_state
from tests.clients.process import ClientProcess, Line
from tests.harness import proxy_for_upstream
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_clients import built, pod, recorded_pods

pytestmark = pytest.mark.timeout(120, func_only=True)

BULK_PODS = 300  # initial objects: their LIST is compressed (over 128 KiB)
CREATORS = 10  # pods created at once


def init_done(lines: list[Line]) -> bool:
    return any(line["type"] == "InitDone" for line in lines)


async def bulk_pods(api: Api, namespace: str, count: int) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"

    async def create(first: int) -> None:
        for index in range(first, count, CREATORS):
            await api.ok("POST", path, body=pod(f"bulk-{index}", "bulk"))

    await asyncio.gather(*(create(first) for first in range(CREATORS)))


@pytest.mark.parametrize("gzip", ["on", "off"])
async def test_kubers_sees_the_record_direct_and_through_watchproxy(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str, gzip: str
) -> None:
    kubewatch = str(built(build_kubewatch))
    record, log, writer = await recorded_pods(direct, namespace)
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=real_apiserver.token
    )
    clients: list[ClientProcess] = []
    try:
        async with (
            record.recording() as recorded_up_to,
            proxy_for_upstream(tmp_path, upstream) as running,
        ):
            await bulk_pods(direct, namespace, BULK_PODS)
            for _ in range(3):
                await writer.step()
            for route, kubeconfig in (("direct", upstream), ("proxied", running.kubeconfig)):
                for initial in ("streaming", "list"):
                    client = ClientProcess(
                        f"kube-rs-{route}-{initial}-gzip-{gzip}",
                        [kubewatch, "--backoff", "default", "--namespace", namespace,
                         "--initial-list", initial, "--gzip", gzip],
                        env={**os.environ, "KUBECONFIG": kubeconfig},
                        log_path=tmp_path / f"{route}-{initial}.stderr",
                    )  # fmt: skip
                    await client.start()
                    clients.append(client)
            for client in clients:
                await client.wait_until(init_done, what="its initial list", timeout=30)
            for _ in range(5):
                await writer.step()
            await recorded_up_to(writer.last_rv)
            final = log.state_at(writer.last_rv)
            assert len(final) >= BULK_PODS
            for client in clients:
                await client.wait_until(
                    lambda ls: kubers_state(ls) == final,
                    what="the apiserver's final state",
                    timeout=30,
                )
    finally:
        for client in clients:
            await client.stop()
        log.close()
    report = [
        client.report(problems)
        for client in clients
        if (problems := check_kubers(client.lines, log))
    ]
    assert not report, "\n".join(report)
