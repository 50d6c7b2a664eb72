"""The shared watch's initial LIST with and without gzip: bytes on the wire against CPU.

Against a real kube-apiserver + etcd (``tests/realapi/bin/kubetestenv-<minor>``, the version
``KUBETESTENV_VERSION`` names, default the newest), N pods of about 2.3 KB of JSON each are
created, then the same LIST is read alternately with ``Accept-Encoding: identity`` and ``gzip``
(the apiserver compresses a LIST over 128 KiB): what came over the wire, the apiserver's CPU
for it, the reader's CPU to read it, to gunzip it (zlib, as the hub's ``GzipMembers``) and to
parse the JSON (the hub parses it either way).

    python -m bench.gzip_list --pods 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.realapi.fixture import RealApiServer, start_kubetestenv


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pod(i: int) -> dict[str, Any]:
    env = [{"name": f"E{j}", "value": f"value-{i}-{j}"} for j in range(8)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i}", "labels": {"app": "web", "i": str(i)}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1", "env": env}]},
    }


async def measure(real: RealApiServer, pods: int, rounds: int) -> None:
    ssl = real.ssl_context()
    auth = real.auth()
    collection = f"{real.url}/api/v1/namespaces/bench/pods"
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        namespace = {"metadata": {"name": "bench"}}
        await session.post(f"{real.url}/api/v1/namespaces", json=namespace, headers=auth, ssl=ssl)
        gate = asyncio.Semaphore(8)

        async def make(i: int) -> None:
            async with (
                gate,
                session.post(collection, json=pod(i), headers=auth, ssl=ssl) as response,
            ):
                if response.status != 201:
                    raise RuntimeError(await response.text())

        started = time.monotonic()
        await asyncio.gather(*(make(i) for i in range(pods)))
        print(f"created {pods} pods in {time.monotonic() - started:.1f} s")
        for encoding in ("identity", "gzip") * rounds:
            headers = {**auth, "Accept": "application/json", "Accept-Encoding": encoding}
            apiserver = process_cpu(real.process.pid)
            cpu = time.process_time()
            async with session.get(collection, headers=headers, ssl=ssl) as response:
                raw = await response.read()
                encoded = response.headers.get("Content-Encoding", "identity")
            read_cpu = time.process_time() - cpu
            apiserver = process_cpu(real.process.pid) - apiserver
            cpu = time.process_time()
            body = raw
            if encoded == "gzip":
                body = gzip.decompress(raw)  # zlib, as the hub's GzipMembers
            gunzip_cpu = time.process_time() - cpu
            cpu = time.process_time()
            items = len(json.loads(body)["items"])
            parse_cpu = time.process_time() - cpu
            print(
                f"asked {encoding:8} got {encoded:8} wire {len(raw) / 1e6:7.2f} MB"
                f" json {len(body) / 1e6:7.2f} MB items {items}"
                f" apiserver CPU {apiserver:.2f} s, reader CPU: read {read_cpu:.3f} s"
                f" gunzip {gunzip_cpu:.3f} s parse {parse_cpu:.3f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gzip-list-") as workdir:
        real = start_kubetestenv(Path(workdir) / "api")
        try:
            asyncio.run(measure(real, args.pods, args.rounds))
        finally:
            real.stop()


if __name__ == "__main__":
    main()
