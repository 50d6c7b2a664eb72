"""The import contracts in pyproject.toml hold, and really fail on a violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("watchproxy", "kubefake", "bench"):
        shutil.copytree(ROOT / package, tree / package, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is a test dependency")
@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("watchproxy/kube/apipath.py", "import aiohttp", "never import aiohttp"),
        ("watchproxy/kube/kubeconfig.py", "import subprocess", "protocol package does no I/O"),
        ("watchproxy/kube/headers.py", "import os", "protocol package does no I/O"),
        ("watchproxy/policy/backoff.py", "import uvloop", "Only the command line imports uvloop"),
        ("watchproxy/hub/watchkey.py", "import watchproxy.server.api", "Layers"),
        ("watchproxy/hub/watchkey.py", "import watchproxy.lists.cover", "Layers"),
        ("watchproxy/lists/batch.py", "import watchproxy.server.api", "Layers"),
        ("watchproxy/lists/cover.py", "import aiohttp", "never import aiohttp"),
        ("watchproxy/lists/consistent.py", "import aiohttp", "never import aiohttp"),
        ("watchproxy/server/api.py", "import aiohttp", "The API port is one stack"),
        ("watchproxy/server/protocol.py", "import aiohttp.web", "The API port is one stack"),
        ("watchproxy/errors.py", "import watchproxy.config", "Layers"),
        ("watchproxy/app.py", "import kubefake", "never imports the fake"),
    ],
)
def test_a_forbidden_import_breaks_the_contracts(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    tree = _copy_tree(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}  # deliberately broken\n")
    result = _lint_imports(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    broken_lines = [ln for ln in result.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(broken in ln for ln in broken_lines) or broken in result.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is a test dependency")
def test_the_tree_as_committed_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint_imports(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
