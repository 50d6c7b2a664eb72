"""pywatch: the Python clients' watch loops on pods, every event printed as one JSON line.

A test program for watchproxy (tests/realapi/test_delivery_parity.py). It runs the loop each
library's users write, with the library's defaults (KUBECONFIG, no resourceVersion: the server
sends the current pods as ADDED, then every change; no timeout: the library re-watches by
itself when a stream ends):

    python tests/clients/pywatch.py --library official|asyncio --namespace NS [--resource R]

``official`` is the ``kubernetes`` package's ``watch.Watch().stream(list_namespaced_pod, ...)``
(urllib3), ``asyncio`` is kubernetes_asyncio's (aiohttp); ``--resource configmaps`` watches
with ``list_namespaced_config_map`` instead (tests/realnode runs it in a pod). Output, one line
per event, written with one write(2) as soon as the library hands the event over, stamped with
the wall-clock time of that moment in nanoseconds (``at``), in the line format of
tests/clients/go's watchclient:

    {"type":"ADDED","namespace":"ns","name":"p1","resourceVersion":"12","at":1765...}
    {"type":"ERROR","error":"..."}

It runs until SIGTERM (the default action: nothing to clean up) and imports nothing of the
project, so that it starts like any user's script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any


def emit(line: dict[str, Any]) -> None:
    # One write(2) per line, no buffer in between: the reader sees the line at once.
    os.write(1, (json.dumps(line) + "\n").encode())


def event_line(event: dict[str, Any]) -> dict[str, Any]:
    at = time.time_ns()
    obj = event["object"]
    if event["type"] == "ERROR":
        return {"type": "ERROR", "error": str(obj), "at": at}
    meta = obj.metadata
    return {
        "type": event["type"],
        "namespace": meta.namespace,
        "name": meta.name,
        "resourceVersion": meta.resource_version,
        "at": at,
    }


LISTS = {"pods": "list_namespaced_pod", "configmaps": "list_namespaced_config_map"}


def official(namespace: str, resource: str) -> None:
    from kubernetes import client, config, watch

    config.load_kube_config()
    api = client.CoreV1Api()
    for event in watch.Watch().stream(getattr(api, LISTS[resource]), namespace):
        emit(event_line(event))


async def with_asyncio(namespace: str, resource: str) -> None:
    from kubernetes_asyncio import client, config, watch

    await config.load_kube_config()
    async with client.ApiClient() as api_client:
        api = client.CoreV1Api(api_client)
        async for event in watch.Watch().stream(getattr(api, LISTS[resource]), namespace):
            emit(event_line(event))


def main() -> int:
    parser = argparse.ArgumentParser(prog="pywatch")
    parser.add_argument("--library", choices=("official", "asyncio"), required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--resource", choices=tuple(LISTS), default="pods")
    args = parser.parse_args()
    if args.library == "official":
        official(args.namespace, args.resource)
    else:
        asyncio.run(with_asyncio(args.namespace, args.resource))
    return 0


if __name__ == "__main__":
    sys.exit(main())
