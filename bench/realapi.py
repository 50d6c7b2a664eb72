"""Role: kube-apiserver + etcd (kubetestenv) and the generator: ``bench.fanout --upstream real``.

``python -m bench.realapi --dir DIR [--objects K] [--object-bytes B]`` speaks ``bench.fake``'s
line protocol (``state``, ``poke``, ``gen E R``) against kube-apiserver + etcd instead of the
Python fake, which cannot feed 500 direct or ``kubectl proxy`` watches at 100 events/s: the
apiserver's watch cache can. Configmaps keep the watch cache here (the test tier turns it off
for them). The generator PATCHes one configmap per event, stamped like ``bench.fake``'s.

The apiserver writes on its own too (its identity lease every 10 s): RVs of one cell are not
consecutive, so subscribers check counts and order (``--by-count``), not RV arithmetic.
Needs ``tests/realapi/bin/kubetestenv`` (``bash tests/realapi/build.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.roles import NAMESPACE, RESOURCE, STAMP_KEY, emit, generate, run, serve_commands
from tests.realapi.fixture import RealApiServer, start_kubetestenv

CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/{RESOURCE}"


class RealGenerator:
    def __init__(self, server: RealApiServer, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session
        self.ssl = ssl.create_default_context(cafile=server.ca_file)
        self.headers = {"Authorization": f"Bearer {server.token}"}
        self.names: list[str] = []
        self.seq = 0
        self.own_watches = 0  # the apiserver's own configmap informers, not the bench's

    async def _call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        async with self.session.request(
            method,
            self.server.url + path,
            json=body,
            headers={**self.headers, **headers},
            ssl=self.ssl,
        ) as response:
            text = await response.text()
            if response.status >= 300:
                raise RuntimeError(f"{method} {path}: {response.status} {text[:300]}")
            return json.loads(text)

    async def create(self, objects: int, object_bytes: int) -> None:
        payload = "x" * max(0, object_bytes - 300)
        for i in range(objects):
            name = f"bench-{i}"
            body = {
                "metadata": {"name": name, "labels": {"app": "bench"}},
                "data": {"seq": "0", "payload": payload},
            }
            await self._call("POST", CONFIGMAPS, body)
            self.names.append(name)

    async def write_one(self) -> int:
        self.seq += 1
        name = self.names[self.seq % len(self.names)]
        patch = {
            "metadata": {"annotations": {STAMP_KEY: str(time.time_ns())}},
            "data": {"seq": str(self.seq)},
        }
        written = await self._call(
            "PATCH",
            f"{CONFIGMAPS}/{name}",
            patch,
            **{"Content-Type": "application/merge-patch+json"},
        )
        return int(written["metadata"]["resourceVersion"])

    async def state(self) -> dict[str, Any]:
        listed = await self._call("GET", CONFIGMAPS + "?limit=1")
        async with self.session.get(
            self.server.url + "/metrics", headers=self.headers, ssl=self.ssl
        ) as response:
            metrics = await response.text()
        watches = 0
        for line in metrics.splitlines():
            if (
                line.startswith("apiserver_longrunning_requests{")
                and 'resource="configmaps"' in line
                and 'verb="WATCH"' in line
            ):
                watches += int(float(line.rsplit(" ", 1)[1]))
        rv = int(listed["metadata"]["resourceVersion"])
        return {"rv": rv, "watches": watches - self.own_watches}

    async def generate(self, events: int, rate: float) -> dict[str, Any]:
        return await generate(self.write_one, events, rate)


async def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.realapi")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--objects", type=int, default=50)
    parser.add_argument("--object-bytes", type=int, default=1024)
    args = parser.parse_args()
    state_dir = Path(tempfile.mkdtemp(prefix="kubetestenv-", dir=args.dir))
    # The watch cache on for configmaps, as in a real cluster (the last -apiserver-args wins).
    server = await asyncio.to_thread(
        start_kubetestenv,
        state_dir,
        extra=("-apiserver-args", "--watch-cache-sizes=configmaps#1000"),
    )
    try:
        async with aiohttp.ClientSession() as session:
            generator = RealGenerator(server, session)
            await generator.create(args.objects, args.object_bytes)
            generator.own_watches = (await generator.state())["watches"]
            upstream = server.write_kubeconfig(
                state_dir / "upstream.kubeconfig", token=server.token
            )
            state = await generator.state()
            emit(
                {
                    "url": server.url,
                    "ca": server.ca_file,
                    "token": server.token,
                    "kubeconfig": upstream,
                    "rv": state["rv"],
                    "pid": server.process.pid,
                }
            )

            async def handle(words: list[str]) -> dict[str, Any] | None:
                if words[0] == "state":
                    return await generator.state()
                if words[0] == "poke":
                    await generator.write_one()
                    return None
                if words[0] == "gen":
                    return await generator.generate(int(words[1]), float(words[2]))
                return {"error": f"unknown command {words[0]!r}"}

            await serve_commands(handle)
    finally:
        await asyncio.to_thread(server.stop)


if __name__ == "__main__":
    run(main)
