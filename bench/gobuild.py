"""Build the benchmark's Go programs when a binary is missing or older than one of its sources.

``bench/gosub`` (the subscribers) and ``bench/gobroadcast`` (kubectl proxy's TLS watch relay)
use the standard library only, so a build needs no module download; ``go build``'s own cache
makes a rebuild take a second or two. ``python -m bench.gobuild`` builds both and prints them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.clients.build import BuildFailed, ToolchainMissing, go_build

BENCH_DIR = Path(__file__).resolve().parent
PROGRAMS = ("gosub", "gobroadcast", "gocontroller")


def go_binary(name: str, *, timeout: float = 300.0) -> Path:
    """The path of an up-to-date ``bench/NAME/bin/NAME``; raises ToolchainMissing or
    BuildFailed."""
    source = BENCH_DIR / name
    return go_build(
        source,
        ".",
        source / "bin" / name,  # gitignored
        [source / "go.mod", *source.glob("*.go")],
        needed_by=f"bench/{name} needs",
        timeout=timeout,
    )


if __name__ == "__main__":
    try:
        for program in PROGRAMS:
            print(go_binary(program))
    except (ToolchainMissing, BuildFailed) as error:
        sys.exit(str(error))
