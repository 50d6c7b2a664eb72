"""``watchproxy-demo`` (``scripts/demo.sh``, ``python -m kubefake.demo``): the proxy in front of
an embedded fake apiserver with churning pods.

For trying watchproxy without a cluster. It lives here, beside the fake apiserver, so that the
product package never imports the fake; it needs the ``demo`` extra (trustme) for certificates.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from watchproxy.cli import (
    OneLineParser,
    add_config_flags,
    config_path,
    flag_overrides,
    install_loop,
    stop_event,
)
from watchproxy.config import Config, ConfigError, build_config, load_file
from watchproxy.logs import setup_logging

from .faults import OUTAGE_MODES
from .outages import Outage, OutageSchedule, check_schedule, parse_outage


async def run_demo(
    config: Config,
    *,
    rate: float,
    outages: Sequence[Outage] = (),
    outage_mode: str = "refuse",
) -> None:
    stop = stop_event()
    # Removed on every way out: Ctrl-C, SIGTERM, a port already in use.
    with tempfile.TemporaryDirectory(prefix="watchproxy-demo-") as workdir:
        await _serve(config, workdir, rate=rate, wait=stop.wait, outages=outages, mode=outage_mode)


async def _serve(
    config: Config,
    workdir: str,
    *,
    rate: float,
    wait: Callable[[], Awaitable[bool]],
    outages: Sequence[Outage],
    mode: str,
) -> None:
    from watchproxy.app import Proxy, from_kubeconfig
    from watchproxy.kube.kubeconfig import render_kubeconfig

    from .churn import Churner
    from .server import FakeApiServer

    outage_mode = mode
    async with FakeApiServer() as fake:
        upstream_kubeconfig = fake.write_kubeconfig(os.path.join(workdir, "upstream.kubeconfig"))
        target = from_kubeconfig(upstream_kubeconfig)
        upstream = dataclasses.replace(config.upstream, kubeconfig=upstream_kubeconfig)
        proxy = Proxy(dataclasses.replace(config, upstream=upstream), target)
        churner = Churner(fake.store, rate=rate)
        try:
            await proxy.start()
        except BaseException:
            # As `watchproxy run` does: main() reports the cause in one line, so the stop of
            # what had started is not logged.
            logging.getLogger("watchproxy").setLevel(logging.WARNING)
            await proxy.stop()
            raise
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
            "watchproxy-demo: the demo needs trustme (scripts/demo.sh installs it: "
            "pip install -e '.[demo]' in a checkout)",
            file=sys.stderr,
        )
        return 2
    try:
        config = demo_config(args, dict(os.environ))
    except ConfigError as error:
        print(f"watchproxy-demo: {error}", file=sys.stderr)
        return 2
    setup_logging(config.logging.level, as_json=config.logging.json)
    install_loop()
    try:
        asyncio.run(
            run_demo(
                config,
                rate=args.rate,
                outages=outages,
                outage_mode=args.outage_mode,
            )
        )
    except OSError as error:
        # A port already in use, most often: Proxy.start names the address.
        hint = " (--listen-port/--admin-port choose others, 0 any free one)"
        print(f"watchproxy-demo: {error.strerror or error}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C before the signal handlers were in place; the temporary directory is gone.
        return 130
    return 0


def demo_config(args: argparse.Namespace, env: dict[str, str]) -> Config:
    """The config as ``watchproxy run`` builds it, except that the admin port listens on
    loopback unless the file, the environment or a flag says otherwise: a demo on a laptop
    should not offer its metrics and debug view to the network."""
    path = config_path(args, env)
    data: dict[str, Any] = dict(load_file(path)) if path else {}
    admin = data.get("admin")
    if admin is None or isinstance(admin, dict):  # anything else: build_config names it
        data["admin"] = {"host": "127.0.0.1", **(admin or {})}
    return build_config(data, file_name=path or "config", env=env, overrides=flag_overrides(args))


if __name__ == "__main__":
    sys.exit(main())
