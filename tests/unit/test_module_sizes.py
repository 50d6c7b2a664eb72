"""A module that grows past 1,200 lines gets a review: does it still hold one concern?

Modules are split by concern, never to meet a count (STYLE.md; the anchors' watcher, reflector
and cacher are 1,000-1,500 lines each). A 400-line cap made files split by count and code
compacted under ``# fmt: skip`` to fit (issue 42), so the cap is no target: it only asks for a
review of a module that may have outgrown one concern. The review's answer is either a split by
concern or an entry in ``REVIEWED`` saying why the module is one concern at that length.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "watchproxy"
REVIEW_AT = 1200

# Modules reviewed at more than REVIEW_AT lines and kept whole, by their path under watchproxy/:
# the concern they hold and who reviewed it when. An entry for a module that is back under the
# line count fails the test, so none lingers.
REVIEWED: dict[str, str] = {}


def _line_counts() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_a_module_past_the_review_size_was_reviewed_as_one_concern() -> None:
    counts = _line_counts()
    assert "cli.py" in counts, f"no modules found under {PACKAGE}"
    unreviewed = {
        name: lines for name, lines in counts.items() if lines > REVIEW_AT and name not in REVIEWED
    }
    assert not unreviewed, (
        f"modules over {REVIEW_AT} lines: split them by concern, or add them to REVIEWED with "
        "the one concern they hold: "
        + ", ".join(f"watchproxy/{name} ({lines})" for name, lines in sorted(unreviewed.items()))
    )


def test_the_reviewed_list_names_only_modules_still_that_long() -> None:
    counts = _line_counts()
    stale = sorted(name for name in REVIEWED if counts.get(name, 0) <= REVIEW_AT)
    assert not stale, f"remove from REVIEWED (gone or under {REVIEW_AT} lines): {stale}"
