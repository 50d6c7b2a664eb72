"""Fan-out benchmark: watchproxy vs direct watches vs a raw broadcast ceiling, in one run.

    .venv/bin/python -m bench.fanout [--subscribers 1,10,100,500] [--events N] [--rate R]
                                     [--phases paced,max] [--json out.json] [--quick]

Four kinds of OS process, each with its own uvloop event loop (see bench/README.md):
``bench.fake`` (fake apiserver + generator), ``bench.proxy`` (watchproxy),
``bench.ceiling`` (raw broadcast), and the N clients: ``bench/gosub`` (Go, the default) or
``bench.subscribers`` (Python, ``--sub-impl python``), one process per cell or ``--sub-procs``
of them. For every phase, subscriber count and mode (direct, proxy,
ceiling) one *cell* runs: the clients connect at the store's current RV, the generator writes
``--events`` stamped modifications (paced at ``--rate``/s, or as fast as it can in ``max``),
the clients drain, and the cell reports throughput, latency percentiles and any loss.

Exit status 1 if any client lost, repeated or reordered an event, or could not connect.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gobuild import go_binary

MODES = ("direct", "proxy", "pacing", "baseline", "kubectl", "ceiling")
# "pacing" is a second watchproxy with fan-out pacing on (docs/architecture.md), beside "proxy"
# with the defaults (every event written as it comes), to show the trade side by side.
PACING_SETTINGS = ("hub.fanout_max_delay_seconds=0.025", "hub.fanout_cpu_share=0.1")
WATCHPROXY_MODES = {
    "proxy": "watchproxy",
    "pacing": "watchproxy with pacing",
    "baseline": "watchproxy at --baseline",
}
# "baseline" is watchproxy as it was at a git ref (--baseline), from a worktree of this
# repository, so that a change is measured against what it changes in the same rounds.
ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


class RoleError(RuntimeError):
    pass


class Child:
    """One role process: commands on its stdin, JSON replies on its stdout, stderr to a file."""

    def __init__(self, name: str, workdir: str) -> None:
        self.name = name
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.process: asyncio.subprocess.Process | None = None
        self.cpu_pid: int | None = None  # whose CPU to read, when not the role process's own

    async def start(
        self, module: str, *args: str, timeout: float = 60.0, cwd: str | None = None
    ) -> dict[str, Any]:
        argv = (sys.executable, "-m", module, *args)
        return await self.start_program(*argv, timeout=timeout, cwd=cwd)

    async def start_program(
        self,
        *argv: str,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> dict[str, Any]:
        # cwd: ``python -m`` imports from it first (the baseline's worktree).
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=None if env is None else {**os.environ, **env},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=1 << 20,
            )
        return await self.reply(timeout)

    async def reply(self, timeout: float) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            raise RoleError(f"{self.name}: no answer within {timeout:.0f}s{self._tail()}") from None
        if not line:
            raise RoleError(f"{self.name}: exited{self._tail()}")
        message: dict[str, Any] = json.loads(line)
        if "error" in message:
            raise RoleError(f"{self.name}: {message['error']}{self._tail()}")
        return message

    async def ask(self, command: str, timeout: float = 30.0) -> dict[str, Any]:
        self.send(command)
        return await self.reply(timeout)

    def send(self, command: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")

    def cpu_seconds(self) -> float:
        """User + system CPU time so far (Linux /proc; 0 elsewhere)."""
        if self.process is None:
            return 0.0
        pid = self.cpu_pid or self.process.pid
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def _tail(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                tail = handle.read()[-2000:]
        except OSError:
            return ""
        return f"\n--- {self.log_path} (tail) ---\n{tail}" if tail.strip() else ""

    async def stop(self, timeout: float = 10.0) -> None:
        """Ask politely (quit, then end of stdin), then kill. Never leaves the process behind."""
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        try:
            if process.stdin is not None:
                process.stdin.write(b"quit\n")
                process.stdin.close()
            await asyncio.wait_for(process.wait(), timeout)
        except (TimeoutError, ConnectionError, BrokenPipeError):
            if process.returncode is None:
                process.kill()
                await process.wait()


@dataclass
class Cell:
    phase: str
    subscribers: int
    mode: str
    events: int
    rate: float
    upstream_watches: int = 0
    connect_failures: int = 0
    delivered: int = 0
    lost: int = 0
    reordered: int = 0
    bad_lines: int = 0
    incomplete_streams: int = 0
    seconds: float = 0.0
    events_per_s: float = 0.0
    events_per_s_per_sub: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    generator_late_ms: float = 0.0
    round: int = 0  # which of --repeat's rounds (their modes interleave, so drift hits all)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def faults(self) -> int:
        return (
            self.connect_failures
            + self.lost
            + self.reordered
            + self.bad_lines
            + self.incomplete_streams
        )


def percentile(ordered: list[int], p: float) -> int:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        return 0
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def set_flags(settings: Sequence[str]) -> list[str]:
    """``KEY=VALUE`` settings as bench.proxy's ``--set`` flags."""
    return [word for setting in settings for word in ("--set", setting)]


