"""Built test programs kept by the digest of what they are built from, so that a fresh clone
(CI's) restores them instead of building them again.

Each program's builder (Go, Maven) has a cache of its own, but a fresh clone has no binary, and
even a warm ``go build`` of client-go links for seconds, and ``mvn package`` starts a JVM and
shades its jars again: 70-80 s of every CI run, for outputs that had not changed. Here the
outputs are stored under ``~/.cache/watchproxy/built/<name>-<digest>/`` after a build and copied
into place when the same inputs come again. The digest covers the inputs' paths (relative to the
repository) and contents and a ``salt`` that names what else the output depends on: the
toolchain's version and the build's flags. The newest three entries of each name are kept.

From Python: :func:`restore_or_build`. From a shell script (``tests/realapi/build.sh``)::

    python3 -m tests.buildcache NAME --salt "$(go version) $flags" --output bin/x \\
        --inputs FILE... -- go build -o bin/x ./x
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "watchproxy" / "built"
KEEP = 3  # entries per name


def digest(inputs: Iterable[Path], salt: str) -> str:
    sha = hashlib.sha256(salt.encode())
    for path in sorted({p.resolve() for p in inputs}):
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        sha.update(b"\0" + str(name).encode() + b"\0")
        sha.update(path.read_bytes())
    return sha.hexdigest()[:24]


class BuildFailed(RuntimeError):
    """The toolchain is there but the build failed (the message carries its output)."""


def run_build(
    command: Sequence[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> str:
    """Run one build step (``go build``, ``mvn package``, ``cargo build``, ``npm ci``); its
    stdout. :class:`BuildFailed` when it fails or outlasts ``timeout``, with the end of what it
    printed on both streams (Maven reports errors on stdout, Go and cargo on stderr)."""
    what = " ".join(command)
    try:
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildFailed(f"{what} did not finish within {timeout:.0f} s") from exc
    if done.returncode != 0:
        raise BuildFailed(
            f"{what} failed ({done.returncode}):\n{done.stdout[-6000:]}{done.stderr[-6000:]}"
        )
    return done.stdout


def _place(source: Path, target: Path) -> None:
    """Copy, then rename: an interrupted copy never looks like an output. The mtime is now's,
    newer than the sources, which is how the tests tell a stale program."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copy2(source, partial)
    os.replace(partial, target)
    target.touch()


def _prune(name: str) -> None:
    entries = sorted(CACHE.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def restore_or_build(
    name: str,
    outputs: Sequence[Path],
    inputs: Iterable[Path],
    salt: str,
    build: Callable[[], None],
) -> bool:
    """Put ``outputs`` in place: from the cache when ``inputs`` and ``salt`` are those of a
    stored build (True), else by calling ``build`` and storing what it made (False)."""
    entry = CACHE / f"{name}-{digest(inputs, salt)}"
    if all((entry / output.name).is_file() for output in outputs):
        for output in outputs:
            _place(entry / output.name, output)
        entry.touch()
        return True
    build()
    partial = entry.with_name(f".{entry.name}.{os.getpid()}")
    partial.mkdir(parents=True, exist_ok=True)
    for output in outputs:
        shutil.copy2(output, partial / output.name)
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(partial, entry)
    _prune(name)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.buildcache")
    parser.add_argument("name")
    parser.add_argument("--salt", required=True)
    parser.add_argument("--output", action="append", type=Path, required=True)
    parser.add_argument("--inputs", nargs="+", type=Path, required=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("a build command after --")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]

    def build() -> None:
        subprocess.run(command, check=True)

    try:
        restored = restore_or_build(args.name, args.output, args.inputs, args.salt, build)
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1
    if restored:
        print(f"{args.name}: restored from {CACHE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
