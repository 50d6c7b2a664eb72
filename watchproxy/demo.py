"""``watchproxy demo``: the proxy in front of an embedded fake apiserver with churning pods.

For trying watchproxy without a cluster. The fake apiserver (TLS, bearer token) lives in
``watchproxy.fakeapi``; it needs the ``demo`` extra (trustme) for its certificates.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable

from watchproxy.config import Config
from watchproxy.credentials import from_kubeconfig


async def run_demo(config: Config, *, rate: float, wait: Callable[[], Awaitable[None]]) -> None:
    from watchproxy.app import Proxy
    from watchproxy.fakeapi import Churner, FakeApiServer
    from watchproxy.kubeconfig import render_kubeconfig

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
