"""Every default a document quotes is the schema's: two documents cannot disagree on one.

The documents quote a default as "`section.key` (VALUE ...)" or "(`section.key`, VALUE)",
VALUE a number with an optional unit (s, KiB, MiB, GiB). config.example.yaml is compared with
the schema key by key in test_config.py; this covers the prose.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from watchproxy.config.schema import SECTIONS

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "bench" / "README.md",
        *ROOT.glob("docs/*.md"),
    ]
)
VALUE = r"([0-9][0-9.,]*)\s*(s|KiB|MiB|GiB)?\s*[);:]"
QUOTES = [
    re.compile(r"`(\w+)\.(\w+)`\s*\(\s*" + VALUE),
    re.compile(r"\(`(\w+)\.(\w+)`,\s*" + VALUE),
]
UNITS = {None: 1, "s": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def schema_defaults() -> dict[str, object]:
    defaults: dict[str, object] = {}
    for section, cls in SECTIONS.items():
        for field in fields(cls):
            defaults[f"{section}.{field.name}"] = cls().__dict__[field.name]
    return defaults


def quoted_defaults() -> list[tuple[str, int, str, float]]:
    """(document, line, key, value) for every quoted default of a known key."""
    known = schema_defaults()
    found = []
    for path in DOCUMENTS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for pattern in QUOTES:
                for match in pattern.finditer(line):
                    key = f"{match.group(1)}.{match.group(2)}"
                    if key in known:
                        value = float(match.group(3).replace(",", "")) * UNITS[match.group(4)]
                        found.append((str(path.relative_to(ROOT)), number, key, value))
    return found


def test_documents_quote_defaults_at_all() -> None:
    # Against a pattern that stopped matching: the documents quote a dozen defaults today.
    assert len(quoted_defaults()) >= 10


@pytest.mark.parametrize(("document", "line", "key", "value"), quoted_defaults())
def test_a_quoted_default_is_the_schemas(document: str, line: int, key: str, value: float) -> None:
    default = schema_defaults()[key]
    assert isinstance(default, int | float), f"{document}:{line}: {key} is not a number"
    assert value == pytest.approx(float(default)), (
        f"{document}:{line} quotes {key} as {value:g}, the default is {default}"
    )
