"""Instructions per proxied request, counted by callgrind: a figure a noisy machine keeps.

    .venv/bin/python -m bench.instructions [--seconds 5,15] [--top 40] [--build compiled|source]

Timings on a shared two-core machine move by 10 % between runs of one build, more than most
single changes to the request path are worth. The instructions the proxy executes per request
do not: this runs ``bench.requestcost`` (the controller mix of ``bench/gocontroller`` at one
worker, against the fake apiserver, the proxy in the measured process) under valgrind's
callgrind twice, for two durations, and divides the difference in instructions by the
difference in requests, so start-up and shutdown cancel out. Printed: instructions per request
in all, and per function (inclusive) for the ``--top`` functions of the proxy's own modules and
of what they call. Needs ``valgrind`` (Debian: ``apt-get install valgrind``); about three
minutes. Under callgrind the proxy runs some forty times slower, so cache misses and system
calls are not what is counted: compare builds with this, and the machine with
``bench.controller``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import compiledtree

_ROW = re.compile(r"\s*([\d,]+) \([^)]*\)\s+(?:\*\s+)?(.*)")
_REQUESTS = re.compile(r"\((\d+) requests\)")


def run(tree: Path | None, seconds: float, out: Path) -> tuple[int, dict[str, int]]:
    """Requests served, and inclusive instructions by function, of one callgrind run."""
    command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, "-m", "bench.requestcost", "--workers", "1", "--seconds", str(seconds),
    ]  # fmt: skip
    env = compiledtree.environment(tree) if tree is not None else None
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True)
    found = _REQUESTS.search(done.stdout)
    if found is None:
        raise SystemExit(f"bench.instructions: no request count in:\n{done.stdout}")
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    by_function: dict[str, int] = {}
    for line in annotated.splitlines():
        row = _ROW.match(line)
        if row:
            name = re.sub(r" \[[^]]*\]$", "", row.group(2)).rsplit(":", 1)[-1]  # no file
            # A function shows under each file it has code from (its own, and headers inlined
            # into it): the largest is the whole of it.
            count = int(row.group(1).replace(",", ""))
            by_function[name] = max(count, by_function.get(name, 0))
    return int(found.group(1)), by_function


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", default="5,15", help="the two durations, comma-separated")
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--build", choices=("compiled", "source"), default="compiled")
    a = parser.parse_args()
    short, long = (float(x) for x in a.seconds.split(","))
    tree = compiledtree.build() if a.build == "compiled" else None
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        first_requests, first = run(tree, short, Path(tmp) / "short.out")
        second_requests, second = run(tree, long, Path(tmp) / "long.out")
    requests = second_requests - first_requests
    total = second["PROGRAM TOTALS"] - first["PROGRAM TOTALS"]
    print(f"watchproxy build: {a.build}; {requests} requests counted")
    print(f"instructions per request: {total / requests:,.0f}")
    # The compiled modules' functions (a coroutine's body is its generator helper); a source
    # build's Python functions have no names of their own here.
    ours = {
        name.removeprefix("CPyDef_").removesuffix("_gen_____mypyc_generator_helper__"): (
            count - first.get(name, 0)
        )
        / requests
        for name, count in second.items()
        if name.startswith("CPyDef_")
    }
    for name, per_request in sorted(ours.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{per_request:>10,.0f}  {name}")


if __name__ == "__main__":
    main()
