"""Controller benchmark: a busy controller direct, through watchproxy, through kubectl proxy.

``python -m bench.controller [--workers 1,8,32] [--seconds 10] [--rounds 2] [--pushback]
[--build compiled|source|both]``

Against a real kube-apiserver + etcd (``tests/realapi/bin/kubetestenv``), N workers of
``bench/gocontroller`` loop over GET / merge-PATCH (each its own configmap, as a work queue
hands a key to one worker at a time; ``--hot-object``: one shared by all) / LIST limit=5 / LIST
in pages of 2 / CREATE / DELETE at full speed, once per mode in each round: direct, watchproxy
with its defaults (``watchproxy run``, built as the image builds it: ``--build compiled``, the
default, runs the modules ``setup.py`` compiles with mypyc; ``--build source`` runs this tree's
Python), and ``kubectl proxy``. Printed per cell: requests per second, p50 and p99, errors, and
the CPU of every process (apiserver, proxy, load generator) as a share of one core, so that the
machine's own limit shows; after the slash, how long the process's threads were ready to run
but waited for a core (from ``/proc/PID/task/*/schedstat``), also as a share of one core:
latency that no process spent. ``--verbs`` adds p50/p99 per verb, ``--trace DIR`` writes every
request, ``--set`` runs watchproxy with a setting other than its default. ``--baseline REF``
adds mode ``baseline``: watchproxy as it was at git ref REF (a worktree, built the same way),
so that a change is measured against the code it changes in the same interleaved rounds.

``--pushback`` adds the second phase: the workers act as a ServiceAccount whose requests the
apiserver's API Priority and Fairness puts in a priority level of one nominal share that rejects
what it cannot run at once (429), and the table adds the 429s the apiserver issued (from its
``apiserver_flowcontrol_rejected_requests_total``) per mode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gobuild import go_binary
from tests import compiledtree
from tests.realapi.fixture import RealApiServer, start_kubetestenv

NAMESPACE = "default"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
BENCH_SA = "bench-controller"
MODES = ("direct", "watchproxy", "kubectl")
# etcd compacted as kube-apiserver's default does, every 5 minutes. The test fixture's 4 s lets
# tests see a compaction soon; here it ended every paged LIST that outlasted 4-8 s in 410
# Expired, through whichever front, and a page waits longest when the apiserver pushes back.
COMPACTION = ("-compaction-interval", "5m")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runnable_waiting_seconds(pid: int) -> float:
    """Time the process's threads were ready to run but waited for a core (schedstat's second
    field, summed over threads): on a machine with fewer cores than busy threads this is where
    latency goes that no process spends."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


class Api:
    """Plain HTTPS calls to the apiserver for the set-up (as its admin)."""

    def __init__(self, server: RealApiServer) -> None:
        self.server = server
        self.ssl = ssl.create_default_context(cafile=server.ca_file)

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.server.url + path,
            data=data,
            method=method,
            headers={**self.server.auth(token), "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=self.ssl, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            if error.code == 409:  # already there from an earlier run
                return None
            raise

    def metric(self, name: str) -> float:
        request = urllib.request.Request(self.server.url + "/metrics", headers=self.server.auth())
        with urllib.request.urlopen(request, context=self.ssl, timeout=30) as response:
            text = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )


def seed(api: Api) -> None:
    api.call("POST", CONFIGMAPS, {"metadata": {"name": "bench-shared"}, "data": {}})
    for i in range(10):
        api.call("POST", CONFIGMAPS, {"metadata": {"name": f"bench-page-{i}"}, "data": {"i": "x"}})