async def _git(*args: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "git", "-C", str(ROOT), *args, stdout=asyncio.subprocess.DEVNULL
    )
    if await process.wait() != 0:
        raise RoleError(f"git {' '.join(args)} failed")


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: str) -> None:
        self.args = args
        self.workdir = workdir
        self.fake = Child("fake", workdir)
        self.proxy = Child("proxy", workdir)
        self.ceiling = Child("ceiling", workdir)
        self.kubectl = Child("kubectl", workdir)
        self.pacing = Child("pacing", workdir)
        self.baseline = Child("baseline", workdir)
        self.baseline_tree = ""  # the --baseline worktree, removed at stop
        self.relay = Child("relay", workdir)  # kubectl proxy's upstream with --kubectl-via-relay
        self.fake_info: dict[str, Any] = {}
        self.urls: dict[str, str] = {}
        self.cell_no = 0
        self.gosub: Path | None = None  # the Go subscribers' binary (--sub-impl go)

    async def start(self) -> None:
        a = self.args
        if a.sub_impl == "go":
            self.gosub = await asyncio.to_thread(go_binary, "gosub")
        fake_args = ["--dir", self.workdir, "--objects", str(a.objects)]
        fake_args += ["--object-bytes", str(a.object_bytes)]
        if a.no_tls:
            fake_args.append("--no-tls")
        if a.upstream == "real":
            fake_args = ["--dir", self.workdir, "--objects", str(a.objects)]
            fake_args += ["--object-bytes", str(a.object_bytes)]
            self.fake_info = await self.fake.start("bench.realapi", *fake_args, timeout=150)
            self.fake.cpu_pid = self.fake_info["pid"]  # kube-apiserver's side (kubetestenv)
        else:
            self.fake_info = await self.fake.start("bench.fake", *fake_args)
        proxy_args = ["--kubeconfig", self.fake_info["kubeconfig"]]
        own_args = set_flags(a.proxy_set)
        if a.profile_proxy:
            own_args += ["--profile", a.profile_proxy]
        ceiling_args = ["--upstream", self.fake_info["url"], "--token", self.fake_info["token"]]
        if not a.no_tls:
            ceiling_args += ["--ca", self.fake_info["ca"]]
        proxy_info, ceiling_info = await asyncio.gather(
            self.proxy.start("bench.proxy", *proxy_args, *own_args),
            self.ceiling.start("bench.ceiling", *ceiling_args),
        )
        path = "/api/v1/namespaces/default/configmaps"
        self.urls = {
            "direct": self.fake_info["url"] + path,
            "proxy": f"http://127.0.0.1:{proxy_info['port']}{path}",
            "ceiling": f"http://127.0.0.1:{ceiling_info['port']}{path}",
        }
        if "pacing" in a.modes:
            settings = set_flags(PACING_SETTINGS)
            pacing_info = await self.pacing.start("bench.proxy", *proxy_args, *settings)
            self.urls["pacing"] = f"http://127.0.0.1:{pacing_info['port']}{path}"
        if "baseline" in a.modes:
            self.baseline_tree = os.path.join(self.workdir, "baseline")
            await _git("worktree", "add", "--detach", self.baseline_tree, a.baseline)
            info = await self.baseline.start("bench.proxy", *proxy_args, cwd=self.baseline_tree)
            self.urls["baseline"] = f"http://127.0.0.1:{info['port']}{path}"
        if "kubectl" in a.modes:
            kubeconfig = self.fake_info["kubeconfig"]
            if a.kubectl_via_relay:
                kubeconfig = await self._start_relay()
            kubectl_args = ["--kubeconfig", kubeconfig]
            kubectl_info = await self.kubectl.start("bench.kubectlproxy", *kubectl_args)
            self.kubectl.cpu_pid = kubectl_info["pid"]
            self.urls["kubectl"] = f"http://127.0.0.1:{kubectl_info['port']}{path}"

    async def _start_relay(self) -> str:
        """bench/gobroadcast between kubectl proxy and the apiserver; its kubeconfig's path.

        The relay keeps one watch on the apiserver and writes it to all of kubectl proxy's
        watches over TLS and HTTP/2, as the apiserver's watch cache would: kubectl proxy then
        does a pod's work with the CPU to do it (see bench/README.md)."""
        binary = await asyncio.to_thread(go_binary, "gobroadcast")
        args = ["--upstream", self.fake_info["url"], "--token", self.fake_info["token"]]
        args += ["--dir", self.workdir]
        if not self.args.no_tls:
            args += ["--ca", self.fake_info["ca"]]
        info = await self.relay.start_program(str(binary), *args)
        path = os.path.join(self.workdir, "relay.kubeconfig")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "relay",
                    "cluster": {
                        "server": f"https://127.0.0.1:{info['port']}",
                        "certificate-authority": info["ca"],
                    },
                }
            ],
            "users": [{"name": "bench", "user": {"token": self.fake_info["token"]}}],
            "contexts": [{"name": "relay", "context": {"cluster": "relay", "user": "bench"}}],
            "current-context": "relay",
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)  # JSON is YAML: kubectl reads it
        return path

    async def stop(self) -> None:
        await asyncio.gather(
            self.ceiling.stop(),
            self.proxy.stop(),
            self.pacing.stop(),
            self.baseline.stop(),
            self.kubectl.stop(),
            return_exceptions=True,
        )
        await self.relay.stop()
        await self.fake.stop()
        if self.baseline_tree:
            await _git("worktree", "remove", "--force", self.baseline_tree)

    async def _quiet_upstream(self) -> dict[str, Any]:
        """Wait until the previous cell's watches are gone (bounded), return the fake's state."""
        started = time.monotonic()
        poked = False
        while True:
            state = await self.fake.ask("state")
            waited = time.monotonic() - started
            if state["watches"] == 0 or waited > 15:
                return state
            if waited > 0.3 and not poked:
                # watchproxy notices a gone client when it next writes (or polls, every 5 s).
                self.fake.send("poke")
                poked = True
            await asyncio.sleep(0.05)

    async def run_cell(self, phase: str, count: int, mode: str) -> Cell:
        a = self.args
        rate = a.rate if phase == "paced" else 0.0
        events = a.events if phase == "paced" else a.max_events
        cell = Cell(phase, count, mode, events, rate)
        state = await self._quiet_upstream()
        if state["watches"]:
            cell.errors.append(f"{state['watches']} watches still open before the cell")
        rv0 = state["rv"]
        self.cell_no += 1
        procs = max(1, min(a.sub_procs, count))
        shares = [count // procs + (1 if i < count % procs else 0) for i in range(procs)]
        subs: list[tuple[Child, str]] = []
        try:
            starts = []
            for i, share in enumerate(shares):
                out = os.path.join(self.workdir, f"cell{self.cell_no}-{i}.json")
                child = Child(f"subscribers-{self.cell_no}-{i}", self.workdir)
                sub_args = ["--url", self.urls[mode], "--count", str(share), "--rv", str(rv0)]
                sub_args += ["--expect", str(events), "--out", out]
                if a.upstream == "real":
                    sub_args.append("--by-count")
                if mode == "direct":
                    sub_args += ["--token", self.fake_info["token"]]
                    if not a.no_tls:
                        sub_args += ["--ca", self.fake_info["ca"]]
                subs.append((child, out))
                if self.gosub is not None:
                    # One OS thread per process: Go's scheduler hand-offs cost more than they
                    # give to a process that only reads sockets (--sub-procs adds processes).
                    threads = {"GOMAXPROCS": os.environ.get("GOMAXPROCS", "1")}
                    starts.append(
                        child.start_program(str(self.gosub), *sub_args, timeout=90, env=threads)
                    )
                else:
                    starts.append(child.start("bench.subscribers", *sub_args, timeout=90))
            for ready in await asyncio.gather(*starts):
                cell.connect_failures += ready["failed"]
            await asyncio.sleep(0.2)  # let the last subscriptions settle before the first event
            cell.upstream_watches = (await self.fake.ask("state"))["watches"]
            cpu_before = self._cpu(mode, subs)
            gen = await self.fake.ask(f"gen {events} {rate}", timeout=600)
            cell.generator_late_ms = gen["late_ms"]
            gen_seconds = (gen["last_ns"] - gen["first_ns"]) / 1e9
            drain = min(120.0, max(20.0, 3 * gen_seconds))
            for child, _ in subs:
                child.send(f"drain {drain}")
            done = await asyncio.gather(*(child.reply(drain + 60) for child, _ in subs))
            cpu_after = self._cpu(mode, subs)
            cell.cpu_seconds = {k: round(cpu_after[k] - cpu_before[k], 2) for k in cpu_before}
            cell.cpu_seconds["subscribers"] = round(sum(d["cpu_s"] for d in done), 2)
            self._collect(cell, [out for _, out in subs], gen)
        except RoleError as error:
            cell.errors.append(str(error))
            cell.incomplete_streams = max(cell.incomplete_streams, 1)
        finally:
            await asyncio.gather(*(child.stop() for child, _ in subs))
        return cell

    def _cpu(self, mode: str, subs: list[tuple[Child, str]]) -> dict[str, float]:
        roles = {
            "proxy": self.proxy,
            "pacing": self.pacing,
            "baseline": self.baseline,
            "ceiling": self.ceiling,
        }
        server = {**roles, "kubectl": self.kubectl}.get(mode)
        return {
            "fake": self.fake.cpu_seconds(),
            "server": server.cpu_seconds() if server is not None else 0.0,
            "relay": self.relay.cpu_seconds() if mode == "kubectl" else 0.0,
        }

    def _collect(self, cell: Cell, outs: list[str], gen: dict[str, Any]) -> None:
        latencies: list[int] = []
        last_ns = gen["first_ns"]
        final_rv = gen["rv_last"]
        for out in outs:
            with open(out, encoding="utf-8") as handle:
                result = json.load(handle)
            os.unlink(out)
            latencies.extend(result["latencies_us"])
            for s in result["streams"]:
                if s["error"].startswith(("connect", "status")):
                    continue  # counted as a connect failure
                cell.delivered += s["count"]
                cell.lost += s["gaps"] + max(0, final_rv - s["last_rv"])
                cell.reordered += s["reordered"]
                cell.bad_lines += s["bad_lines"]
                if s["last_rv"] < final_rv:
                    cell.incomplete_streams += 1
                    if s["error"] or s["ended_early"]:
                        cell.errors.append(s["error"] or "stream ended early")
                last_ns = max(last_ns, s["last_ns"])
        cell.errors = sorted(set(cell.errors))[:5]
        latencies.sort()
        cell.seconds = round((last_ns - gen["first_ns"]) / 1e9, 3)
        if cell.seconds > 0:
            cell.events_per_s = round(cell.delivered / cell.seconds, 1)
            cell.events_per_s_per_sub = round(cell.events_per_s / cell.subscribers, 1)
        cell.p50_ms = percentile(latencies, 50) / 1000
        cell.p99_ms = percentile(latencies, 99) / 1000
        cell.max_ms = (latencies[-1] if latencies else 0) / 1000


def _cpu_text(c: Cell) -> str:
    """CPU used by each process as a share of the cell's wall time (100 = one whole core)."""
    if c.seconds <= 0:
        return "-"
    text = "/".join(
        f"{100 * c.cpu_seconds.get(k, 0) / c.seconds:.0f}"
        for k in ("fake", "server", "subscribers")
    )
    relay = c.cpu_seconds.get("relay", 0)
    return f"{text} +{100 * relay / c.seconds:.0f} relay" if relay else text


def server_us_per_event(c: Cell) -> float | None:
    """The serving process's CPU per event delivered to a subscriber, in microseconds."""
    if c.mode == "direct" or c.delivered <= 0:
        return None
    return 1e6 * c.cpu_seconds.get("server", 0.0) / c.delivered


def _per_event(c: Cell) -> str:
    value = server_us_per_event(c)
    return "-" if value is None else f"{value:.1f}"


def _cell_ratios(c: Cell, kubectl: Cell | None, ceiling: Cell | None) -> dict[str, float]:
    found: dict[str, float] = {}
    if kubectl is not None and kubectl.p99_ms > 0 and kubectl.seconds > 0 and c.seconds > 0:
        found["p99 vs kubectl proxy"] = c.p99_ms / kubectl.p99_ms
        cpu_k = kubectl.cpu_seconds.get("server", 0.0) / kubectl.seconds
        if cpu_k > 0:
            found["CPU vs kubectl proxy"] = c.cpu_seconds.get("server", 0.0) / c.seconds / cpu_k
    mine, floor = server_us_per_event(c), ceiling and server_us_per_event(ceiling)
    if mine is not None and floor:
        found["CPU/event vs raw-write ceiling"] = mine / floor
    return found


def ratios(cells: list[Cell]) -> list[str]:
    """Issue 13's "done when" figures, per phase, count and round where the cells to compare
    ran, and their medians over the rounds when there are several."""
    out: list[str] = []
    by_key = {(c.phase, c.subscribers, c.mode, c.round): c for c in cells}
    rounds: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for (phase, count, mode, round_no), c in by_key.items():
        if mode not in WATCHPROXY_MODES:
            continue
        kubectl = by_key.get((phase, count, "kubectl", round_no))
        ceiling = by_key.get((phase, count, "ceiling", round_no))
        found = _cell_ratios(c, kubectl, ceiling)
        if found:
            rounds.setdefault((phase, count, mode), []).append(found)
            text = ", ".join(f"{name} {value:.2f}x" for name, value in found.items())
            out.append(f"{phase} {count:>5}{_round_tag(c)}: {WATCHPROXY_MODES[mode]} {text}")
    for (phase, count, mode), found_list in rounds.items():
        if len(found_list) < 2:
            continue
        names = dict.fromkeys(name for found in found_list for name in found)
        medians = {
            name: statistics.median(found[name] for found in found_list if name in found)
            for name in names
        }
        text = ", ".join(f"{name} {value:.2f}x" for name, value in medians.items())
        name = WATCHPROXY_MODES[mode]
        out.append(f"{phase} {count:>5} median of {len(found_list)} rounds: {name} {text}")
    return out


def _round_tag(c: Cell) -> str:
    return f" #{c.round + 1}" if c.round else ""


def saturated(c: Cell) -> bool:
    """A paced cell that could not keep up: its latencies are queueing, not transit."""
    return c.phase == "paced" and c.events_per_s_per_sub < 0.95 * c.rate


def render(cells: list[Cell]) -> str:
    """One table per phase: subscribers x mode, with proxy and ceiling compared to direct."""
    lines: list[str] = []
    by_key = {(c.phase, c.subscribers, c.mode, c.round): c for c in cells}
    for phase in dict.fromkeys(c.phase for c in cells):
        some = next(c for c in cells if c.phase == phase)
        if phase == "paced":
            lines.append(f"\nphase paced: {some.events} events at {some.rate:g}/s per cell")
        else:
            lines.append(
                f"\nphase max: {some.events} events as fast as the generator can write "
                "(latency = queueing of the burst; compare throughput only)"
            )
        header = (
            f"{'subs':>5} {'mode':<11} {'upW':>4} {'events/s':>9} {'per sub':>8} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} {'/ceil':>5} "
            f"{'lost':>4} {'srv us/ev':>9}  cpu% fake/srv/subs"
        )
        lines += [header, "-" * len(header)]
        blocks = dict.fromkeys((c.subscribers, c.round) for c in cells if c.phase == phase)
        for count, round_no in blocks:
            direct = by_key.get((phase, count, "direct", round_no))
            ceiling = by_key.get((phase, count, "ceiling", round_no))
            for mode in MODES:
                c = by_key.get((phase, count, mode, round_no))
                if c is None:
                    continue
                added50 = added99 = "-"
                if phase == "paced" and direct is not None and mode != "direct":
                    added50 = f"{c.p50_ms - direct.p50_ms:+.2f}"
                    added99 = f"{c.p99_ms - direct.p99_ms:+.2f}"
                ratio = "-"
                if ceiling is not None and ceiling.events_per_s > 0:
                    ratio = f"{c.events_per_s / ceiling.events_per_s:.2f}"
                lost = str(c.faults) + ("!" if c.errors else "")
                flag = " *" if saturated(c) else ""
                mode_text = f"{c.mode}{_round_tag(c)}"
                lines.append(
                    f"{c.subscribers:>5} {mode_text:<11} {c.upstream_watches:>4} "
                    f"{c.events_per_s:>9.0f} {c.events_per_s_per_sub:>8.1f} "
                    f"{c.p50_ms:>8.2f} {c.p99_ms:>8.2f} {added50:>8} {added99:>8} {ratio:>5} "
                    f"{lost:>4} {_per_event(c):>9}  {_cpu_text(c)}{flag}"
                )
    summary = ratios(cells)
    if summary:
        lines += ["", *summary]
    if any(saturated(c) for c in cells):
        lines.append("\n* fell behind the paced rate (delivered < 95 % of it): saturated")
    lines.append(
        "upW = watches open on the fake apiserver; +p50/+p99 = minus direct at the same count; "
        "/ceil = throughput / raw broadcast ceiling; srv us/ev = serving process CPU per "
        "delivered event"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fanout", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--subscribers", help="comma-separated counts (default 1,10,100,500)")
    parser.add_argument("--events", type=int, help="events per paced cell (default 500)")
    parser.add_argument("--rate", type=float, help="events/s in the paced phase (default 50)")
    parser.add_argument("--max-events", type=int, help="events per max cell (default 2x events)")
    parser.add_argument("--phases", default="paced,max", help="paced, max or both (default)")
    parser.add_argument(
        "--modes",
        default="direct,proxy,ceiling",
        help="subset of direct,proxy,pacing,baseline,kubectl,ceiling (see bench/README.md)",
    )
    parser.add_argument(
        "--kubectl-proxy", action="store_true", help="add kubectl proxy (kubectl on PATH)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="1,10,100 subscribers, 150 events at 100/s (< 60 s)"
    )
    parser.add_argument("--json", default="", help="also write every cell to this file")
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of each count's modes, interleaved"
    )
    parser.add_argument("--objects", type=int, default=50, help="configmaps the generator edits")
    parser.add_argument("--object-bytes", type=int, default=1024, help="approximate event size")
    parser.add_argument("--sub-procs", type=int, default=1, help="subscriber processes per cell")
    parser.add_argument(
        "--sub-impl",
        choices=("go", "python"),
        default="go",
        help="subscribers in Go (bench/gosub, cheap) or Python (bench.subscribers)",
    )
    parser.add_argument(
        "--kubectl-via-relay",
        action="store_true",
        help="kubectl proxy's upstream is bench/gobroadcast (one apiserver watch, TLS + HTTP/2)",
    )
    parser.add_argument("--no-tls", action="store_true", help="fake apiserver without TLS")
    parser.add_argument(
        "--upstream",
        choices=("fake", "real"),
        default="fake",
        help="the Python fake, or kube-apiserver + etcd (bench.realapi; needs kubetestenv)",
    )
    parser.add_argument("--profile-proxy", default="", help="cProfile the proxy into this file")
    parser.add_argument(
        "--baseline",
        default="",
        metavar="REF",
        help="add mode baseline: watchproxy at this git ref (a worktree), e.g. HEAD~1 or main",
    )
    parser.add_argument(
        "--proxy-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key for the proxy mode, e.g. hub.fanout_max_delay_seconds=0.015",
    )
    args = parser.parse_args(argv)
    args.subscribers = [
        int(x)
        for x in (args.subscribers or ("1,10,100" if args.quick else "1,10,100,500")).split(",")
    ]
    args.events = args.events or (150 if args.quick else 500)
    args.rate = args.rate or (100.0 if args.quick else 50.0)
    args.max_events = args.max_events or 2 * args.events
    args.phases = [p for p in args.phases.split(",") if p]
    args.modes = [m for m in args.modes.split(",") if m]
    if args.kubectl_proxy and "kubectl" not in args.modes:
        args.modes.append("kubectl")
    if args.baseline and "baseline" not in args.modes:
        args.modes.append("baseline")
    if "baseline" in args.modes and not args.baseline:
        parser.error("mode baseline needs --baseline REF")
    if not args.modes or not all(m in MODES for m in args.modes):
        parser.error("--modes takes direct, proxy, pacing, baseline, kubectl and/or ceiling")
    if args.profile_proxy:
        args.profile_proxy = os.path.abspath(args.profile_proxy)
    if not all(p in ("paced", "max") for p in args.phases):
        parser.error("--phases takes paced and/or max")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if min(args.subscribers) < 1 or args.events < 1 or args.max_events < 1 or args.rate <= 0:
        parser.error("subscriber counts and --events must be positive")
    return args


