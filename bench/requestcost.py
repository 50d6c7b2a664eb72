"""What one proxied request costs watchproxy: CPU, and the Python calls it makes.

    .venv/bin/python -m bench.requestcost [--workers 1,8] [--seconds 5] [--profile] [--top 25]

The controller mix of ``bench/gocontroller`` (GET, merge-PATCH, LIST limit=5, LIST in pages,
CREATE, DELETE; one keep-alive connection per worker) runs against watchproxy, which runs in
this process on uvloop in front of the fake apiserver (TLS, a token) in a process of its own.
Printed per worker count: requests per second, p50/p99, and this process's CPU per request.

``--profile`` runs the proxy under cProfile and prints the Python calls per request, by module:
a count, unlike a time, is the same on a busy machine and a quiet one, so it shows whether a
change made the per-request path shorter (the CPU figures of the same run are inflated by the
profiler). For the real apiserver and kubectl proxy side by side, use ``bench.controller``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

from bench.gobuild import go_binary
from bench.roles import install_uvloop
from tests.harness import proxy_for_upstream

FAKE = """
import asyncio, sys
from kubefake import FakeApiServer
from bench.roles import install_uvloop

async def main():
    fake = FakeApiServer(tls=True)
    await fake.start()
    fake.store.create("configmaps", "default", {"metadata": {"name": "bench-shared"}, "data": {}})
    fake.write_kubeconfig(sys.argv[1])
    print("ready", flush=True)
    await asyncio.Event().wait()

install_uvloop()
asyncio.run(main())
"""


def calls_by_module(stats: pstats.Stats) -> tuple[int, collections.Counter[str]]:
    by_module: collections.Counter[str] = collections.Counter()
    total = 0
    for (file, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        calls = row[1]
        module = file.split("site-packages/")[-1].split(os.getcwd() + "/")[-1]
        by_module[function if module == "~" else module] += calls
        total += calls
    return total, by_module


async def one_run(kubeconfig: str, workers: int, seconds: float, profile: bool) -> dict[str, Any]:
    async with proxy_for_upstream(tempfile.mkdtemp(), kubeconfig) as running:
        url = f"http://127.0.0.1:{running.proxy.api_port}"
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        cpu_before = time.process_time()
        load = await asyncio.create_subprocess_exec(
            str(go_binary("gocontroller")),
            "-url", url, "-workers", str(workers), "-seconds", str(seconds),
            stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = await load.communicate()
        cpu = time.process_time() - cpu_before
        if profiler is not None:
            profiler.disable()
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        result["cpu_us_per_request"] = cpu / result["requests"] * 1e6
        if profiler is not None:
            result["stats"] = pstats.Stats(profiler)
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,8", help="comma-separated worker counts")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--profile", action="store_true", help="count Python calls per request")
    parser.add_argument("--top", type=int, default=25, help="modules listed with --profile")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="watchproxy-requestcost-")
    kubeconfig = os.path.join(workdir, "upstream.kubeconfig")
    fake = subprocess.Popen(
        [sys.executable, "-c", FAKE, kubeconfig], stdout=subprocess.PIPE, cwd=os.getcwd()
    )
    try:
        assert fake.stdout is not None
        if not fake.stdout.readline().startswith(b"ready"):
            raise SystemExit("bench.requestcost: the fake apiserver did not start")
        with open(kubeconfig, encoding="utf-8") as handle:
            yaml.safe_load(handle)  # written whole before "ready"
        install_uvloop()
        for workers in (int(n) for n in args.workers.split(",")):
            result = asyncio.run(one_run(kubeconfig, workers, args.seconds, args.profile))
            print(
                f"N={workers}: {result['per_second']:.0f} req/s ({result['requests']} requests), "
                f"p50 {result['p50_ms']:.2f} ms, "
                f"p99 {result['p99_ms']:.2f} ms, errors {result['errors']}, proxy CPU "
                f"{result['cpu_us_per_request']:.0f} us per request"
                + (" (under cProfile)" if args.profile else "")
            )
            if args.profile:
                total, by_module = calls_by_module(result["stats"])
                print(f"  Python calls per request: {total / result['requests']:.0f}")
                for module, calls in by_module.most_common(args.top):
                    print(f"  {calls / result['requests']:7.1f}  {module}")
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
