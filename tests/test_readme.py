"""README says what the code prints: its first screen holds the maintainer's path (the three
commands, a verdict table that is what `run` prints for committed records, the exit codes as the
code maps them, cell / canary / weather), the healthy smoke line (from the smoke profile's
declared outcomes and the line `run` ends with, no servers started), the plugin's options as it
registers them, and every docs page linked; `run --kv-connector` help names every connector."""
from __future__ import annotations

import re
from pathlib import Path

from harness.cli.main import build_parser
from harness.cli.run import final_line
from harness.connectors import KV_CONNECTORS
from harness.core.outcomes import CAUGHT, EXIT_CODES, EXIT_USAGE, PASS, XFAIL, summary_line
from harness.matrix import expand, load_matrix
from harness.pytest_plugin import pytest_addoption

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = "\n".join(README.splitlines()[:60])


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
    assert re.search(f"^{pattern}$", section("On a CPU machine"), re.M), printed
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
    assert re.search(r"^pd-accuracy run --profile pr\s", FIRST_SCREEN, re.M)
    assert "pd-accuracy farm --gpus 1 --profile pr" in text
    cells = expand(load_matrix(), "pr", PlatformInfo.from_spec("cuda:1")).cells
    assert f"run <run id>: {len(cells)} cell(s)" in text, len(cells)


def test_readme_is_short_and_its_first_screen_is_the_maintainers_path():
    assert len(README.splitlines()) <= 120
    for command in ("pd-accuracy run --profile pr", "pytest -m pd_accuracy --pd-profile pr",
                    "pd-accuracy pipeline --profile pr | buildkite-agent pipeline upload"):
        assert re.search(rf"^{re.escape(command)}\s", FIRST_SCREEN, re.M), command
    for term in ("cell", "canary", "weather"):
        assert re.search(rf"^- \*\*{term}\*\*: ", FIRST_SCREEN, re.M), term
    assert "```text\npd-accuracy verdicts\n" in FIRST_SCREEN and "| exit |" in FIRST_SCREEN


def test_readme_verdict_table_is_what_run_prints_for_the_committed_records():
    """The table is the harness's own rendering (harness.report.console, 100 columns) of the
    records the README links: PASS, XFAIL and a CAUGHT canary, numbers and all."""
    from harness.report.console import render_table
    from harness.run.record import load_records

    link = re.search(r"records in \[[^]]+\]\((results/reference/[^)]+)/SUMMARY\.md\)",
                     FIRST_SCREEN).group(1)
    shown = FIRST_SCREEN.split("```text\n")[1].split("```")[0]
    ids = re.findall(r"^│ [A-Z]+ +│ (\S+) ", shown, re.M)
    records = [r for r in load_records(ROOT / link) if r["cell"]["id"] in ids]
    assert sorted(r["cell"]["id"] for r in records) == sorted(ids) and len(ids) == 3
    outcomes = {r["verdict"]["outcome"] for r in records}
    assert outcomes == {"PASS", "XFAIL", "CAUGHT"}
    printed = render_table(records, 100)
    assert printed[:len(shown)] == shown, "re-render the README table from its records"
    assert summary_line(r["verdict"]["outcome"] for r in records) + " in " in " ".join(
        FIRST_SCREEN.split())


def test_readme_exit_codes_are_the_codes():
    rows = re.findall(r"^\| (\d) \| ([^|]+) \|", FIRST_SCREEN, re.M)
    listed = {int(code): text for code, text in rows}
    for outcome, code in EXIT_CODES.items():
        assert re.search(rf"\b{outcome}\b", listed[code]), (outcome, code)
    assert "bad input" in listed[EXIT_USAGE]
    assert sorted(listed) == sorted({*EXIT_CODES.values(), EXIT_USAGE})