def _loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "?"


async def run(args: argparse.Namespace, argv: list[str]) -> list[Cell]:
    cells: list[Cell] = []
    started = time.monotonic()
    load_before = _loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as workdir:
        bench = Bench(args, workdir)
        try:
            await bench.start()
            for phase in args.phases:
                for count in args.subscribers:
                    for round_no, mode in itertools.product(range(args.repeat), args.modes):
                        cell_start = time.monotonic()
                        cell = await bench.run_cell(phase, count, mode)
                        cell.round = round_no
                        cells.append(cell)
                        print(
                            f"  [{time.monotonic() - cell_start:4.1f}s] "
                            f"{phase:<5} {count:>4} {mode:<8} {cell.events_per_s:>9.0f} ev/s "
                            f"p50 {cell.p50_ms:.2f} ms p99 {cell.p99_ms:.2f} ms "
                            f"faults {cell.faults}" + (f"  {cell.errors}" if cell.errors else ""),
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            await bench.stop()
    elapsed = time.monotonic() - started
    print(render(cells))
    print(f"loadavg before {load_before}, after {_loadavg()} (the machine is shared)")
    print(f"\n{len(cells)} cells in {elapsed:.0f}s; command: {shlex.join(argv)}")
    if args.json:
        document = {
            "command": shlex.join(argv),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "seconds": round(elapsed, 1),
            "cells": [{**vars(c), "faults": c.faults} for c in cells],
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
    return cells


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse_args(raw)
    cells = asyncio.run(run(args, ["python", "-m", "bench.fanout", *raw]))
    bad = [c for c in cells if c.faults or c.errors]
    for c in bad:
        print(f"FAULTS {c.phase} {c.subscribers} {c.mode}: {c.faults} {c.errors}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
