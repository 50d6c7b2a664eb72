"""Build ``bench/gosub`` (the Go subscribers) when its binary is missing or older than a source.

Standard library only, so the build needs no module download; ``go build``'s own cache makes a
rebuild take a second or two. ``python -m bench.gobuild`` builds it and prints the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.clients.build import BuildFailed, ToolchainMissing, find_go, is_fresh

GOSUB_DIR = Path(__file__).resolve().parent / "gosub"
GOSUB = GOSUB_DIR / "bin" / "gosub"  # gitignored


def gosub_binary(*, timeout: float = 300.0) -> Path:
    """The path of an up-to-date ``gosub``; raises ToolchainMissing or BuildFailed."""
    sources = [GOSUB_DIR / "go.mod", *GOSUB_DIR.glob("*.go")]
    if is_fresh(GOSUB, sources):
        return GOSUB
    go = find_go()
    if go is None:
        raise ToolchainMissing("go not found: build needs Go, or pass --sub-impl python")
    GOSUB.parent.mkdir(exist_ok=True)
    partial = GOSUB.parent / ".gosub.partial"  # renamed when whole: never a stale-looking binary
    try:
        result = subprocess.run(
            [go, "build", "-o", str(partial), "."],
            cwd=GOSUB_DIR,
            env={**os.environ, "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildFailed(f"go build of bench/gosub took over {timeout:.0f} s") from exc
    if result.returncode != 0:
        raise BuildFailed(f"go build of bench/gosub failed:\n{result.stderr}")
    os.replace(partial, GOSUB)
    return GOSUB


if __name__ == "__main__":
    try:
        print(gosub_binary())
    except (ToolchainMissing, BuildFailed) as error:
        sys.exit(str(error))
