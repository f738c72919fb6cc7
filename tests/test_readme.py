"""README says what the code prints: the healthy smoke line (from the smoke profile's declared
outcomes and the line `run` ends with, no servers started), the plugin's options as it
registers them, and every docs page linked; `run --kv-connector` help names every connector."""
from __future__ import annotations

import re
from pathlib import Path

from harness.cli.main import build_parser
from harness.cli.run import final_line
from harness.core.kv_connectors import KV_CONNECTORS
from harness.core.outcomes import CAUGHT, PASS, XFAIL
from harness.matrix import expand, load_matrix
from harness.pytest_plugin import pytest_addoption

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def declared_outcome(cell) -> str:
    """What a healthy run gives the cell: a canary is caught, an expected failure fails as
    declared, every other cell passes."""
    return CAUGHT if cell.is_canary else XFAIL if cell.expected_failure else PASS


def test_readme_healthy_line_is_what_smoke_prints():
    cells = expand(load_matrix(), "smoke").cells
    printed = final_line([declared_outcome(c) for c in cells], 405, "results/runs/<run id>")
    pattern = re.escape(printed).replace("405s", r"\d+s")
    assert re.search(f"^{pattern}$", section("Two commands"), re.M), printed
    assert "11 cells: 4 PASS, 1 XFAIL, 6 canaries caught" in printed    # today's smoke profile


class _Options:
    def __init__(self) -> None:
        self.names: list[str] = []

    def getgroup(self, name: str) -> "_Options":
        return self

    def addoption(self, *names: str, **kwargs) -> None:
        self.names += [n for n in names if n.startswith("--")]


def test_readme_lists_every_plugin_option():
    registered = _Options()
    pytest_addoption(registered)
    listed = set(re.findall(r"`(--pd-[a-z-]+)`", section("The plugin in vLLM's tree")))
    assert listed == set(registered.names)


def test_run_kv_connector_help_names_every_connector():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    [action] = [a for a in run._actions if "--kv-connector" in a.option_strings]
    for value, row in KV_CONNECTORS.items():
        assert re.search(rf"(^|[\s,]){re.escape(value)} \({row.vllm_name}", action.help), value


def test_readme_links_every_docs_page():
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = set(re.findall(r"\(docs/([a-z0-9-]+\.md)\)", section("Docs")))
    assert docs <= linked, sorted(docs - linked)


def test_readme_one_gpu_machine_says_the_commands_and_the_pr_cell_count():
    from harness.core.platform import PlatformInfo

    text = " ".join(section("One GPU machine").split())
    assert "pd-accuracy run --profile pr " in text
    assert "pd-accuracy farm --gpus 1 --profile pr" in text
    cells = expand(load_matrix(), "pr", PlatformInfo.from_spec("cuda:1")).cells
    assert f"run <run id>: {len(cells)} cell(s)" in text, len(cells)
