"""A copy of this working tree with the modules of ``setup.py``'s ``COMPILED_MODULES`` compiled
by mypyc: what the suite's compiled tier and ``bench.controller --build compiled`` run.

    .venv/bin/python -m tests.compiledtree      # prints the copy's path; rebuilds what is stale

The copy holds the files git tracks (and new ones it does not ignore) as they are in the working
tree now, each compiled module's extension beside its ``.py`` (Python imports the extension),
and mypyc's shared runtime module at the top. The programs other steps built (``bin/``
directories, ``node_modules``) are linked, not copied. Run everything there with the copy's root
first on ``PYTHONPATH`` (:func:`environment`), so that child processes import the copy too and
not the editable install of this tree.

The compiled objects are cached under ``~/.cache/watchproxy/compiled`` by the digest of what
they are made from: every module of the package (mypyc reads the types of what the compiled
modules import), ``setup.py`` and mypy's version. A change to the tests only copies files, into
a new copy: one in use is never changed (the three newest copies are kept).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "watchproxy" / "compiled"
# Set in the compiled tier: tests/unit/test_compiled.py then requires the compiled modules.
MARKER = "TEST_COMPILED"
# Built by other steps of scripts/test.sh and ignored by git: linked into the copy.
_LINKED = ("bin", "node_modules")


def compiled_modules() -> list[str]:
    """``setup.py``'s list, as module names (``watchproxy.upstream.pool``)."""
    tree = ast.parse((ROOT / "setup.py").read_text(), "setup.py")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "COMPILED_MODULES"
            for target in node.targets
        ):
            paths = ast.literal_eval(node.value)
            return [str(path).removesuffix(".py").replace("/", ".") for path in paths]
    raise AssertionError("setup.py has no COMPILED_MODULES list")


def _git_files(*options: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", *options], cwd=ROOT, check=True, capture_output=True
    ).stdout
    return [name for name in out.decode().split("\0") if name]


def _digest(files: list[str], *, code_only: bool) -> str:
    """The digest of ``files``' paths and contents (``code_only``: those mypyc reads), and of
    mypy's version."""
    digest = hashlib.sha256(importlib.metadata.version("mypy").encode())
    for name in sorted(files):
        if not code_only or name.startswith("watchproxy/") or name == "setup.py":
            digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _build(objects: Path, files: list[str]) -> None:
    """Compile into ``objects``: the extensions, at their paths relative to the tree's root."""
    work = objects.with_name(f"{objects.name}.partial-{os.getpid()}")
    new = objects.with_name(f"{objects.name}.new-{os.getpid()}")
    for name in files:
        if name.startswith(("watchproxy/", "buildsupport/")) or name == "setup.py":
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")
    env = {**os.environ, "WATCHPROXY_COMPILE": "1"}
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "--parallel", "2"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        sys.stderr.write(build.stdout[-4000:] + build.stderr[-4000:])
        raise SystemExit(f"tests.compiledtree: mypyc could not compile {work}")
    for extension in work.rglob("*.so"):
        if "build" in extension.relative_to(work).parts:
            continue
        target = new / extension.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(extension, target)
    new.rename(objects)
    shutil.rmtree(work)


def _linked_builds() -> list[str]:
    """Ignored directories other steps build (``bin/``, ``node_modules``)."""
    ignored = _git_files("--others", "--ignored", "--exclude-standard", "--directory")
    return [name.rstrip("/") for name in ignored if Path(name.rstrip("/")).name in _LINKED]


def build() -> Path:
    """The compiled copy of the working tree as it is now: made once per content, and never
    changed after (a copy in use by a running suite or benchmark stays as it was)."""
    files = [
        name
        for name in _git_files("--cached", "--others", "--exclude-standard")
        if (ROOT / name).is_file()
    ]
    objects = CACHE / f"objects-{_digest(files, code_only=True)}"
    if not objects.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        _build(objects, files)
    tree = CACHE / f"tree-{_digest(files, code_only=False)}"
    if tree.is_dir():
        return tree
    partial = tree.with_name(f"{tree.name}.partial-{os.getpid()}")
    for name in files:
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, partial / name)  # mtimes kept: build steps compare them
    for extension in objects.rglob("*.so"):
        target = partial / extension.relative_to(objects)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(extension, target)
    for name in _linked_builds():
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        (partial / name).symlink_to(ROOT / name)
    partial.rename(tree)
    _prune("tree-", keep=3)
    _prune("objects-", keep=3)
    return tree


def _prune(prefix: str, *, keep: int) -> None:
    """Remove all but the ``keep`` newest complete entries named ``prefix``*."""
    entries = [
        entry for entry in CACHE.glob(prefix + "*") if entry.is_dir() and "." not in entry.name
    ]
    entries.sort(key=lambda entry: entry.stat().st_mtime, reverse=True)
    for entry in entries[keep:]:
        shutil.rmtree(entry, ignore_errors=True)


def environment(tree: Path) -> dict[str, str]:
    """The environment to run the copy in: its root first on ``PYTHONPATH``."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{path}" if path else str(tree)}


if __name__ == "__main__":
    print(build())
