"""Build the benchmark's Go programs when a binary is missing or older than one of its sources.

``bench/gosub`` (the subscribers) and ``bench/gobroadcast`` (kubectl proxy's TLS watch relay)
use the standard library only, so a build needs no module download; ``go build``'s own cache
makes a rebuild take a second or two. ``python -m bench.gobuild`` builds both and prints them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.clients.build import BuildFailed, ToolchainMissing, find_go, is_fresh

BENCH_DIR = Path(__file__).resolve().parent
PROGRAMS = ("gosub", "gobroadcast")


def go_binary(name: str, *, timeout: float = 300.0) -> Path:
    """The path of an up-to-date ``bench/NAME/bin/NAME``; raises ToolchainMissing or
    BuildFailed."""
    source = BENCH_DIR / name
    binary = source / "bin" / name  # gitignored
    if is_fresh(binary, [source / "go.mod", *source.glob("*.go")]):
        return binary
    go = find_go()
    if go is None:
        raise ToolchainMissing(f"go not found: bench/{name} needs Go (>= 1.25)")
    binary.parent.mkdir(exist_ok=True)
    partial = binary.parent / f".{name}.partial"  # renamed when whole: never a stale look-alike
    try:
        result = subprocess.run(
            [go, "build", "-o", str(partial), "."],
            cwd=source,
            env={**os.environ, "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildFailed(f"go build of bench/{name} took over {timeout:.0f} s") from exc
    if result.returncode != 0:
        raise BuildFailed(f"go build of bench/{name} failed:\n{result.stderr}")
    os.replace(partial, binary)
    return binary


def gosub_binary() -> Path:
    return go_binary("gosub")


if __name__ == "__main__":
    try:
        for program in PROGRAMS:
            print(go_binary(program))
    except (ToolchainMissing, BuildFailed) as error:
        sys.exit(str(error))
