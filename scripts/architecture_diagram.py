"""Write the shared watch's state diagram into docs/architecture.md from the machine's table.

``python scripts/architecture_diagram.py`` replaces the first ```mermaid block of the document
with :func:`watchproxy.hub.machine.mermaid`; ``--check`` only says whether they differ (exit 1).
tests/unit/test_architecture_doc.py fails while they differ.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from watchproxy.hub.transitions import mermaid  # noqa: E402

DOC = ROOT / "docs" / "architecture.md"
BLOCK = re.compile(r"```mermaid\n(.*?)```", flags=re.S)


def with_diagram(text: str) -> str:
    """``text`` with its first mermaid block replaced by the machine's diagram."""
    if BLOCK.search(text) is None:
        raise SystemExit(f"{DOC}: no ```mermaid block to replace")
    return BLOCK.sub(lambda _match: f"```mermaid\n{mermaid()}```", text, count=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the document differs")
    args = parser.parse_args()
    text = DOC.read_text(encoding="utf-8")
    wanted = with_diagram(text)
    if wanted == text:
        return 0
    if args.check:
        print(f"{DOC.relative_to(ROOT)}: the state diagram differs from the machine's table")
        return 1
    DOC.write_text(wanted, encoding="utf-8")
    print(f"rewrote the state diagram in {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
