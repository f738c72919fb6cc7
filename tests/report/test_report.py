"""Annotation markdown, Buildkite posting, and the HTML report with its regressions."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

from harness.report.annotate import annotate, annotation_style, cell_results, render_markdown
from harness.cli.main import main
from harness.report.history import append_records, append_results_dir, load_cells
from harness.run.record import load_records
from harness.report.html import (changes_since_previous, compare, delta_drifted, release_squares,
                                 render_report)

RECORDS = Path(__file__).resolve().parents[1] / "data" / "records"
RUN_1, RUN_2 = "20261101T020000Z-aaaaaa", "20261102T020000Z-bbbbbb"
FAIL_CELL = "v1-CPU_ATTN-p16d128-tiny-llama-gsm-tp1x1"
ERROR_CELL = "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"
DRIFT_CELL = "v2-FLASHINFER-p16d16-Qwen3-0.6B-tp1x1"
XFAIL_CELL = "v2-FLASH_ATTN-p16d16-Qwen3-0.6B-tp1x1"
RECOVERED_CELL = "v1-FLASHINFER-p32d16-Qwen3-0.6B-tp1x1"
NEW_CELL = "v1-CPU_ATTN-p64d128-tiny-llama-gsm-tp1x1"


def table_rows(markdown: str) -> dict[str, list[str]]:
    rows = {}
    for line in markdown.splitlines():
        match = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if match:
            rows[match.group(1)] = [c.strip() for c in match.group(2).split(" | ")]
    return rows


# ---- annotation -------------------------------------------------------------------------------
def test_markdown_table_has_each_cell_once_worst_first():
    markdown = render_markdown(load_records(RECORDS / RUN_2))
    rows = table_rows(markdown)
    assert list(rows) == [FAIL_CELL, ERROR_CELL, NEW_CELL, XFAIL_CELL, RECOVERED_CELL, DRIFT_CELL]
    assert markdown.startswith("### P/D accuracy: 6 cells: 2 PASS, 1 XFAIL, 1 FAIL, 1 ERROR, "
                               "1 INCONCLUSIVE\n")
    outcome, base, pd, delta, interval, n, transfer, links = rows[FAIL_CELL]
    # percent and points; this old record has no look: its 95 % interval, said to be descriptive
    assert (outcome, base, pd, delta, interval, n) == \
        ("FAIL", "90.0 %", "70.0 %", "-20.0", "[-30.0, -10.0] pts (95 %, descriptive)", "50")
    assert transfer == ("15000/15000 prompt tokens external, 7.0 MiB through the connector, "
                        "0 failed transfers, check passed")
    assert "[decode-0](" in links and "[record](" in links
    assert rows[ERROR_CELL][1:6] == ["-"] * 5            # an ERROR has no metrics
    assert "expected failure: upstream" in markdown       # why the XFAIL is expected
    assert "decode server died during startup" in markdown
    assert not re.search(r"[\U0001F300-\U0001FAFF\u2600-\u27BF]", markdown)   # no emoji


def test_links_are_relative_files_or_buildkite_artifacts(tmp_path):
    records = load_records(RECORDS / RUN_2)
    local = render_markdown(records, link_base=RECORDS)
    target = re.search(r"\[decode-0\]\(([^)]+)\)", local).group(1)
    assert (RECORDS / target).is_file()
    in_ci = render_markdown(records, artifact_root=RECORDS.parent)
    urls = re.findall(r"\]\((artifact://[^)]+)\)", in_ci)
    assert urls and all(u.startswith("artifact://records/") for u in urls)


def test_retried_cell_counts_its_newest_record(tmp_path):
    records = load_records(RECORDS / RUN_2)
    error = next(r for r in records if r["cell"]["id"] == ERROR_CELL)
    retry = copy.deepcopy(error)
    retry.update(run_id="20261102T030000Z-cccccc", created_at="2026-11-02T03:00:00Z")
    retry["verdict"].update(status="PASS", outcome="PASS")
    rows = table_rows(render_markdown(records + [retry]))
    assert rows[ERROR_CELL][0] == "PASS (2 attempts)"


@pytest.mark.parametrize("outcomes,style", [
    ({"PASS", "XFAIL"}, "success"),
    ({"PASS", "INCONCLUSIVE"}, "warning"),
    ({"PASS", "XPASS"}, "warning"),
    ({"PASS", "FAIL"}, "error"),
    ({"XFAIL", "ERROR"}, "error"),
    (set(), "warning"),
])
def test_annotation_style(outcomes, style):
    base = load_records(RECORDS / RUN_2)[0]
    records = []
    for i, outcome in enumerate(sorted(outcomes)):
        r = copy.deepcopy(base)
        r["cell"]["id"] = f"cell-{i}"
        r["verdict"]["outcome"] = outcome
        records.append(r)
    assert annotation_style(cell_results(records)) == style


def test_huge_annotation_keeps_only_non_pass_rows(monkeypatch):
    import harness.report.annotate as annotate_module

    monkeypatch.setattr(annotate_module, "MAX_ANNOTATION_BYTES", 2000)
    markdown = render_markdown(load_records(RECORDS / RUN_2))
    assert "PASS rows left out" in markdown
    assert set(table_rows(markdown)) == {FAIL_CELL, ERROR_CELL, NEW_CELL, XFAIL_CELL}


def _fake_agent(bin_dir: Path, log: Path) -> None:
    agent = bin_dir / "buildkite-agent"
    agent.write_text(f"#!{sys.executable}\nimport sys\n"
                     f"open({str(log)!r}, 'w').write(repr(sys.argv[1:]) + '\\n' + sys.stdin.read())\n")
    agent.chmod(agent.stat().st_mode | stat.S_IEXEC)


def test_annotate_posts_inside_buildkite(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "agent.log"
    _fake_agent(bin_dir, log)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("BUILDKITE", "true")
    monkeypatch.chdir(RECORDS.parent)
    out = tmp_path / "annotation.md"
    result = annotate(RECORDS / RUN_2, out)
    assert result.posted and result.style == "error" and result.cells == 6
    argv, body = log.read_text().split("\n", 1)
    assert argv == repr(["annotate", "--style", "error", "--context", "pd-accuracy"])
    assert body == out.read_text()
    assert "artifact://records/" in body


def test_annotate_outside_buildkite_only_writes(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "agent.log"
    _fake_agent(bin_dir, log)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("BUILDKITE", raising=False)
    result = annotate(RECORDS / RUN_1, tmp_path / "a.md")
    assert not result.posted and result.style == "error" and not log.exists()
    assert (tmp_path / "a.md").read_text().startswith("### P/D accuracy: 5 cells")


def test_cli_annotate(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BUILDKITE", raising=False)
    out = tmp_path / "ann.md"
    assert main(["annotate", "--results-dir", str(RECORDS / RUN_2), "--out", str(out)]) == 0
    assert ("6 cells: 2 PASS, 1 XFAIL, 1 FAIL, 1 ERROR, 1 INCONCLUSIVE; style error"
            in capsys.readouterr().out)
    assert main(["annotate", "--results-dir", str(tmp_path / "nope"), "--out", str(out)]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["annotate", "--results-dir", str(empty), "--out", str(out)]) == 0
    assert "No result records were found" in out.read_text()


# ---- regressions ------------------------------------------------------------------------------
def test_changes_since_previous_run(tmp_path):
    db = tmp_path / "h.sqlite"
    append_results_dir(db, RECORDS)
    changes = {(c.kind, c.cell_id) for c in changes_since_previous(load_cells(db))}
    assert changes == {("new FAIL", FAIL_CELL), ("newly ERROR", ERROR_CELL),
                       ("drift", DRIFT_CELL), ("recovered", RECOVERED_CELL)}


def test_drift_rules():
    prev = {"cell_id": "c", "outcome": "PASS", "delta": 0.0, "ci_lo": -0.02, "ci_hi": 0.02,
            "mde": 0.1}
    overlapping = {**prev, "delta": -0.03, "ci_lo": -0.05, "ci_hi": -0.01}
    disjoint = {**prev, "delta": -0.05, "ci_lo": -0.07, "ci_hi": -0.03}
    assert not delta_drifted(prev, overlapping)
    assert delta_drifted(prev, disjoint)
    no_ci = {"delta": 0.0, "mde": 0.1}
    assert not delta_drifted(no_ci, {"delta": -0.08, "mde": 0.1})
    assert delta_drifted(no_ci, {"delta": -0.12, "mde": 0.1})
    assert not delta_drifted(prev, {**prev, "delta": None})
    assert [c.kind for c in compare({**prev, "outcome": "PASS"},
                                    {**prev, "outcome": "XPASS"})] == ["new XPASS"]
    assert compare({**prev, "outcome": "FAIL"}, {**prev, "outcome": "FAIL"}) == []


# ---- HTML report ------------------------------------------------------------------------------
def test_render_report(tmp_path):
    db = tmp_path / "h.sqlite"
    append_results_dir(db, RECORDS)
    index = render_report(db, tmp_path / "report")
    html = index.read_text()
    images = re.findall(r'<img src="([^"]+)"', html)
    for src in images:
        data = (index.parent / src).read_bytes()
        assert (data.startswith(b"\x89PNG") or b"<svg" in data[:400]) and len(data) > 1000
    heatmaps = [s for s in images if "heatmap-" in s]
    trends = [s for s in images if "trend-" in s]
    # the records ran on two vLLM releases: the release x cell heatmap is there too
    assert sorted(heatmaps) == ["img/heatmap-Qwen3-0.6B.png", "img/heatmap-tiny-llama-gsm.png",
                                "img/heatmap-vllm-releases.png"]
    assert "Verdicts by vLLM release" in html and "0.32.0, 0.32.1" in html
    assert len(trends) == 5            # every cell with two entries; the new one has one
    # the verdict table comes first, then the forest plot, then everything else
    assert html.index('id="cells"') < html.index('id="forest"') < html.index('id="regressions"')
    assert "img/forest.svg" in images
    regressions = html.split('id="regressions"')[1].split('id="heatmaps"')[0]
    for cell in (FAIL_CELL, ERROR_CELL, DRIFT_CELL):
        assert cell in regressions
    assert "new FAIL" in regressions and "newly ERROR" in regressions and "drift" in regressions
    assert "Recovered" in regressions and RECOVERED_CELL in regressions
    table = html.split('id="cells"')[1].split('id="forest"')[0]
    assert table.count('<tbody class="cell"') == 6             # one line per cell
    assert table.index(FAIL_CELL) < table.index(ERROR_CELL) < table.index(DRIFT_CELL)
    # in points: the FAIL cell's delta of -0.200 is -20.0, its 95 % interval descriptive
    line = table.split(f'data-id="{FAIL_CELL}"')[1].split("</tr>")[0]
    assert "-20.0" in line and "[-30.0, -10.0] 95 %" in line and "-0.200" not in line
    details = table.split(f'data-id="{FAIL_CELL}"')[1].split("</tbody>")[0]
    link = re.search(r'<a href="([^"]+)">record</a>', details).group(1)
    assert (index.parent / link).resolve().is_file()


def test_report_escapes_html(tmp_path):
    record = copy.deepcopy(load_records(RECORDS / RUN_2)[0])
    record["verdict"]["reason"] = "<script>alert(1)</script>"
    db = tmp_path / "h.sqlite"
    append_records(db, [record])
    html = render_report(db, tmp_path / "r").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html


def test_report_shows_what_the_servers_ran(tmp_path):
    records = tmp_path / "runs"
    shutil.copytree(RECORDS / RUN_2, records / RUN_2)
    path = records / RUN_2 / f"{FAIL_CELL}.json"
    record = json.loads(path.read_text())
    record["effective_config"] = {"decode-0": {
        "block_size": 128, "attention_backend": "CPU_ATTN", "kv_cache_dtype": "bfloat16",
        "kv_cache_layout": "LBHNC", "runner": "v1", "speculative_config": "none",
        "sources": {"block_size": "log: vLLM raised it to the Mamba page"}}}
    path.write_text(json.dumps(record))
    db = tmp_path / "h.sqlite"
    append_results_dir(db, records)
    table = render_report(db, tmp_path / "r").read_text().split('id="cells"')[1]
    details = table.split(f'data-id="{FAIL_CELL}"')[1].split("</tbody>")[0]
    assert "<dt>Servers ran</dt><dd>decode: block 128, CPU_ATTN, bfloat16, LBHNC, v1</dd>" in details
    assert table.count("<dt>Servers ran</dt><dd>-</dd>") >= 5   # no read-back: they say so


def test_report_details_say_the_instances_and_the_consistency_number(tmp_path):
    records = tmp_path / "runs"
    shutil.copytree(RECORDS / RUN_2, records / RUN_2)
    path = records / RUN_2 / f"{FAIL_CELL}.json"
    record = json.loads(path.read_text())
    record["verdict"]["checks"].append({"name": "every-instance-served", "passed": True,
                                        "detail": "requests per instance: decode: decode-0 25, "
                                                  "decode-1 25"})
    record["metrics"]["consistency"] = {"tokens": 4, "bound_nats": 1.5, "questions": 50,
                                        "max_nats": 0.031, "median_nats": 0.0, "p95_nats": 0.012,
                                        "over_bound": 0, "worst_doc": 7}
    path.write_text(json.dumps(record))
    db = tmp_path / "h.sqlite"
    append_results_dir(db, records)
    table = render_report(db, tmp_path / "r").read_text().split('id="cells"')[1]
    details = table.split(f'data-id="{FAIL_CELL}"')[1].split("</tbody>")[0]
    assert ("<dt>Instances</dt><dd>passed: requests per instance: decode: decode-0 25, "
            "decode-1 25</dd>") in details
    assert ("<dt>vLLM CI consistency</dt><dd>first 4 tokens&#39; top-1 |Δ logprob|: max 0.031 "
            "nats (doc 7)") in details
    # a cell of one prefill and one decode, not a hybrid: neither line
    assert table.count("<dt>Instances</dt>") == 1 and table.count("vLLM CI consistency") == 1


def test_trend_plots_are_capped_changed_cells_first(tmp_path):
    db = tmp_path / "h.sqlite"
    append_results_dir(db, RECORDS)
    html = render_report(db, tmp_path / "r", max_trend_plots=2).read_text()
    trends = re.findall(r'<img src="img/trend-([^"]+)\.png"', html)
    assert len(trends) == 2 and set(trends) <= {FAIL_CELL, ERROR_CELL, DRIFT_CELL,
                                                RECOVERED_CELL}
    assert "3 more cells have a history" in html


def test_cli_report_writes_only_its_out_dir_unless_asked(tmp_path, capsys, monkeypatch):
    results = tmp_path / "runs"
    shutil.copytree(RECORDS / RUN_2, results / RUN_2)   # one run: no trend plots, fast
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report"
    assert main(["report", "--results-dir", str(results), "--out-dir", str(out)]) == 0
    assert (out / "index.html").is_file()
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "runs"]   # no history
    db = tmp_path / "history.sqlite"
    assert main(["report", "--results-dir", str(results), "--history", str(db),
                 "--out-dir", str(out)]) == 0
    assert not db.exists()                               # read, never created
    assert main(["history", "--results-dir", str(results), "--history", str(db)]) == 0
    assert len(load_cells(db)) == 6                      # asked, by `history`: appended
    before = db.read_bytes()
    assert main(["report", "--history", str(db), "--out-dir", str(out)]) == 0
    assert db.read_bytes() == before
    assert main(["report", "--history", str(tmp_path / "none.sqlite"),
                 "--out-dir", str(out)]) == 2


@pytest.mark.parametrize("key", ["series", "soak"])   # today's name, and a schema-2 record's
def test_a_series_record_gets_its_plot_over_the_request_index(tmp_path, key):
    records = tmp_path / "runs"
    shutil.copytree(RECORDS / RUN_2, records / RUN_2)
    path = records / RUN_2 / f"{FAIL_CELL}.json"
    record = json.loads(path.read_text())
    windows = [{"index": w, "first": 100 * w, "requests": 100, "answered": 100,
                "agree": 100 if w < 4 else 10, "differs": 0 if w < 4 else 90, "failed": 0,
                "agreement": 1.0 if w < 4 else 0.1} for w in range(8)]
    record.setdefault("metrics", {})["weather"] = {key: {
        "window": 100, "windows": windows,
        "line": "360 of 800 soak requests differ over 8 windows of 100, the first at soak "
                "request 400"}}
    path.write_text(json.dumps(record))
    db = tmp_path / "h.sqlite"
    append_results_dir(db, records)
    index = render_report(db, tmp_path / "r")
    html = index.read_text()
    section = html.split('id="series"')[1].split('id="cells"')[0]
    src = re.search(r'<img src="(img/series-[^"]+\.svg)"', section).group(1)
    svg = (index.parent / src).read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "request index (series)" in svg and "agreement with the baseline" in svg
    assert FAIL_CELL in section and "the first at soak request 400" in section


def test_release_squares_hold_each_cells_newest_outcome_per_release():
    rows = [{"cell_id": "a", "vllm_version": "0.30.0", "outcome": "FAIL"},
            {"cell_id": "a", "vllm_version": "0.30.0", "outcome": "PASS"},     # newer run
            {"cell_id": "a", "vllm_version": "0.9.0", "outcome": "PASS"},
            {"cell_id": "b-fault-corrupt-block", "vllm_version": "0.30.0", "outcome": "CAUGHT"},
            {"cell_id": "c", "vllm_version": None, "outcome": "PASS"}]           # unknown release
    releases, cells, squares = release_squares(rows)
    assert releases == ["0.9.0", "0.30.0"]         # by version, not by text
    assert cells == ["a", "b-fault-corrupt-block"]  # canaries last, no release: left out
    assert squares[("a", "0.30.0")]["outcome"] == "PASS"
    assert ("b-fault-corrupt-block", "0.9.0") not in squares
