"""The image of the apps' own Kubernetes clients (``wprn-clients:1``), for pods of the real-node
tier that watch through the sidecar with something other than kubectl:

- ``/usr/local/bin/informer``: tests/clients/go137's client-go v0.37 informer, built static
  (``CGO_ENABLED=0``: the image has no C library it could link against at run time it was
  built for);
- ``/usr/local/bin/pywatch.py``: tests/clients/pywatch.py, with the official ``kubernetes``
  package (the version the test environment pins) and its dependencies in ``/opt/pyclient``,
  installed from PyPI for the image's Python 3.11 by the test environment's pip.

On the same Debian base as the other images (scripts/image.sh). The archive is named by a hash
of the Go module, the two programs, the pinned version and this file: a warm run builds
nothing. tests/realnode/images.py builds and lists it with the others.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CLIENTS_IMAGE = "wprn-clients:1"
GO_MODULE = REPO / "tests" / "clients" / "go137"
PYWATCH = REPO / "tests" / "clients" / "pywatch.py"
# The Python client the other tiers run (pyproject's test dependencies, installed in .venv).
KUBERNETES_VERSION = metadata.version("kubernetes")


def inputs() -> list[Path]:
    # Not the module directory itself: its bin/ is a link to built binaries.
    return [
        GO_MODULE / "go.mod",
        GO_MODULE / "go.sum",
        GO_MODULE / "informer",
        PYWATCH,
        Path(__file__).resolve(),
    ]


def stamp() -> str:
    return f"kubernetes=={KUBERNETES_VERSION}"


def _go() -> str:
    found = shutil.which("go")
    if found is None and Path("/usr/local/go/bin/go").exists():
        found = "/usr/local/go/bin/go"
    if found is None:
        raise SystemExit("go not found: the clients image needs Go >= 1.26")
    return found


def _run(*command: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def build(base_image: str, tag: str) -> None:
    """Build the image as ``tag`` (the caller exports it)."""
    with tempfile.TemporaryDirectory(prefix="wprn-clients-") as work:
        informer = Path(work) / "informer"
        _run(
            _go(), "build", "-trimpath", "-ldflags=-s -w", "-o", str(informer), "./informer",
            cwd=GO_MODULE, env={"CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"},
        )  # fmt: skip
        site = Path(work) / "pyclient"
        _run(
            sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
            "--disable-pip-version-check", "--target", str(site),
            "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
            "--platform", "manylinux2014_x86_64", f"kubernetes=={KUBERNETES_VERSION}",
        )  # fmt: skip
        container = _run("buildah", "from", "--quiet", base_image)
        try:
            for source, target, mode in (
                (informer, "/usr/local/bin/informer", "0755"),
                (PYWATCH, "/usr/local/bin/pywatch.py", "0755"),
                (site, "/opt/pyclient", "0755"),
            ):
                _run("buildah", "copy", "--quiet", "--chmod", mode, container, str(source), target)
            _run(
                "buildah", "config", "--cmd", '["/bin/sleep", "infinity"]',
                "--user", "65532:65532",
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "PYTHONPATH=/opt/pyclient",
                "--env", "PYTHONDONTWRITEBYTECODE=1",
                container,
            )  # fmt: skip
            _run("buildah", "commit", "--quiet", container, tag)
        finally:
            _run("buildah", "rm", container)
