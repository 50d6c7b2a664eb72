"""Build the kube-rs and client-node test programs, skipping what is already up to date.

- ``kubewatch`` (``tests/clients/rust``): ``cargo build --locked`` into a target dir outside
  the checkout, ``$CARGO_TARGET_DIR`` or ``~/.cache/watchproxy/cargo-target``, so
  that a fresh clone on the same machine (CI clones afresh every run) reuses the compiled
  dependencies; the binary is then copied to the gitignored ``tests/clients/rust/bin``. A cold
  build compiles kube-rs and k8s-openapi: minutes on two cores, so ``scripts/test.sh`` runs
  this module before pytest (a build inside a test would meet pytest's 120 s timeout).
- ``informer.mjs`` (``tests/clients/node``): ``npm ci`` into the gitignored ``node_modules``
  when it is missing or older than ``package-lock.json`` (packages come from npm's cache
  when it has them).

Run it alone to build both and print the times: ``python -m tests.clients.build_rust_node``.
Without a toolchain it says so and exits 0 (the tests then skip), except with ``CI=true``,
where a missing toolchain is a failure (exit 1), as it is in the tests.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.buildcache import BuildFailed, restore_or_build, run_build

CLIENTS = Path(__file__).resolve().parent
RUST_DIR = CLIENTS / "rust"
KUBEWATCH = RUST_DIR / "bin" / "kubewatch"  # gitignored
NODE_DIR = CLIENTS / "node"
INFORMER = NODE_DIR / "informer.mjs"
# npm ci writes this file last; its age says when node_modules was installed.
NODE_STAMP = NODE_DIR / "node_modules" / ".package-lock.json"
BUILD_TIMEOUT = 1800.0  # a cold cargo build on a busy two-core machine, downloads included


class ToolchainMissing(RuntimeError):
    """The toolchain a client needs (cargo, node, npm) is not installed."""


@dataclass(frozen=True)
class NodeClient:
    node: str  # the node executable
    script: Path


def on_ci() -> bool:
    return os.environ.get("CI") == "true"


def _tool(name: str, *fallbacks: Path) -> str:
    found = shutil.which(name)
    if found is not None:
        return found
    for path in fallbacks:
        if os.access(path, os.X_OK):
            return str(path)
    raise ToolchainMissing(f"{name} not found on PATH: the kube-rs/client-node tests need it")


def _newest_source(paths: list[Path]) -> float:
    return max(p.stat().st_mtime for p in paths)


def _older_than(output: Path, sources: list[Path]) -> bool:
    try:
        return output.stat().st_mtime < _newest_source(sources)
    except FileNotFoundError:
        return True


def cargo_target_dir() -> Path:
    # cargo's own variable: a WATCHPROXY_* one would reach every watchproxy the tests start,
    # and watchproxy refuses environment variables that name no setting (exit 2).
    configured = os.environ.get("CARGO_TARGET_DIR")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "watchproxy" / "cargo-target"


def rust_sources() -> list[Path]:
    return [RUST_DIR / "Cargo.toml", RUST_DIR / "Cargo.lock", *(RUST_DIR / "src").rglob("*.rs")]


@functools.cache
def build_kubewatch(timeout: float = BUILD_TIMEOUT) -> Path:
    """The path of an up-to-date ``kubewatch`` binary, built first if needed."""
    if not _older_than(KUBEWATCH, rust_sources()):
        return KUBEWATCH
    cargo = _tool("cargo", Path.home() / ".cargo" / "bin" / "cargo")
    # rustup installs into ~/.cargo/bin, which a non-login shell (CI) may lack on PATH; cargo
    # then needs rustc from the same place.
    path = os.pathsep.join([str(Path(cargo).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "CARGO_TARGET_DIR": str(cargo_target_dir()), "PATH": path}
    command = [cargo, "build", "--locked", "--bin", "kubewatch", "--message-format=json"]

    def build() -> None:
        built = _executable(run_build(command, cwd=RUST_DIR, env=env, timeout=timeout))
        # The artifact's own path (target/debug/deps/kubewatch-<hash>) is per checkout, unlike
        # target/debug/kubewatch, which another checkout sharing the target dir may overwrite.
        # Copy, then rename: an interrupted copy never looks up to date.
        KUBEWATCH.parent.mkdir(exist_ok=True)
        partial = KUBEWATCH.with_name(".kubewatch.partial")
        shutil.copy2(built, partial)
        os.replace(partial, KUBEWATCH)
        KUBEWATCH.touch()  # newer than the sources even when cargo had nothing to do

    version = run_build([cargo, "--version"], cwd=RUST_DIR, env=env, timeout=timeout)
    restore_or_build("kubewatch", [KUBEWATCH], rust_sources(), f"{version} --locked", build)
    return KUBEWATCH


def _executable(cargo_json: str) -> Path:
    """The kubewatch executable named in cargo's ``--message-format=json`` output."""
    for raw in cargo_json.splitlines():
        if not raw.startswith("{"):
            continue
        message = json.loads(raw)
        if (
            message.get("reason") == "compiler-artifact"
            and message.get("executable")
            and message["target"]["name"] == "kubewatch"
        ):
            return Path(message["executable"])
    raise BuildFailed("cargo build reported no kubewatch executable")


@functools.cache
def prepare_informer(timeout: float = BUILD_TIMEOUT) -> NodeClient:
    """node and the informer script, with ``node_modules`` installed by ``npm ci`` if needed."""
    node = _tool("node")
    sources = [NODE_DIR / "package.json", NODE_DIR / "package-lock.json"]
    if _older_than(NODE_STAMP, sources):
        npm = _tool("npm")
        command = [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
        run_build(command, cwd=NODE_DIR, timeout=timeout)
    return NodeClient(node, INFORMER)


def main() -> int:
    status = 0
    for what, build in (("kubewatch", build_kubewatch), ("informer", prepare_informer)):
        started = time.monotonic()
        try:
            result = build()
        except ToolchainMissing as exc:
            print(f"{what}: {exc}{' (CI=true: failing)' if on_ci() else ' (tests will skip)'}")
            status = 1 if on_ci() else status
            continue
        except BuildFailed as exc:
            print(f"{what}: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{what}: {result} ready in {time.monotonic() - started:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
