"""``watchproxy-demo``: the proxy in front of an embedded fake apiserver with churning pods.

For trying watchproxy without a cluster. It lives here, beside the fake apiserver, so that the
product package never imports the fake; it needs the ``demo`` extra (trustme) for certificates.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence

from watchproxy.cli import (
    OneLineParser,
    add_config_flags,
    install_loop,
    load_config,
    wait_for_signal,
)
from watchproxy.config import Config, ConfigError
from watchproxy.logs import setup_logging

from .faults import OUTAGE_MODES
from .outages import Outage, OutageSchedule, check_schedule, parse_outage


async def run_demo(
    config: Config,
    *,
    rate: float,
    wait: Callable[[], Awaitable[None]],
    outages: Sequence[Outage] = (),
    outage_mode: str = "refuse",
) -> None:
    from watchproxy.app import Proxy, from_kubeconfig
    from watchproxy.kube.kubeconfig import render_kubeconfig

    from .churn import Churner
    from .server import FakeApiServer

    workdir = tempfile.mkdtemp(prefix="watchproxy-demo-")
    async with FakeApiServer() as fake:
        upstream_kubeconfig = fake.write_kubeconfig(os.path.join(workdir, "upstream.kubeconfig"))
        target = from_kubeconfig(upstream_kubeconfig)
        upstream = dataclasses.replace(config.upstream, kubeconfig=upstream_kubeconfig)
        proxy = Proxy(dataclasses.replace(config, upstream=upstream), target)
        churner = Churner(fake.store, rate=rate)
        await proxy.start()
        admin = f"http://127.0.0.1:{proxy.admin_port}"
        schedule = OutageSchedule(
            fake.faults,
            outages,
            mode=outage_mode,
            say=lambda line: print(f"[demo] {line}", file=sys.stderr, flush=True),
            hint=f"see watchproxy_upstream_up and watchproxy_backoff_delay_seconds at "
            f"{admin}/metrics, the shared watches at {admin}/debug/watches; open watches stay "
            "open",
        )
        churner.start()
        schedule.start()
        client_kubeconfig = os.path.join(workdir, "kubeconfig")
        with open(client_kubeconfig, "w", encoding="utf-8") as handle:
            handle.write(
                render_kubeconfig(f"http://127.0.0.1:{proxy.api_port}", namespace="default")
            )
        print(
            "\nwatchproxy demo is running (Ctrl-C to stop).\n"
            f"  fake apiserver:  {fake.url}  ({rate:g} pod events/s)\n"
            f"  proxy API:       http://127.0.0.1:{proxy.api_port}\n"
            f"  metrics:         http://127.0.0.1:{proxy.admin_port}/metrics\n"
            f"  shared watches:  http://127.0.0.1:{proxy.admin_port}/debug/watches\n"
            f"{_describe(schedule.outages, outage_mode)}\n"
            "Try, in other terminals:\n"
            f"  export KUBECONFIG={client_kubeconfig}\n"
            "  kubectl get pods -w\n"
            "  kubectl get pods -w -l app=web\n",
            file=sys.stderr,
            flush=True,
        )
        try:
            await wait()
        finally:
            await schedule.stop()
            await churner.stop()
            await proxy.stop()


def _describe(outages: Sequence[Outage], mode: str) -> str:
    if not outages:
        return ""
    when = ", ".join(f"{o.duration:g}s at {o.start:g}s" for o in outages)
    return f"  outages ({mode}):  {when} after start\n"


def positive_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (rate > 0 and math.isfinite(rate)):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (events per second), got {text}")
    return rate


def parser() -> argparse.ArgumentParser:
    top = OneLineParser(
        prog="watchproxy-demo",
        description="watchproxy in front of an embedded fake apiserver with churning pods.",
    )
    add_config_flags(top)
    top.add_argument("--rate", type=positive_rate, default=5.0, help="pod events per second")
    top.add_argument(
        "--outage",
        type=outage_arg,
        action="append",
        default=[],
        metavar="DURATION@START",
        help="make the apiserver unreachable for DURATION, START after the demo starts "
        "(e.g. 30s@60s; repeatable)",
    )
    top.add_argument(
        "--outage-mode",
        choices=OUTAGE_MODES,
        default="refuse",
        help="how the apiserver is unreachable: refused connections (default), reset "
        "connections, or 503 answers",
    )
    return top


def outage_arg(text: str) -> Outage:
    try:
        return parse_outage(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    command = parser()
    args = command.parse_args(argv)
    try:
        outages = check_schedule(args.outage)
    except ValueError as error:
        command.error(f"argument --outage: {error}")
    try:
        import trustme  # noqa: F401  (the fake's certificates; only the demo extra has it)
    except ImportError:
        print(
            "watchproxy-demo: the demo needs its extra: pip install 'watchproxy[demo]'",
            file=sys.stderr,
        )
        return 2
    try:
        config = load_config(args, dict(os.environ))
    except ConfigError as error:
        print(f"watchproxy-demo: {error}", file=sys.stderr)
        return 2
    setup_logging(config.logging.level, as_json=config.logging.json)
    install_loop()
    asyncio.run(
        run_demo(
            config,
            rate=args.rate,
            wait=wait_for_signal,
            outages=outages,
            outage_mode=args.outage_mode,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
