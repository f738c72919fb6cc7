"""docs/ reads as user docs: every page opens, under its title, with a paragraph of prose (what
the page is for), no section heading carries a date (measurements and their dates live in
results/ SUMMARY files and CHANGELOG.md), and every relative link in docs/, README.md,
CHANGELOG.md and the results/ SUMMARY files points at a file that exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
DATE = re.compile(r"\b20\d\d-\d\d(-\d\d)?\b|\b(January|February|March|April|May|June|July|"
                  r"August|September|October|November|December) 20\d\d\b")
LINKED_FILES = [*DOCS, ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "results/SUMMARY.md",
                ROOT / "results/benchmarks/SUMMARY.md", ROOT / "results/reference/GPU-SUMMARY.md"]


def test_there_are_docs():
    assert len(DOCS) >= 15


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_a_page_opens_with_what_it_is_for(page):
    blocks = [b.strip() for b in page.read_text().split("\n\n") if b.strip()]
    assert blocks[0].startswith("# ") and "\n" not in blocks[0], "a title first"
    first = blocks[1]
    assert not first.startswith(("#", "```", "|", "- ", "* ", "1.", "!")), first[:80]
    assert len(first.split()) >= 20, first[:80]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_no_section_heading_is_dated(page):
    dated = [line for line in page.read_text().splitlines()
             if line.startswith("#") and DATE.search(line)]
    assert dated == []


@pytest.mark.parametrize("page", LINKED_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^(https?:|mailto:|#)", target):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            missing.append(target)
    assert missing == []


@pytest.mark.parametrize("kind", ["reference", "benchmarks"])
def test_every_results_folder_is_listed(kind):
    """A committed run nobody can find from results/SUMMARY.md (or benchmarks/SUMMARY.md) is
    as good as lost."""
    index = (ROOT / "results/SUMMARY.md").read_text()
    if kind == "benchmarks":
        index += (ROOT / "results/benchmarks/SUMMARY.md").read_text()
    folders = sorted(p.name for p in (ROOT / "results" / kind).iterdir() if p.is_dir())
    assert [name for name in folders if f"{name}/" not in index and f"{name})" not in index] == []
