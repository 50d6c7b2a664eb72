"""Run one fuzz target under atheris (coverage-guided libFuzzer) for a number of inputs.

    python -m tests.fuzz.run TARGET [libFuzzer flags, e.g. -runs=1000000 -timeout=10]

A finding (an exception other than the target's accepted ones, or a broken guarantee) stops the
run with libFuzzer's report and writes the input to ``crash-*``; an input slower than
``-timeout`` seconds is a hang and is reported the same way. ``scripts/fuzz.sh`` runs them all.
"""

from __future__ import annotations

import sys

import atheris


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit("usage: python -m tests.fuzz.run TARGET [libFuzzer flags]")
    name = sys.argv.pop(1)
    # Instrument the product (and the targets) as they are imported, for coverage feedback.
    with atheris.instrument_imports(include=["watchproxy", "tests.fuzz"]):
        from tests.fuzz.targets import TARGETS
    if name not in TARGETS:
        raise SystemExit(f"unknown target {name!r}; targets: {', '.join(TARGETS)}")
    atheris.Setup(sys.argv, TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
