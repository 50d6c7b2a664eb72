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
from watchproxy.kube.credentials import from_kubeconfig
from watchproxy.logs import setup_logging


async def run_demo(config: Config, *, rate: float, wait: Callable[[], Awaitable[None]]) -> None:
    from watchproxy.app import Proxy
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
        churner.start()
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
            f"  shared watches:  http://127.0.0.1:{proxy.admin_port}/debug/watches\n\n"
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
            await churner.stop()
            await proxy.stop()


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
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
    asyncio.run(run_demo(config, rate=args.rate, wait=wait_for_signal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
