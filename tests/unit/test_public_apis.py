"""The product uses the libraries it runs on through their public APIs only.

A private name of aiohttp, prometheus_client, multidict, yarl, httptools or uvloop changes
without notice in a patch release (watchproxy once overrode prometheus_client's private
methods and read aiohttp's ``web.Server._kwargs``). Checked over every module of
``watchproxy``, from its syntax tree:

- no import of a private module or name (``from prometheus_client._x import``,
  ``from aiohttp import _y``);
- no attribute with a leading underscore reached from a library's module or from a name
  imported from it (``web.Server._kwargs``, ``prometheus_client.values._x``);
- no class that subclasses one of the library's classes defines a method with a leading
  underscore that the library's class has (an override of its private API).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "watchproxy"
LIBRARIES = ("aiohttp", "prometheus_client", "multidict", "yarl", "httptools", "uvloop")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _library_of(module: str) -> str | None:
    root = module.split(".")[0]
    return root if root in LIBRARIES else None


def private_uses(source: str, filename: str = "<source>") -> list[str]:
    """Every use of a library's private API in ``source``, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    imported: dict[str, str] = {}  # a local name -> the library's dotted name it stands for
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _library_of(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{filename}:{node.lineno}: import {alias.name}")
                    local = alias.asname or alias.name.split(".")[0]
                    imported[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module and _library_of(node.module):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if any(_private(part) for part in dotted.split(".")):
                    found.append(f"{filename}:{node.lineno}: from {dotted}")
                imported[alias.asname or alias.name] = dotted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in imported:
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ClassDef):
            found += _private_overrides(node, imported, filename)
    return found


def _private_overrides(node: ast.ClassDef, imported: dict[str, str], filename: str) -> list[str]:
    found: list[str] = []
    for base in node.bases:
        dotted = _dotted(base, imported)
        if dotted is None:
            continue
        module, _, name = dotted.rpartition(".")
        library_class = getattr(importlib.import_module(module), name)
        for item in node.body:
            if (
                isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and _private(item.name)
                and hasattr(library_class, item.name)
            ):
                where = f"{filename}:{item.lineno}"
                found.append(f"{where}: {node.name}.{item.name} overrides {dotted}")
    return found


def _dotted(base: ast.expr, imported: dict[str, str]) -> str | None:
    """The library's dotted name for a base class expression, or None (not a library's)."""
    parts: list[str] = []
    while isinstance(base, ast.Attribute):
        parts.insert(0, base.attr)
        base = base.value
    if isinstance(base, ast.Name) and base.id in imported:
        return ".".join([imported[base.id], *parts])
    return None


def test_no_module_of_watchproxy_uses_a_librarys_private_api() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 50, f"only {len(paths)} modules under {PACKAGE}"
    found: list[str] = []
    for path in paths:
        found += private_uses(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    assert not found, "private API of a library in use:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "from aiohttp import web\nweb.Server._kwargs\n",
        "import prometheus_client\nprometheus_client.values._ValueClass\n",
        "from prometheus_client.values import _x\n",
        "from aiohttp._http_parser import HttpRequestParser\n",
        "import aiohttp._websocket\n",
        "from prometheus_client import Counter\n"
        "class Mine(Counter):\n    def _metric_init(self) -> None: ...\n",
        "from aiohttp import connector as c\n"
        "class Mine(c.TCPConnector):\n    async def _create_connection(self): ...\n",
    ],
)
def test_the_check_finds_each_kind_of_private_use(source: str) -> None:
    assert private_uses(source)


def test_the_check_leaves_public_uses_and_own_private_names_alone() -> None:
    source = (
        "from aiohttp import web\nfrom prometheus_client import Counter\n"
        "class Mine(Counter):\n    def _own_helper(self) -> None: ...\n"
        "class Other:\n    def _x(self) -> None: self._y = web.Response\n"
    )
    assert private_uses(source) == []
