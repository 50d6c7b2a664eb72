"""Build the JVM test programs (tests/clients/java), skipping the build when they are up to date.

``mvn package`` builds one self-contained (shaded) jar per client, copied to the gitignored
``tests/clients/java/bin``:

- ``fabric8-informers.jar``: fabric8 kubernetes-client informers (default ``Config``, or
  ``--http-only`` for ``onlyHttpWatches``);
- ``client-java-informers.jar``: the official client-java's ``SharedInformerFactory`` informers.

Maven keeps downloaded artifacts in its local repository (``~/.m2/repository``, or wherever
the user's Maven settings put it), so only the first build downloads from Maven Central; the
build output goes to a directory outside the checkout (``$XDG_CACHE_HOME`` or ``~/.cache``,
``watchproxy/java-target``, one directory per checkout), so a fresh clone leaves no
``target/`` trees behind. ``scripts/test.sh`` runs this module before pytest: a cold build
(downloads included) takes about a minute, more than a test should wait.

Run it alone to build and print the time: ``python -m tests.clients.build_java``. Without Java
or Maven it says so and exits 0 (the tests then skip), except with ``CI=true``, where a missing
toolchain is a failure (exit 1), as it is in the tests.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.buildcache import BuildFailed, restore_or_build, run_build

JAVA_DIR = Path(__file__).resolve().parent / "java"
BIN_DIR = JAVA_DIR / "bin"  # gitignored
FABRIC8_JAR = BIN_DIR / "fabric8-informers.jar"
CLIENT_JAVA_JAR = BIN_DIR / "client-java-informers.jar"
# module artifactId -> the jar its pom's finalName makes
MODULES = {"fabric8-informers": FABRIC8_JAR.name, "client-java-informers": CLIENT_JAVA_JAR.name}
BUILD_TIMEOUT = 900.0  # a cold build on a small CI machine, downloads included


class ToolchainMissing(RuntimeError):
    """java or mvn is not installed."""


@dataclass(frozen=True)
class JavaPrograms:
    java: str  # the java executable
    fabric8: Path
    client_java: Path


def on_ci() -> bool:
    return os.environ.get("CI") == "true"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ToolchainMissing(
            f"{name} not found on PATH: the JVM client tests need Java >= 17 and Maven"
            " (apt-get install openjdk-17-jdk-headless maven)"
        )
    return found


def sources() -> list[Path]:
    return [*JAVA_DIR.rglob("pom.xml"), *JAVA_DIR.rglob("*.java")]


def _fresh(jars: list[Path], inputs: list[Path]) -> bool:
    try:
        built = min(jar.stat().st_mtime for jar in jars)
    except FileNotFoundError:
        return False
    return all(source.stat().st_mtime <= built for source in inputs)


def build_dir() -> Path:
    """Maven's output directory for this checkout's modules, outside the checkout: one per
    checkout (Maven takes no lock, so two checkouts building at once must not share one)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    checkout = hashlib.sha256(str(JAVA_DIR).encode()).hexdigest()[:12]
    return cache / "watchproxy" / "java-target" / checkout


@functools.cache
def build_java_clients(timeout: float = BUILD_TIMEOUT) -> JavaPrograms:
    """java and the two up-to-date jars, built first if needed."""
    java = _tool("java")
    jars = [FABRIC8_JAR, CLIENT_JAVA_JAR]
    if _fresh(jars, sources()):
        return JavaPrograms(java, FABRIC8_JAR, CLIENT_JAVA_JAR)
    mvn = _tool("mvn")
    out = build_dir()
    command = [
        mvn,
        "--batch-mode",
        "--quiet",
        "--no-transfer-progress",
        f"-Dwatchproxy.build.dir={out}",
        "package",
    ]

    def build() -> None:
        run_build(command, cwd=JAVA_DIR, timeout=timeout)
        BIN_DIR.mkdir(exist_ok=True)
        for module, jar in MODULES.items():
            # Copy, then rename: an interrupted copy never looks up to date.
            partial = BIN_DIR / f".{jar}.partial"
            shutil.copy2(out / module / jar, partial)
            os.replace(partial, BIN_DIR / jar)
            (BIN_DIR / jar).touch()  # newer than the sources even when Maven had nothing to do

    # The toolchain's real paths carry its versions (/usr/lib/jvm/java-17-openjdk-amd64/...).
    salt = f"{os.path.realpath(java)} {os.path.realpath(mvn)} package"
    restore_or_build("java-informers", jars, sources(), salt, build)
    return JavaPrograms(java, FABRIC8_JAR, CLIENT_JAVA_JAR)


def main() -> int:
    started = time.monotonic()
    try:
        programs = build_java_clients()
    except ToolchainMissing as exc:
        print(f"{exc}{' (CI=true: failing)' if on_ci() else ' (tests will skip)'}")
        return 1 if on_ci() else 0
    except BuildFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"{programs.fabric8} and {programs.client_java} ready in {time.monotonic() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
