"""Many clients' initial syncs of one big collection at the same moment, through watchproxy as
shipped (the sidecar's and the node-local DaemonSet's configuration, with the budgets the
memory model gives their memory limit) and through ``kubectl proxy``: each proxy's peak RSS
against the limit, and how long the syncs took. Issue 43, item 5.

    .venv/bin/python -m bench.syncs [--pods 50000] [--clients 20]
                                    [--kind watch-list,list-watch]
                                    [--targets sidecar,node-local,kubectl] [--kubectl kubectl]
                                    [--json OUT]

The upstream is ``bench.coldsync``'s apiserver stand-in (its own process, ``--pods`` pods of
2.4 KB of JSON, every answer written at once). Per target and kind, a fresh proxy process; the
``--clients`` clients start together, each as an informer does:

- ``watch-list``: one watch with ``sendInitialEvents=true`` (client-go's informers from 1.35),
  synced at its ``k8s.io/initial-events-end`` bookmark;
- ``list-watch``: a LIST with ``resourceVersion=0&limit=500`` (client-go's reflector before
  1.35; served whole, as the apiserver's watch cache serves ``resourceVersion=0``), synced once
  it is read, then a WATCH from its resourceVersion, open once its head has come.

watchproxy runs with the shipped file (``deploy/components/sidecar/config.yaml``,
``deploy/overlays/node-local/config.yaml``), its upstream and ports set by flags, and the
budgets the file leaves out set to what ``watchproxy/config/memory.py`` derives from the
shipped memory limit (a process outside a container reads no limit). Node-local: its per-client
rate limit is off (the clients stand for 20 tenant pods, 20 addresses; here they share one).
RSS: the process's ``VmRSS`` before, and its ``VmHWM`` (peak) after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.coldsync import (
    PODS,
    REPO,
    first_sync,
    free_port,
    kubeconfig_for,
    ready,
    start_upstream,
)
from watchproxy.config.memory import BUDGETS, MIB, fitted

SHIPPED = {
    # target: (configuration file, the memory limit its manifests set)
    "sidecar": ("deploy/components/sidecar/config.yaml", 256 * MIB),
    "node-local": ("deploy/overlays/node-local/config.yaml", 512 * MIB),
}
_RV = re.compile(rb'"resourceVersion":"(\d+)"')
_UID = b'"uid":"uid-'  # one per pod of the stand-in (bench.coldsync.Collection)


def proc_status(pid: int) -> dict[str, int]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {
        key: int(m.group(1)) * 1024
        for key in ("VmRSS", "VmHWM")
        if (m := re.search(rf"^{key}:\s+(\d+) kB", text, re.M))
    }


def budgets_for(config_file: str, limit: int) -> dict[str, int]:
    """The four budgets watchproxy gives itself under ``limit`` with ``config_file``."""
    data = yaml.safe_load((Path(REPO) / config_file).read_text())
    configured: dict[str, int] = {}
    set_keys = set()
    for budget in BUDGETS:
        section, key = budget.key.split(".")
        value = (data.get(section) or {}).get(key)
        configured[budget.key] = int(value or 0)
        if value is not None:
            set_keys.add(budget.key)
    return fitted(limit, configured, frozenset(set_keys))


async def start_target(target: str, kubeconfig: str, kubectl: str) -> asyncio.subprocess.Process:
    port = free_port()
    if target == "kubectl":
        args = [kubectl, "proxy", f"--kubeconfig={kubeconfig}", f"--port={port}"]
    else:
        config_file, limit = SHIPPED[target]
        args = [
            sys.executable, "-m", "watchproxy", "run", "--config", config_file,
            "--kubeconfig", kubeconfig, "--listen-host", "127.0.0.1",
            "--listen-port", str(port), "--admin-host", "127.0.0.1",
            "--admin-port", str(free_port()), "--log-level", "warning",
            "--set", "upstream.mode=kubeconfig", "--set", "logging.json=false",
        ]  # fmt: skip
        for key, value in budgets_for(config_file, limit).items():
            args += ["--set", f"{key}={value}"]
        if target == "node-local":
            args += ["--set", "ratelimit.per_client_qps=0"]
    process = await asyncio.create_subprocess_exec(
        *args, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdout=asyncio.subprocess.DEVNULL
    )
    process.port = port  # type: ignore[attr-defined]
    await ready(port, process)
    return process


async def _head(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if " 200 " not in status + " ":
        raise RuntimeError(f"answered {status!r}")
    return head, headers


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]) -> Any:
    """The body's pieces, whatever its framing."""
    if "content-length" in headers:
        left = int(headers["content-length"])
        while left:
            piece = await reader.read(min(left, 1 << 20))
            if not piece:
                raise RuntimeError("the body ended early")
            left -= len(piece)
            yield piece
        return
    while size := int((await reader.readline()).split(b";")[0], 16):
        yield await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)


