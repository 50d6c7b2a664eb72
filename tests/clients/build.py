"""Build the real-client test programs, skipping the build when the binary is up to date.

``go build`` keeps its own cache (``go env GOCACHE``) and module cache, so even a rebuild after
a source change only recompiles this module; a fresh machine downloads client-go from the Go
module proxy once. Run it alone to (re)build and print the time: ``python -m tests.clients.build``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.buildcache import BuildFailed, restore_or_build, run_build

GO_DIR = Path(__file__).resolve().parent / "go"
GO_BIN_DIR = GO_DIR / "bin"  # gitignored
WATCHCLIENT = GO_BIN_DIR / "watchclient"
# The newest client-go (v0.37, WatchList on by default) beside the oldest one above (v0.34).
GO137_DIR = Path(__file__).resolve().parent / "go137"
INFORMER137 = GO137_DIR / "bin" / "informer"
# Where the official tarball installs Go; non-login shells often lack it on PATH.
GO_FALLBACK = Path("/usr/local/go/bin/go")
BUILD_TIMEOUT = 900.0  # a cold build on a small CI machine, module downloads included


class ToolchainMissing(RuntimeError):
    """The toolchain a client needs is not installed."""


def find_go() -> str | None:
    found = shutil.which("go")
    if found is not None:
        return found
    return str(GO_FALLBACK) if os.access(GO_FALLBACK, os.X_OK) else None


def go_sources(module_dir: Path = GO_DIR) -> list[Path]:
    bin_dir = module_dir / "bin"
    sources = [module_dir / "go.mod", module_dir / "go.sum"]
    sources += [p for p in module_dir.rglob("*.go") if bin_dir not in p.parents]
    return sources


def is_fresh(binary: Path, sources: list[Path]) -> bool:
    """True when ``binary`` exists and is newer than every source."""
    try:
        built = binary.stat().st_mtime
    except FileNotFoundError:
        return False
    return all(source.stat().st_mtime <= built for source in sources)


def go_build(
    module_dir: Path,
    package: str,
    binary: Path,
    sources: list[Path],
    *,
    needed_by: str,
    timeout: float = BUILD_TIMEOUT,
) -> Path:
    """``binary``, built from ``package`` of the Go module in ``module_dir`` first when it is
    missing or older than one of ``sources``. ``needed_by`` names who needs Go, for the message
    when it is not installed."""
    if is_fresh(binary, sources):
        return binary
    go = find_go()
    if go is None:
        raise ToolchainMissing(f"go not found on PATH or at {GO_FALLBACK}: {needed_by} Go >= 1.25")
    binary.parent.mkdir(exist_ok=True)
    env = {**os.environ, "CGO_ENABLED": "0"}

    def build() -> None:
        run_go_build([go, "build"], package, binary, cwd=module_dir, env=env, timeout=timeout)

    salt = f"{go_version(go)} CGO_ENABLED=0 {package}"  # the output's path is the checkout's
    restore_or_build(f"go-{binary.name}", [binary], sources, salt, build)
    return binary


def run_go_build(
    go_build: list[str],
    package: str,
    binary: Path,
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
) -> None:
    """``go_build`` (``go build`` and its flags) of ``package`` into ``binary``. Built next to
    it and renamed: an interrupted build never leaves a binary that looks up to date."""
    partial = binary.parent / f".{binary.name}.partial"
    run_build([*go_build, "-o", str(partial), package], cwd=cwd, env=env, timeout=timeout)
    os.replace(partial, binary)


def go_version(go: str) -> str:
    """``go version``'s line: part of what a built program depends on (tests.buildcache)."""
    return subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout


def build_watchclient(*, timeout: float = BUILD_TIMEOUT) -> Path:
    """The path of an up-to-date ``watchclient`` binary, built first if needed."""
    return go_build(
        GO_DIR,
        "./watchclient",
        WATCHCLIENT,
        go_sources(),
        needed_by="the client-go tests need",
        timeout=timeout,
    )


def build_informer137(*, timeout: float = BUILD_TIMEOUT) -> Path:
    """The path of an up-to-date client-go v0.37 ``informer`` binary, built first if needed."""
    return go_build(
        GO137_DIR,
        "./informer",
        INFORMER137,
        go_sources(GO137_DIR),
        needed_by="the client-go v0.37 tests need",
        timeout=timeout,
    )


def main() -> int:
    started = time.monotonic()
    try:
        path = build_watchclient()
        build_informer137()
    except ToolchainMissing as exc:
        # The same rule as the tests: skipped on a developer's machine, a failure on CI.
        if os.environ.get("CI") == "true":
            print(f"{exc} (CI=true: a missing toolchain is a failure)", file=sys.stderr)
            return 1
        print(f"{exc}: the client-go tests will be skipped", file=sys.stderr)
        return 0
    except BuildFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{path} and {INFORMER137} ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
