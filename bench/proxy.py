"""Role: watchproxy itself, in front of the fake apiserver, on uvloop as ``watchproxy run`` is.

``python -m bench.proxy --kubeconfig PATH [--max-lag N] [--set KEY=VALUE] [--profile OUT.prof]
[--loop L]``
prints ``{"port", "admin_port"}`` once the proxy reaches its upstream, and runs until ``quit``
or end of stdin. ``--profile`` runs the whole process under cProfile and writes the stats on exit;
the commands ``profile start`` and ``profile stop OUT.prof`` profile one phase of a run, timed in
CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import time

from bench.roles import emit, install_uvloop, serve_commands
from watchproxy.app import Proxy, from_kubeconfig
from watchproxy.config import build_config
from watchproxy.logs import setup_logging


async def main(args: argparse.Namespace) -> None:
    config = build_config(
        {
            "listen": {"port": 0},
            "admin": {"host": "127.0.0.1", "port": 0},
            "logging": {"level": "warning"},
            # The benchmark measures fan-out, not the slow-client policy: a backlog of a whole
            # burst must not end a subscriber. linger short so every cell starts cold.
            "hub": {
                "linger_seconds": 0.2,
                "max_subscriber_lag": args.max_lag,
                "history_size": max(10_000, args.max_lag),
            },
            "limits": {"max_watches": 5000, "max_connections": 5000},
        },
        file_name="bench",
        overrides=dict(setting.split("=", 1) for setting in args.set),
    )
    setup_logging(config.logging.level, as_json=False)
    proxy = Proxy(config, from_kubeconfig(args.kubeconfig))
    await proxy.start()
    try:
        deadline = time.monotonic() + 30
        while not proxy.connectivity.up:
            if time.monotonic() > deadline:
                raise SystemExit("bench.proxy: the proxy never reached the fake apiserver")
            await asyncio.sleep(0.05)
        emit({"port": proxy.api_port, "admin_port": proxy.admin_port})

        profiler: cProfile.Profile | None = None

        async def handle(words: list[str]) -> dict[str, object]:
            # ``profile start`` / ``profile stop OUT.prof``: one phase of a run under cProfile
            # (bench.gzip_watchers counts the compressions of its event phase alone).
            nonlocal profiler
            if words[:2] == ["profile", "start"]:
                # Timed in this thread's CPU time, not wall time: on a busy machine the process
                # is descheduled mid-call, and wall time would charge that to the call.
                profiler = cProfile.Profile(time.thread_time)
                profiler.enable()
                return {"profiling": True}
            if words[:2] == ["profile", "stop"] and len(words) == 3 and profiler is not None:
                profiler.disable()
                profiler.dump_stats(words[2])
                profiler = None
                return {"profiling": False}
            return {"error": f"unknown command {words[0]!r}"}

        await serve_commands(handle)
    finally:
        await proxy.stop()


def cli() -> None:
    parser = argparse.ArgumentParser(prog="bench.proxy")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--max-lag", type=int, default=200_000)
    parser.add_argument(
        "--set", action="append", default=[], help="config key, e.g. hub.fanout_cpu_share=0.2"
    )
    parser.add_argument("--profile", default="")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    if args.loop == "uvloop":
        install_uvloop()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    try:
        asyncio.run(main(args))
    except KeyboardInterrupt:  # pragma: no cover
        pass
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)


if __name__ == "__main__":
    cli()
