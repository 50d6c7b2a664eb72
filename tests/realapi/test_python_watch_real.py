"""The Python clients' watch loops, direct and through watchproxy, against the real apiserver.

The official client's ``watch.Watch().stream(list_namespaced_pod, ...)`` (a thread: it blocks)
and kubernetes_asyncio's ``watch.Watch()``, as their users write them, each once straight at the
apiserver and once through watchproxy, all from the same resourceVersion while pods change. Each
must print exactly the apiserver's own record of the changes (``ApiRecord``): every change once,
in order, with the apiserver's resourceVersions, up to a last pod made to end the loops.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.clients.expect import Change
from tests.harness import proxy_for_upstream
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api
from tests.realapi.test_real_clients import pod, recorded_pods

pytestmark = pytest.mark.timeout(120, func_only=True)

LAST = "last"  # the pod whose ADDED ends every watch loop
WATCH_SECONDS = 60  # the server-side bound of each watch (timeoutSeconds)


def seen(event: dict[str, Any]) -> Change:
    meta = event["object"].metadata
    return Change(event["type"], meta.name, int(meta.resource_version))


def official_watch(kubeconfig: str, namespace: str, since: int) -> list[Change]:
    from kubernetes import client, config, watch

    changes: list[Change] = []
    with config.new_client_from_config(config_file=kubeconfig) as api_client:
        api = client.CoreV1Api(api_client)
        stream = watch.Watch()
        for event in stream.stream(
            api.list_namespaced_pod,
            namespace,
            resource_version=str(since),
            timeout_seconds=WATCH_SECONDS,
        ):
            changes.append(seen(event))
            if changes[-1].name == LAST:
                stream.stop()
    return changes


async def asyncio_watch(kubeconfig: str, namespace: str, since: int) -> list[Change]:
    from kubernetes_asyncio import client, config, watch

    changes: list[Change] = []
    api_client = await config.new_client_from_config(config_file=kubeconfig)
    async with api_client:
        api = client.CoreV1Api(api_client)
        async with watch.Watch() as stream:
            async for event in stream.stream(
                api.list_namespaced_pod,
                namespace,
                resource_version=str(since),
                timeout_seconds=WATCH_SECONDS,
            ):
                changes.append(seen(event))
                if changes[-1].name == LAST:
                    stream.stop()
    return changes


async def test_python_watch_loops_see_the_record_direct_and_through_watchproxy(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    record, log, writer = await recorded_pods(direct, namespace)
    since = record.resource_version
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=real_apiserver.token
    )
    loops: dict[str, asyncio.Task[list[Change]]] = {}
    try:
        async with (
            record.recording() as recorded_up_to,
            proxy_for_upstream(tmp_path, upstream) as running,
        ):
            routes = {"direct": upstream, "proxied": running.kubeconfig}
            loops = {
                f"{client}-{route}": asyncio.create_task(
                    asyncio.to_thread(official_watch, kubeconfig, namespace, since)
                    if client == "official"
                    else asyncio_watch(kubeconfig, namespace, since)
                )
                for client in ("official", "asyncio")
                for route, kubeconfig in routes.items()
            }
            for _ in range(6):
                await writer.step()
            made = await direct.ok("POST", pods, body=pod(LAST, "end"))
            await recorded_up_to(int(made["metadata"]["resourceVersion"]))
            async with asyncio.timeout(60):
                results = {name: await loop for name, loop in loops.items()}
    finally:
        for loop in loops.values():
            loop.cancel()  # a thread's loop still ends on its own, by its timeoutSeconds
        await asyncio.gather(*loops.values(), return_exceptions=True)
        log.close()
    assert log.changes[-1].name == LAST
    assert len(log.changes) > 20
    for name, changes in results.items():
        assert changes == log.changes, f"{name}: {changes}\nthe apiserver's: {log.changes}"
