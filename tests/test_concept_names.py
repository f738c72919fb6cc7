"""One home per connector and per weather: outside its own package (harness/connectors/<name>/,
harness/weathers/<name>/) a connector's or a weather's name appears in at most three modules of
the harness (the registry that lists it, the matrix data, help text). A module that names one
elsewhere holds a fact of that connector or weather in the wrong room.

A name counts where it stands as a word of its own in any case and spelling (`mooncake`,
`NIXL`, `NixlConnector`, `nixl_bytes`, `block_boundary`), not inside a longer word
(`preemptions`). A name that is also an English word the harness uses in prose (`calm`,
`load`, `restart`, `example`) counts only where code names it: a string that is the value.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from harness import connectors, weathers

ROOT = Path(__file__).resolve().parents[1] / "harness"
LIMIT = 3
# names the harness also uses as plain words: counted only as the value in a string of code
PROSE_WORDS = {"calm", "load", "restart", "example"}
# where a name appears beyond the limit, and why it is left there: the exact set, so that a
# new module naming it still fails
BEYOND_LIMIT: dict[str, set[str]] = {
    # none today; an entry is a name, the modules beyond the limit and why it is left there
}


def harness_files() -> list[Path]:
    """The harness's modules and its matrix data."""
    return ([p for p in ROOT.rglob("*.py") if "checkpoints" not in p.parts]
            + sorted((ROOT / "matrix").glob("*.yaml")))


def _is_word(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] stands as a word: its neighbours are no letters or digits, or
    meet it at a change of case (`MultiNixlConnector`)."""
    before = text[start - 1] if start else " "
    after = text[end] if end < len(text) else " "
    starts = not before.isalnum() or (text[start].isupper() and not before.isupper())
    ends = not after.isalnum() or (after.isupper() and not text[end - 1].isupper())
    return starts and ends


def names(text: str, name: str, suffix: str = ".py") -> bool:
    """Whether `text` (a module's or the matrix's) names `name`."""
    spellings = {name, name.replace("-", "_")}
    if name in PROSE_WORDS:
        if suffix != ".py":
            return False
        return any(isinstance(node, ast.Constant) and node.value in spellings
                   for node in ast.walk(ast.parse(text)))
    pattern = "|".join(re.escape(s) for s in spellings)
    return any(_is_word(text, m.start(), m.end()) for m in re.finditer(pattern, text, re.I))


def naming_modules(name: str, home: Path) -> set[str]:
    return {str(p.relative_to(ROOT)) for p in harness_files()
            if home not in p.parents and names(p.read_text(), name, p.suffix)}


def concept_names() -> list[tuple[str, Path]]:
    """(name, its package's folder) for every connector package (its folder's name: a family's
    values share it) and every weather."""
    found = [(Path(p.__file__).parent.name, Path(p.__file__).parent)
             for p in connectors.packages()]
    found += [(p.NAME, Path(p.__file__).parent) for p in weathers.packages()]
    return [(name, home) for name, home in found if ROOT in home.parents]


def test_the_name_reader_sees_words_in_every_spelling_only():
    assert names("from x import NIXL_WORKER", "nixl")
    assert names("class MultiNixlOffloadConnector: ...", "nixl")
    assert names('ROW = {"nixl-push": 1}', "nixl")
    assert not names("nixlish = 1", "nixl")
    assert names("# weather block_boundary", "block-boundary")
    assert not names("# crosses a block boundary", "block-boundary")
    assert not names("# vllm:num_preemptions_total", "preemption")
    assert names('weather = "load"', "load") and not names("# under load", "load")
    assert not names("load: 1", "load", ".yaml")


def test_every_connector_and_weather_is_counted():
    counted = {name for name, _ in concept_names()}
    assert {"nixl", "mooncake", "example"} <= counted
    assert set(weathers.WEATHERS) <= counted


@pytest.mark.parametrize("name,home", concept_names(), ids=lambda v: str(v).rsplit("/", 1)[-1])
def test_a_name_lives_in_its_package(name, home):
    found = naming_modules(name, home)
    if name in BEYOND_LIMIT:
        assert found == BEYOND_LIMIT[name], f"{name}: {sorted(found)}"
    else:
        assert len(found) <= LIMIT, f"{name} named outside its package in {sorted(found)}"
