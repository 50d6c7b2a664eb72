"""docs/architecture.md shows the shared-watch state diagram the code actually has."""

from __future__ import annotations

import re
from pathlib import Path

from watchproxy.hub.transitions import mermaid

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_the_state_diagram_in_the_docs_is_the_machines_transition_table() -> None:
    blocks = re.findall(r"```mermaid\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/architecture.md has no mermaid state diagram"
    assert blocks[0] == mermaid().rstrip("\n") + "\n", (
        "docs/architecture.md's diagram is stale: "
        "regenerate it with `python scripts/architecture_diagram.py`"
    )
