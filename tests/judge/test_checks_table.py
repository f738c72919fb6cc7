"""The verdict's checks are one table, and docs/judging.md's "What each check catches" names
exactly its checks."""
from __future__ import annotations

import re
from pathlib import Path

from harness.core.outcomes import ERROR, FAIL
from harness.judge.verdict import CHECKS, Check, check_row, first_failing

JUDGING = Path(__file__).resolve().parents[2] / "docs" / "judging.md"


def readme_check_names() -> set[str]:
    text = JUDGING.read_text()
    section = text.split("## What each check catches", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return {name for row in rows[1:] for name in re.findall(r"`([a-z0-9-]+)`", row.split(" | ")[0])}


def test_the_docs_table_names_the_checks_table():
    assert readme_check_names() == {row.name for row in CHECKS}


def test_every_row_says_how_and_what_and_has_one_stage():
    assert len({row.name for row in CHECKS}) == len(CHECKS)
    for row in CHECKS:
        assert row.stage in ("baseline", "weather", "transfer", "kv", "drafts", "accuracy")
        assert row.computed and "{detail}" in row.failure and row.status in (FAIL, ERROR)
    assert check_row("baseline-health").status == ERROR


def test_a_check_the_table_does_not_list_fails_with_its_own_line():
    new = Check("kv-arrived-twice", False, "2 copies")
    assert check_row(new.name).reason(new.detail) == "check kv-arrived-twice failed: 2 copies"
    # it never outranks a check the table orders
    accuracy = Check("accuracy", False, "lower")
    assert first_failing([new, accuracy]) is accuracy
    assert first_failing([new, Check("accuracy", True, "ok")]) is new
    assert first_failing([Check("accuracy", True, "ok")]) is None


def test_the_first_failing_check_in_table_order_decides():
    digest = Check("kv-digest", False, "layer 0")
    recompute = Check("decode-did-not-recompute", False, "300 tokens")
    assert first_failing([digest, recompute]) is recompute
    assert check_row("decode-did-not-recompute").reason("x").startswith("decode recomputed the prompt")
