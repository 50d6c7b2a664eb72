"""The table of ``docs/metrics.md``, generated from a fresh registry.

``python -m watchproxy.metrics`` prints it; a test keeps the document equal to it.
"""

from __future__ import annotations

from watchproxy.metrics import Metrics


def markdown_table(metrics: Metrics | None = None) -> str:
    """The table of docs/metrics.md: every metric of a fresh registry, in registration order."""
    metrics = metrics or Metrics()
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for doc in metrics.catalog:
        labels = ", ".join(f"`{label}`" for label in doc.labels)
        rows.append(f"| `{doc.name}` | {doc.type} | {labels} | {doc.help} |")
    own = {doc.name for doc in metrics.catalog}
    for family in metrics.registry.collect():
        if family.name.startswith("process_") and family.name not in own:
            name = family.name + ("_total" if family.type == "counter" else "")
            rows.append(f"| `{name}` | {family.type} |  | {family.documentation} |")
    return "\n".join(rows) + "\n"