def pushback_identity(api: Api) -> str:
    """A ServiceAccount token whose requests land in a one-share priority level that rejects."""
    accounts = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
    api.call("POST", accounts, {"metadata": {"name": BENCH_SA}})
    api.call(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": BENCH_SA},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": BENCH_SA, "namespace": NAMESPACE}],
        },
    )  # fmt: skip
    flowcontrol = "/apis/flowcontrol.apiserver.k8s.io/v1"
    api.call(
        "POST",
        flowcontrol + "/prioritylevelconfigurations",
        {
            "metadata": {"name": BENCH_SA},
            "spec": {"type": "Limited", "limited": {
                # No borrowing: the level's seats (about 3 of the default 600) stay the same
                # from run to run; with borrowing, direct ran from 62 to 1,930 req/s at N=32.
                "nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"},
            }},
        },
    )  # fmt: skip
    api.call(
        "POST",
        flowcontrol + "/flowschemas",
        {
            "metadata": {"name": BENCH_SA},
            "spec": {
                "priorityLevelConfiguration": {"name": BENCH_SA},
                "matchingPrecedence": 100,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{
                    "subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                        "name": BENCH_SA, "namespace": NAMESPACE}}],
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                       "namespaces": ["*"], "clusterScope": True}],
                }],
            },
        },
    )  # fmt: skip
    answer = api.call(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{BENCH_SA}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    return str(answer["status"]["token"])


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]

    def cpu(self) -> float:
        return cpu_seconds(self.popen.pid)

    def waiting(self) -> float:
        return runnable_waiting_seconds(self.popen.pid)


def wait_http(url: str, what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{what} did not come up at {url}; its log ends:\n{tail}")
        time.sleep(0.2)


@contextlib.contextmanager
def baseline_tree(ref: str, workdir: Path, *, compiled: bool) -> Iterator[Path]:
    """watchproxy's tree at git ref ``ref``: a worktree, or its compiled copy when
    ``compiled``; the worktree is removed at the end."""
    root = Path(__file__).resolve().parent.parent
    worktree = workdir / "baseline"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(worktree), ref],
        cwd=root, check=True, capture_output=True,
    )  # fmt: skip
    try:
        if not compiled:
            yield worktree
            return
        built = subprocess.run(
            [sys.executable, "-m", "tests.compiledtree"],
            cwd=worktree, check=True, capture_output=True, text=True,
        )  # fmt: skip
        yield Path(built.stdout.strip().splitlines()[-1])
    finally:
        remove = ["git", "worktree", "remove", "--force", str(worktree)]
        subprocess.run(remove, cwd=root, check=True)


@contextlib.contextmanager
def proxies(
    kubeconfig: str,
    workdir: Path,
    trees: dict[str, Path | None],
    settings: tuple[str, ...] = (),
    *,
    compiled: bool = True,
) -> Iterator[dict[str, tuple[str, Process]]]:
    """A watchproxy per entry of ``trees`` (mode -> the tree to run it from, None: this one;
    defaults, but for ``settings``: ``--set`` values) and kubectl proxy before ``kubeconfig``:
    mode -> (url, process), and mode-admin -> (admin url, process)."""
    children: dict[str, tuple[str, str, subprocess.Popen[bytes]]] = {}
    kport = free_port()
    with (
        open(workdir / "watchproxy.log", "ab") as watchproxy_log,
        open(workdir / "kubectl.log", "ab") as kubectl_log,
    ):
        for mode, tree in trees.items():
            # Run from the tree, with it first on PYTHONPATH: `python -m` puts its working
            # directory ahead of PYTHONPATH, so from this tree it would import this tree's source.
            env = compiledtree.environment(tree) if tree is not None else None
            port, admin = free_port(), free_port()
            children[mode] = (str(port), str(admin), subprocess.Popen(
                [sys.executable, "-m", "watchproxy", "run", "--kubeconfig", kubeconfig,
                 "--listen-port", str(port), "--admin-port", str(admin), "--log-level", "warning",
                 *(arg for value in settings for arg in ("--set", value))],
                stdin=subprocess.DEVNULL, stdout=watchproxy_log, stderr=subprocess.STDOUT,
                env=env, cwd=tree,
            ))  # fmt: skip
        kubectl = subprocess.Popen(
            ["kubectl", "proxy", f"--port={kport}", f"--kubeconfig={kubeconfig}"],
            stdin=subprocess.DEVNULL, stdout=kubectl_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        fronts: dict[str, tuple[str, Process]] = {}
        for mode, (port, admin, child) in children.items():
            wait_http(f"http://127.0.0.1:{admin}/readyz", mode, workdir / "watchproxy.log")
            runs_copy = trees.get(mode) is not None
            if (
                compiled
                and runs_copy
                and "__mypyc" not in Path(f"/proc/{child.pid}/maps").read_text()
            ):
                raise SystemExit(f"bench.controller: {mode} did not load its compiled modules")
            fronts[mode] = (f"http://127.0.0.1:{port}", Process(mode, child))
            fronts[f"{mode}-admin"] = (f"http://127.0.0.1:{admin}", Process(mode, child))
        wait_http(f"http://127.0.0.1:{kport}/version", "kubectl proxy", workdir / "kubectl.log")
        fronts["kubectl"] = (f"http://127.0.0.1:{kport}", Process("kubectl proxy", kubectl))
        yield fronts
    finally:
        for child in (*(c for _, _, c in children.values()), kubectl):
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@dataclass
class Cell:
    mode: str
    workers: int
    per_second: float
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]
    retried: int  # 429s the clients retried
    cpu: dict[str, float]  # process -> share of one core
    waiting: dict[str, float]  # process -> seconds per second its threads waited for a core
    verbs: dict[str, dict[str, float]]  # verb -> requests, p50_ms, p99_ms
    rejected: float = 0.0  # 429s the apiserver issued in this cell


