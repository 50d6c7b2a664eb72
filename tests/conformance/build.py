"""Build ``tests/conformance/bin/conformance``: Kubernetes' own API e2e specs (k8s.io/kubernetes
v1.37.2's ``test/e2e/apimachinery``, ``auth`` and ``instrumentation``) in a ginkgo program of
ours, for the conformance tier (``tests/realapi/test_conformance.py``).

Built by ``scripts/test.sh`` before pytest, like the other Go programs, and skipped when the
binary is newer than its sources. The flags are the ones ``tests/realapi/build.sh`` gives
kubetestenv (``-trimpath``, ``-mod=readonly``, cgo as Go's default): Go's build cache is keyed
by them, so the thousands of Kubernetes packages both programs share are compiled once. Run it
alone to (re)build and print the time: ``python -m tests.conformance.build``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.buildcache import restore_or_build
from tests.clients.build import (
    BuildFailed,
    ToolchainMissing,
    find_go,
    go_sources,
    go_version,
    is_fresh,
    run_go_build,
)

HERE = Path(__file__).resolve().parent
BINARY = HERE / "bin" / "conformance"  # gitignored
# A cold build took 14 minutes wall and 4.5 CPU-minutes on two cores shared with other builds
# (kubetestenv's packages already in Go's build cache); without them, longer.
BUILD_TIMEOUT = 1800.0
# Stamped as kube-apiserver's own release is (tests/realapi/build.sh says why): the specs
# compare the client's version with the server's.
STAMPED = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release go.mod pins, e.g. ``v1.37.2``."""
    for line in (HERE / "go.mod").read_text(encoding="utf-8").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "k8s.io/kubernetes":
            return words[1]
    raise RuntimeError(f"{HERE / 'go.mod'} does not require k8s.io/kubernetes")


def ldflags(version: str) -> str:
    minor = version.removeprefix("v1.").split(".")[0]
    stamp = []
    for package in STAMPED:
        stamp += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor=1",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(["-s", "-w", *stamp])


def build(*, timeout: float = BUILD_TIMEOUT) -> Path:
    """The path of an up-to-date conformance binary, built first if needed."""
    if is_fresh(BINARY, go_sources(HERE)):
        return BINARY
    go = find_go()
    if go is None:
        raise ToolchainMissing("go not found: the conformance tier needs Go >= 1.26")
    BINARY.parent.mkdir(exist_ok=True)
    flags = ["-trimpath", f"-ldflags={ldflags(kubernetes_version())}"]
    env = {**os.environ, "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=readonly".strip()}

    def run_build() -> None:
        run_go_build([go, "build", *flags], ".", BINARY, cwd=HERE, env=env, timeout=timeout)

    salt = f"{go_version(go)} {env['GOFLAGS']} {' '.join(flags)}"  # not the output's path
    restore_or_build("conformance", [BINARY], go_sources(HERE), salt, run_build)
    return BINARY


def main() -> int:
    started = time.monotonic()
    try:
        path = build()
    except ToolchainMissing as exc:
        # As the client programs: skipped on a developer's machine, a failure on CI.
        if os.environ.get("CI") == "true":
            print(f"{exc} (CI=true: a missing toolchain is a failure)", file=sys.stderr)
            return 1
        print(f"{exc}: the conformance tier will be skipped", file=sys.stderr)
        return 0
    except BuildFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{path} ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
