"""The real-node tier's container images, built without a registry and cached by content.

    python -m tests.realnode.images        # build what is missing, print the archives

- ``watchproxy:<version>`` (the name ``watchproxy inject`` and the manifests use; containerd
  resolves it to ``docker.io/library/watchproxy:<version>``): scripts/image.sh's build of the
  Dockerfile, exported as an OCI archive.
- ``wprn-app:1``: the image's Debian base (mmdebstrap, made by scripts/image.sh) plus kubectl
  1.37 (tests/realapi/build.sh). The tests' apps run it; with its default command (``sleep
  infinity``) it is also the pods' sandbox ("pause") image, since no registry serves
  registry.k8s.io/pause here.
- ``wprn-clients:1``: the same base plus the apps' own clients, a client-go informer and the
  Python client (tests/realnode/clientsimage.py).

Each archive is named by a hash of what goes into it, in ``~/.cache/watchproxy/realnode``; an
archive that exists is not built again, so a warm run imports the same files and builds nothing.
The node imports them with ``ctr images import``.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.realnode import clientsimage

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "watchproxy" / "realnode"
VERSION = re.search(r'^version = "(.*)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
WATCHPROXY_IMAGE = f"watchproxy:{VERSION}"
APP_IMAGE = "wprn-app:1"
BASE_IMAGE = "localhost/watchproxy-base:bookworm-python3.11"
# What the Dockerfile copies, and the recipes themselves.
IMAGE_INPUTS = (
    "Dockerfile",
    "scripts/image.sh",
    "pyproject.toml",
    "setup.py",
    "README.md",
    "LICENSE",
    "constraints.txt",
    "config.example.yaml",
    "buildsupport",
    "watchproxy",
)
KUBECTL = REPO / "tests" / "realapi" / "bin" / "kubectl.1.37"
KEEP_OLDER = 4


def _digest(paths: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts or f.suffix in (".so", ".pyc"):
                continue
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def watchproxy_archive() -> Path:
    return CACHE / f"watchproxy-{_digest([REPO / p for p in IMAGE_INPUTS])}.oci.tar"


def app_archive() -> Path:
    # The kubectl binary by size and mtime: hashing 80 MB on every run costs a second.
    stat = KUBECTL.stat() if KUBECTL.exists() else None
    stamp = f"{stat.st_size}-{stat.st_mtime_ns}" if stat else "none"
    return CACHE / f"app-{_digest([REPO / 'scripts/image.sh', HERE / 'images.py'], stamp)}.oci.tar"


def clients_archive() -> Path:
    inputs = clientsimage.inputs()
    return CACHE / f"clients-{_digest(inputs, clientsimage.stamp())}.oci.tar"


def archives() -> list[Path]:
    return [watchproxy_archive(), app_archive(), clients_archive()]


def missing() -> list[Path]:
    return [a for a in archives() if not a.exists()]


def _run(*command: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def _export(image: str, archive: Path, name: str) -> None:
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    # The reference inside the archive is the name containerd gives the image on import.
    _run("buildah", "push", "--quiet", image, f"oci-archive:{partial}:docker.io/library/{name}")
    partial.rename(archive)
    # Older builds go, but not the last few: worktrees that differ under watchproxy/ share
    # this cache, and each would otherwise delete the other's archive on every build.
    older = sorted(
        (p for p in CACHE.glob(f"{archive.name.split('-')[0]}-*.oci.tar") if p != archive),
        key=lambda p: p.stat().st_mtime,
    )
    for old in older[:-KEEP_OLDER]:
        old.unlink(missing_ok=True)


def build_watchproxy(archive: Path) -> None:
    tag = f"localhost/watchproxy-realnode:{archive.stem.split('-')[1].split('.')[0]}"
    print(_run("bash", "scripts/image.sh", "build", env={"IMAGE": tag}), file=sys.stderr)
    _export(tag, archive, WATCHPROXY_IMAGE)
    _run("buildah", "rmi", tag)


def build_app(archive: Path) -> None:
    if not KUBECTL.exists():
        raise SystemExit(f"{KUBECTL} is missing: run bash tests/realapi/build.sh")
    container = _run("buildah", "from", "--quiet", BASE_IMAGE)
    try:
        _run(
            "buildah",
            "copy",
            "--quiet",
            "--chmod",
            "0755",
            container,
            str(KUBECTL),
            "/usr/local/bin/kubectl",
        )
        # The base is a plain root filesystem (podman import): no PATH of its own.
        _run(
            "buildah", "config", "--cmd", '["/bin/sleep", "infinity"]', "--user", "65532:65532",
            "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", container,
        )  # fmt: skip
        tag = "localhost/wprn-app:build"
        _run("buildah", "commit", "--quiet", container, tag)
    finally:
        _run("buildah", "rm", container)
    _export(tag, archive, APP_IMAGE)
    _run("buildah", "rmi", tag)


def build_clients(archive: Path) -> None:
    tag = "localhost/wprn-clients:build"
    clientsimage.build(BASE_IMAGE, tag)
    _export(tag, archive, clientsimage.CLIENTS_IMAGE)
    _run("buildah", "rmi", tag)


def main() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    watchproxy, app, clients = archives()
    if not watchproxy.exists():
        started = time.monotonic()
        build_watchproxy(watchproxy)
        print(f"built {watchproxy.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if not app.exists():
        started = time.monotonic()
        build_app(app)
        print(f"built {app.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if not clients.exists():
        started = time.monotonic()
        build_clients(clients)
        print(f"built {clients.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    for archive in (watchproxy, app, clients):
        print(archive)


if __name__ == "__main__":
    main()