def run_cell(
    binary: Path, mode: str, url: str, workers: int, seconds: float, *, token_file: str | None,
    ca: str | None, watched: dict[str, Process], api: Api | None, trace: Path | None = None,
    hot_object: bool = False,
) -> Cell:  # fmt: skip
    args = [str(binary), "-url", url, "-workers", str(workers), "-seconds", str(seconds)]
    if hot_object:
        args.append("-hot-object")
    if trace is not None:
        args += ["-trace", str(trace)]
    if token_file:
        args += ["-token-file", token_file]
    if ca:
        args += ["-ca", ca]
    rejected_before = api.metric("apiserver_flowcontrol_rejected_requests_total") if api else 0.0
    before = {name: p.cpu() for name, p in watched.items()}
    waiting_before = {name: p.waiting() for name, p in watched.items()}
    started = time.monotonic()
    load = subprocess.Popen(args, stdout=subprocess.PIPE)
    assert load.stdout is not None
    out = load.stdout.read()  # the generator ends by itself after ``seconds``
    _, status, usage = os.wait4(load.pid, 0)
    load.returncode = os.waitstatus_to_exitcode(status)
    load.stdout.close()
    elapsed = time.monotonic() - started
    if load.returncode != 0:
        raise SystemExit(f"gocontroller failed ({load.returncode}) in mode {mode}")
    result = json.loads(out)
    cpu = {name: (p.cpu() - before[name]) / elapsed for name, p in watched.items()}
    cpu["load"] = (usage.ru_utime + usage.ru_stime) / elapsed
    waiting = {name: (p.waiting() - waiting_before[name]) / elapsed for name, p in watched.items()}
    rejected = (
        api.metric("apiserver_flowcontrol_rejected_requests_total") - rejected_before
        if api
        else 0.0
    )
    return Cell(
        mode, workers, result["per_second"], result["p50_ms"], result["p99_ms"],
        result["errors"], result["retried_429"], cpu, waiting, result["verbs"], rejected,
    )  # fmt: skip


