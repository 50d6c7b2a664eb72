"""scripts/compatibility.py: its cells from JUnit results, and rows that name real tests."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "compatibility", ROOT / "scripts" / "compatibility.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compatibility"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.realapi.test_parity" name="test_a[x]" />
<testcase classname="tests.realapi.test_parity" name="test_a[y]">
  <failure message="boom" /></testcase>
<testcase classname="tests.realapi.test_protobuf" name="test_p">
  <skipped message="no protoc" /></testcase>
<testcase classname="tests.realapi.test_upgrades" name="test_u" />
</testsuite></testsuites>
"""


def test_cells_say_pass_fail_skipped_or_not_run(tmp_path: Path) -> None:
    compat = script()
    path = tmp_path / "r.xml"
    path.write_text(JUNIT)
    run = compat.results(path)
    row = compat.Row
    assert compat.cell(row("c", "f", ("test_parity::",)), run) == "FAIL (1 of 2)"
    assert compat.cell(row("c", "f", ("test_protobuf::",)), run) == "skipped: no protoc"
    assert compat.cell(row("c", "f", ("test_upgrades::",)), run) == "pass"
    assert compat.cell(row("c", "f", ("test_nothing::",)), run) == "-"
    page = compat.render({"1.37": run}, "2026-12-05")
    assert "| HTTP | request parity table (statuses as the apiserver's) | FAIL (1 of 2) |" in page


def test_every_row_names_tests_that_exist() -> None:
    for row in script().ROWS:
        for prefix in row.tests:
            module, _, name = prefix.partition("::")
            function, _, param = name.partition("[")
            source = (ROOT / "tests" / "realapi" / f"{module}.py").read_text()
            defined = re.findall(r"^(?:async )?def (test_\w+)", source, re.M)
            assert any(d.startswith(function) for d in defined), prefix
            # A parametrized test's id (up to "]") is a string of its module.
            if param:
                assert f'"{param.removesuffix("]")}"' in source, prefix


def test_a_merge_updates_only_the_rows_its_run_proves(tmp_path: Path) -> None:
    compat = script()
    path = tmp_path / "r.xml"
    path.write_text(JUNIT)
    full = compat.render({"1.37": compat.results(path), "1.34": compat.results(path)}, "day 1")
    partial = tmp_path / "p.xml"
    partial.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.realapi.test_upgrades" name="test_u"><failure /></testcase>'
        "</testsuite></testsuites>"
    )
    merged = compat.render({"1.37": compat.results(partial)}, "day 2", full)
    # The partial run's row changes in its version's column only; the others keep their cells.
    assert (
        "| kubectl 1.27 / 1.33 / 1.37 | exec refusals over SPDY and WebSocket as direct |"
        " FAIL (1 of 1) | pass |" in merged
    )
    assert (
        "| HTTP | request parity table (statuses as the apiserver's) | FAIL (1 of 2) |"
        " FAIL (1 of 2) |" in merged
    )
    assert "Whole tier: 1.37: 2 passed, 1 failed, 1 skipped; 1.34: 2 passed" in merged
    assert "Merged day 2: 1 rows from a run of test_upgrades alone (1.37: 0 passed, 1" in merged
    assert "Runs of day 1;" in merged
    # A second merge keeps the first one's line.
    again = compat.render({"1.37": compat.results(partial)}, "day 3", merged)
    assert "Merged day 2" in again and "Merged day 3" in again
