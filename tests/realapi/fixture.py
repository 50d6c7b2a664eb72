"""A real kube-apiserver (with etcd, in one Go process) for the tests, started and stopped here.

``tests/realapi/build.sh`` builds ``tests/realapi/bin/kubetestenv-<minor>`` for each Kubernetes
version it has a module file for (``go.mod``: the newest; ``go-<minor>.mod``: older ones);
:func:`start_kubetestenv` runs the one :data:`VERSION` names on loopback, waits for the JSON file
it writes once its ``/readyz`` is ok, and :meth:`RealApiServer.stop` ends it (SIGTERM, then
SIGKILL) and awaits it. ``KUBETESTENV_VERSION`` (e.g. ``1.34``) picks the version for a
whole test run; without it, the newest.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

HERE = Path(__file__).resolve().parent
VERSION_ENV = "KUBETESTENV_VERSION"
READY_TIMEOUT = 100.0
STOP_TIMEOUT = 30.0
# Short, so that a test sees an etcd compaction within seconds (the apiserver compacts to the
# revision it saw one interval earlier: an old revision is gone after at most two intervals).
COMPACTION_INTERVAL = "4s"
# configmaps skip the watch cache, so a configmap watch reads etcd and sees its compaction; pods
# keep the watch cache, as most resources of a real cluster do.
APISERVER_ARGS = "--watch-cache-sizes=configmaps#0"


class Unavailable(Exception):
    """The binary is missing or older than its sources (run tests/realapi/build.sh)."""


def _minor_pinned_by(modfile: Path) -> str:
    """The Kubernetes minor version (``1.37``) a module file requires."""
    found = re.search(r"^\s*k8s\.io/kubernetes v(\d+\.\d+)\.\d+", modfile.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"{modfile} does not require k8s.io/kubernetes")
    return found.group(1)


NEWEST = _minor_pinned_by(HERE / "go.mod")
VERSIONS = tuple(
    sorted(
        {NEWEST, *(p.stem.removeprefix("go-") for p in HERE.glob("go-*.mod"))},
        key=lambda v: tuple(int(part) for part in v.split(".")),
    )
)
"""Every Kubernetes minor version there is a module file for, oldest first."""
VERSION = os.environ.get(VERSION_ENV) or NEWEST
"""The version this test run starts."""
if VERSION not in VERSIONS:
    raise RuntimeError(f"{VERSION_ENV}={VERSION!r}: not one of {', '.join(VERSIONS)}")


def binary_path(version: str = VERSION) -> Path:
    return HERE / "bin" / f"kubetestenv-{version}"


def _sources(version: str) -> tuple[Path, ...]:
    modfile = HERE / ("go.mod" if version == NEWEST else f"go-{version}.mod")
    return (modfile, modfile.with_suffix(".sum"), HERE / "kubetestenv" / "main.go")


def version_tuple(version: str = VERSION) -> tuple[int, int]:
    """``"1.37"`` as ``(1, 37)``, for comparisons such as ``version_tuple() >= (1, 35)``."""
    major, minor = version.split(".")
    return int(major), int(minor)


def binary_problem(version: str = VERSION) -> str | None:
    """Why the built binary for ``version`` cannot be used, or None."""
    binary = binary_path(version)
    build = f"run bash tests/realapi/build.sh {version}"
    if not binary.exists():
        return f"{binary} is missing: {build} (needs Go)"
    built = binary.stat().st_mtime
    stale = [str(p.relative_to(HERE)) for p in _sources(version) if p.stat().st_mtime > built]
    if stale:
        return f"{binary} is older than {', '.join(stale)}: {build}"
    return None


@dataclass
class RealApiServer:
    """One running kubetestenv process and what a client needs to reach it."""

    url: str
    version: str
    """The Kubernetes minor version, e.g. ``1.37``."""
    ca_file: str
    token: str
    kubeconfig: str
    dir: Path
    port: int
    etcd_port: int
    log_path: Path
    process: subprocess.Popen[bytes]
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pki_dir(self) -> Path:
        """The CA, the apiserver's serving certificate and key, the service-account key."""
        return self.dir / "state" / "pki"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    def write_kubeconfig(self, path: Path, *, token: str, server: str | None = None) -> str:
        """A kubeconfig for ``token`` against this apiserver (or ``server``, e.g. a relay)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "real",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority": self.ca_file,
                    },
                }
            ],
            "users": [{"name": "real", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "real",
                    "context": {"cluster": "real", "user": "real", "namespace": "default"},
                }
            ],
        }
        path.write_text(json.dumps(config), encoding="utf-8")
        return str(path)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL if it hangs; the process is always reaped."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(STOP_TIMEOUT)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


def start_kubetestenv(
    state_dir: Path, *, port: int = 0, etcd_port: int = 0, extra: tuple[str, ...] = ()
) -> RealApiServer:
    """Start kubetestenv with its state in ``state_dir`` and return it once it is ready.

    Reusing ``state_dir`` and the ports of an earlier run restarts the same cluster (same etcd
    data, CA and token).
    """
    problem = binary_problem()
    if problem is not None:
        raise Unavailable(problem)
    state_dir.mkdir(parents=True, exist_ok=True)
    ready_file = state_dir / "ready.json"
    ready_file.unlink(missing_ok=True)
    log_path = state_dir / "kubetestenv.log"
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the RealApiServer, closed in stop()
    command = [
        str(binary_path()),
        "-dir",
        str(state_dir / "state"),
        "-ready-file",
        str(ready_file),
        "-port",
        str(port),
        "-etcd-port",
        str(etcd_port),
        "-compaction-interval",
        COMPACTION_INTERVAL,
        "-apiserver-args",
        APISERVER_ARGS,
        *extra,
    ]
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + READY_TIMEOUT
    info: dict[str, Any] | None = None
    try:
        while info is None:
            if process.poll() is not None:
                raise RuntimeError(f"kubetestenv exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kubetestenv not ready after {READY_TIMEOUT:.0f}s")
            if ready_file.exists():
                info = json.loads(ready_file.read_text(encoding="utf-8"))
            else:
                # A subprocess cannot be awaited together with a file appearing; a bounded
                # poll it is (the start takes seconds, the poll step is small beside it).
                time.sleep(0.1)
    except BaseException as error:
        server = RealApiServer("", VERSION, "", "", "", state_dir, 0, 0, log_path, process, log)
        tail = server.log_tail()
        server.stop()
        if isinstance(error, RuntimeError):
            raise RuntimeError(f"{error}; log tail:\n{tail}") from None
        raise
    return RealApiServer(
        url=info["url"],
        version=VERSION,
        ca_file=info["ca_file"],
        token=info["token"],
        kubeconfig=info["kubeconfig"],
        dir=state_dir,
        port=int(info["port"]),
        etcd_port=int(info["etcd_port"]),
        log_path=log_path,
        process=process,
        _log=log,
    )


def start_or_skip(state_dir: Path, *, extra: tuple[str, ...] = ()) -> RealApiServer:
    """:func:`start_kubetestenv`, or skip the test when the binary was not built — except in
    CI (CI=true), where that fails the tier."""
    try:
        return start_kubetestenv(state_dir, extra=extra)
    except Unavailable as why:
        if ci_requires_tier():
            pytest.fail(f"CI=true and the real apiserver is unavailable: {why}")
        pytest.skip(str(why))


def ci_requires_tier() -> bool:
    """In CI (CI=true) a tier that cannot run fails instead of skipping."""
    return os.environ.get("CI", "").lower() == "true"