async def list_then_watch(port: int, pods: int) -> float:
    """Seconds until the LIST is read (the informer is synced); the WATCH from its RV is
    opened after, and must answer 200."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        ask = f"GET {PODS}?resourceVersion=0&limit=500 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        writer.write(ask.encode() + b"Accept: application/json\r\n\r\n")
        _, headers = await _head(reader)
        rv = b""
        count, tail = 0, b""
        async for piece in _body_pieces(reader, headers):
            window = tail + piece
            if not rv and (match := _RV.search(window)):
                rv = match.group(1)  # the list's own: its metadata comes before its items
            count += window.count(_UID) - tail.count(_UID)
            tail = window[-16:]
        synced = time.monotonic() - started
        if count != pods or not rv:
            raise RuntimeError(f"the LIST held {count} of {pods} pods (RV {rv!r})")
        watch = f"GET {PODS}?watch=1&resourceVersion={rv.decode()}&allowWatchBookmarks=true"
        writer.write(f"{watch} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await _head(reader)
        return synced
    finally:
        writer.close()


async def one_cell(target: str, kind: str, pods: int, clients: int, upstream_port: int,
                   kubectl: str) -> dict[str, Any]:  # fmt: skip
    process = await start_target(target, kubeconfig_for(upstream_port), kubectl)
    port = process.port  # type: ignore[attr-defined]
    try:
        before = proc_status(process.pid)["VmRSS"]
        started = time.monotonic()
        if kind == "watch-list":
            syncs = [first_sync(port, "watch-list", pods) for _ in range(clients)]
        else:
            syncs = [list_then_watch(port, pods) for _ in range(clients)]
        times = await asyncio.wait_for(asyncio.gather(*syncs), 240)
        took = time.monotonic() - started
        peak = proc_status(process.pid)["VmHWM"]
    finally:
        process.terminate()
        await process.wait()
    limit = SHIPPED[target][1] if target in SHIPPED else None
    return {
        "target": target,
        "kind": kind,
        "RSS before (MiB)": round(before / MIB, 1),
        "peak RSS (MiB)": round(peak / MIB, 1),
        "limit (MiB)": limit and limit // MIB,
        "peak / limit": limit and round(peak / limit, 2),
        "sync median (s)": round(statistics.median(times), 2),
        "sync slowest (s)": round(max(times), 2),
        "all synced (s)": round(took, 2),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    upstream = await start_upstream(args.pods)
    cells = []
    try:
        for kind in args.kind.split(","):
            for target in args.targets.split(","):
                await upstream.idle(30)
                cells.append(
                    await one_cell(target, kind, args.pods, args.clients, upstream.port,
                                   args.kubectl)
                )  # fmt: skip
                print(json.dumps(cells[-1]), file=sys.stderr, flush=True)
    finally:
        await upstream.stop()
    return {
        "pods": args.pods,
        "JSON (MB)": round(upstream.json_bytes / 1e6, 1),
        "clients": args.clients,
        "cells": cells,
        "loadavg": os.getloadavg()[0],
    }


def table(result: dict[str, Any]) -> str:
    cells = result["cells"]
    keys = list(cells[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(str(c[k]) for k in keys) + " |" for c in cells]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--kind", default="watch-list,list-watch")
    parser.add_argument("--targets", default="sidecar,node-local,kubectl")
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