def limiter_state(admin_url: str) -> str:
    """watchproxy's own account of its upstream limiting, from its /metrics."""
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    wanted = (
        "watchproxy_upstream_concurrency_limit ",
        "watchproxy_upstream_concurrency_limit_changes_total",
        "watchproxy_ratelimit_wait_seconds_total",
        "watchproxy_upstream_connections ",
        "watchproxy_upstream_connection_attempts_total",
    )
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    for histogram in (
        "watchproxy_request_duration_seconds",
        "watchproxy_upstream_request_duration_seconds",
    ):
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith(histogram + "_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith(histogram + "_count"):
                count += float(line.rsplit(" ", 1)[1])
        lines.append(f"{histogram} mean {1000 * total / max(count, 1):.2f} ms of {count:.0f}")
    return "; ".join(lines)


def report(cells: list[Cell], *, pushback: bool, verbs: bool = False) -> None:
    by: dict[tuple[str, int], list[Cell]] = {}
    for cell in cells:
        by.setdefault((cell.mode, cell.workers), []).append(cell)
    header = (
        "mode        N   req/s   p50 ms  p99 ms  errors                 "
        "CPU/waiting for a core (share of one)"
    )
    print(header + ("  retried 429s / apiserver 429s" if pushback else ""))
    workers = sorted({c.workers for c in cells})
    for n in workers:
        medians: dict[str, tuple[float, float, float]] = {}
        per_request: dict[str, float] = {}  # mode -> the proxy's CPU per request, us
        for mode in (*MODES, "source", "baseline"):
            group = by.get((mode, n), [])
            if not group:
                continue
            rps = statistics.median(c.per_second for c in group)
            p50 = statistics.median(c.p50_ms for c in group)
            p99 = statistics.median(c.p99_ms for c in group)
            medians[mode] = (rps, p50, p99)
            if mode in ("watchproxy", "source", "baseline"):
                per_request[mode] = statistics.median(c.cpu[mode] for c in group) / rps * 1e6
            errors: dict[str, int] = {}
            for c in group:
                for k, v in c.errors.items():
                    errors[k] = errors.get(k, 0) + v
            cpu = " ".join(
                f"{name} {100 * statistics.median(c.cpu.get(name, 0.0) for c in group):.0f}%"
                + (
                    f"/{100 * statistics.median(c.waiting[name] for c in group):.0f}%"
                    if name in group[0].waiting
                    else ""
                )
                for name in sorted({k for c in group for k in c.cpu})
            )
            line = f"{mode:<10} {n:>3} {rps:>7.0f} {p50:>8.2f} {p99:>7.2f}  "
            line += f"{json.dumps(errors):<22} {cpu}"
            if pushback:
                line += f"  {sum(c.retried for c in group)} / {sum(c.rejected for c in group):.0f}"
            print(line)
            if verbs:
                print("    p50/p99 ms: " + "  ".join(
                    f"{verb} {statistics.median(c.verbs[verb]['p50_ms'] for c in group):.1f}"
                    f"/{statistics.median(c.verbs[verb]['p99_ms'] for c in group):.1f}"
                    for verb in sorted(group[0].verbs)
                ))  # fmt: skip
        for build in ("watchproxy", "source"):
            if {"direct", build, "kubectl"} <= medians.keys():
                direct, proxied, kubectl = medians["direct"], medians[build], medians["kubectl"]
                print(
                    f"  N={n}: {build} {proxied[0] / direct[0]:.2f}x direct throughput, "
                    f"{proxied[0] / kubectl[0]:.2f}x kubectl proxy's; added p50 "
                    f"{proxied[1] - direct[1]:+.2f} ms, added p99 "
                    f"{proxied[2] - direct[2]:+.2f} ms; "
                    f"p99 {proxied[2] / kubectl[2]:.2f}x kubectl proxy's; CPU per request "
                    f"{per_request[build]:.0f} us"
                )
        if {"watchproxy", "baseline"} <= medians.keys():
            w, b = medians["watchproxy"], medians["baseline"]
            print(
                f"  N={n}: watchproxy {w[0] / b[0]:.2f}x the baseline's throughput, p99 "
                f"{w[2] / b[2]:.2f}x; CPU per request {per_request['watchproxy']:.0f} us against "
                f"{per_request['baseline']:.0f} us"
            )
    if pushback:
        total = {m: sum(c.rejected for c in cells if c.mode == m) for m in MODES}
        if total["direct"]:
            ratio = total["watchproxy"] / total["direct"]
            print(f"  apiserver 429s through watchproxy: {ratio:.2f}x direct's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,8,32", help="comma-separated worker counts")
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="add mode baseline: watchproxy at this git ref, built the same way (e.g. HEAD~1)",
    )
    parser.add_argument("--pushback", action="store_true", help="second phase: APF rejects")
    parser.add_argument(
        "--build",
        choices=("compiled", "source", "both"),
        default="compiled",
        help="watchproxy as the image ships it (mypyc, tests.compiledtree) or this tree's source "
        "(the default pip install); both: the source as mode 'source' beside the compiled",
    )
    parser.add_argument(
        "--limits", action="store_true", help="print watchproxy's upstream limit after each cell"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a watchproxy setting other than its default (repeatable; the figures then are not "
        "those of the defaults)",
    )
    parser.add_argument(
        "--verbs", action="store_true", help="print p50/p99 per verb under each mode's line"
    )
    parser.add_argument(
        "--hot-object",
        action="store_true",
        help="every worker GETs and PATCHes one shared configmap (the workload before "
        "2026-12-06; the apiserver's conflict retries on it set the p99) instead of its own",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="DIR",
        help="write every request of each cell (start, duration, verb) to "
        "DIR/MODE-N-ROUND.jsonl, to see when the slow ones came",
    )
    a = parser.parse_args()
    binary = go_binary("gocontroller")
    modes = a.modes.split(",")
    if a.baseline and "baseline" not in modes:
        modes.insert(modes.index("watchproxy") + 1 if "watchproxy" in modes else 0, "baseline")
    if a.build == "both" and "source" not in modes:
        modes.insert(modes.index("watchproxy") + 1 if "watchproxy" in modes else 0, "source")
    compiled = compiledtree.build() if a.build in ("compiled", "both") else None
    print(
        f"watchproxy build: {a.build}"
        + (f"; baseline {a.baseline}" if a.baseline else "")
        + "".join(f"; --set {v}" for v in a.set)
        + ("; hot object" if a.hot_object else "")
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)
        trees: dict[str, Path | None] = {"watchproxy": compiled}
        if a.build == "both":
            trees["source"] = None
        if a.baseline:
            trees["baseline"] = stack.enter_context(
                baseline_tree(a.baseline, workdir, compiled=compiled is not None)
            )
        server = start_kubetestenv(workdir / "api", extra=COMPACTION)
        try:
            api = Api(server)
            seed(api)
            token_file = workdir / "token"
            kubeconfig = server.kubeconfig
            if a.pushback:
                token_file.write_text(pushback_identity(api))
                kubeconfig = server.write_kubeconfig(
                    workdir / "bench.kubeconfig", token=token_file.read_text()
                )
            else:
                token_file.write_text(server.token)
            apiserver = Process("apiserver", server.process)
            with proxies(
                kubeconfig, workdir, trees, tuple(a.set), compiled=compiled is not None
            ) as fronts:
                cells: list[Cell] = []
                if a.trace:
                    a.trace.mkdir(parents=True, exist_ok=True)
                for round_ in range(a.rounds):
                    for n in (int(x) for x in a.workers.split(",")):
                        for mode in modes:
                            watched = {"apiserver": apiserver}
                            if mode == "direct":
                                url, token, ca = server.url, str(token_file), server.ca_file
                            else:
                                url, process = fronts[mode]
                                token, ca = None, None
                                watched[mode] = process
                            cells.append(
                                run_cell(
                                    binary, mode, url, n, a.seconds, token_file=token, ca=ca,
                                    watched=watched, api=api if a.pushback else None,
                                    trace=a.trace / f"{mode}-{n}-{round_}.jsonl"
                                    if a.trace else None,
                                    hot_object=a.hot_object,
                                )
                            )  # fmt: skip
                            if mode == "watchproxy" and a.limits:
                                print(f"N={n}: {limiter_state(fronts['watchproxy-admin'][0])}")
            report(cells, pushback=a.pushback, verbs=a.verbs)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
