"""No import cycle among watchproxy's modules, counting every import statement: those under
``if TYPE_CHECKING:``, inside functions and under ``if __name__ == "__main__":`` too (issue 42).

A cycle is two modules that each depend on the other, which hides a concept in the wrong one of
them: move it where it belongs. A lazy import or wiring after construction only hides the cycle
from the interpreter, not from this test. The layer contracts of ``lint-imports`` (pyproject)
look only between packages; this looks at every module. grimp, import-linter's graph builder,
reads the imports (``TYPE_CHECKING`` ones included unless told otherwise).
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest


def import_graph(package: str = "watchproxy") -> grimp.ImportGraph:
    return grimp.build_graph(package, cache_dir=None)


def import_cycles(graph: grimp.ImportGraph) -> set[frozenset[str]]:
    """Every set of modules that import each other, directly or through others (each strongly
    connected component of the import graph with more than one module)."""
    cycles = set()
    for module in graph.modules:
        others = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if others:
            cycles.add(frozenset({module, *others}))
    return cycles


def describe(graph: grimp.ImportGraph, cycle: frozenset[str]) -> str:
    lines = []
    for importer in sorted(cycle):
        for imported in sorted(cycle & graph.find_modules_directly_imported_by(importer)):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']}: {detail['line_contents']}")
    return "\n".join(lines)


def test_watchproxy_modules_import_each_other_in_one_direction_only() -> None:
    graph = import_graph()
    assert "watchproxy.cli" in graph.modules
    unexpected = import_cycles(graph)
    assert not unexpected, "import cycles (move the shared concept where it belongs):\n" + (
        "\n".join(describe(graph, cycle) for cycle in sorted(unexpected, key=sorted))
    )


def test_imports_under_type_checking_in_functions_and_main_close_cycles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic.b import B\n\nclass A: ...\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from cyclic.a import A\n\n"
        "class B: ...\n"
    )
    (package / "c.py").write_text("def f() -> None:\n    from cyclic.d import g\n")
    (package / "d.py").write_text(
        'def g() -> None: ...\n\nif __name__ == "__main__":\n    import cyclic.c\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cycles = import_cycles(import_graph("cyclic"))
    assert cycles == {frozenset({"cyclic.a", "cyclic.b"}), frozenset({"cyclic.c", "cyclic.d"})}
