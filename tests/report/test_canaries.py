"""Canaries in the annotation and the HTML report, and heatmap squares of exactly one cell each."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from harness.core.outcomes import CAUGHT, ERROR, FAIL, MISSED, PASS
from harness.report.annotate import annotation_style, cell_results, render_markdown
from harness.report.cell_ids import (canary_result, canary_summary, fault_label, fault_of,
                                     variant_of, with_canary_outcome)
from harness.report.history import append_records, load_cells
from harness.report.html import (OUTCOME_COLOURS, changes_since_previous, heatmap_squares,
                                 plot_heatmap, render_report)
from harness.run.record import load_records

RECORDS = Path(__file__).resolve().parents[1] / "data" / "records"
RUN_1, RUN_2 = "20261101T020000Z-aaaaaa", "20261102T020000Z-bbbbbb"
REAL = "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"
CANARY = "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-fault-corrupt-block-last"
CAUGHT_REASON = "P/D accuracy is lower: baseline 94.0% vs P/D 0.0% (Δ -94.0 pts)"


def record(cell_id: str, status: str, *, outcome: str | None = None, reason: str = "",
           run_id: str = RUN_2, fault: str | None = None, prefill_tp: int = 1,
           delta: float = 0.0) -> dict:
    """A record of the tiny-llama p128d128 cell `cell_id`; `outcome` None: an old record's
    (the outcome is the status)."""
    r = copy.deepcopy(next(r for r in load_records(RECORDS / RUN_2)
                           if r["cell"]["id"] == "v1-CPU_ATTN-p16d128-tiny-llama-gsm-tp1x1"))
    r.pop("_path", None)
    r["run_id"] = run_id
    r["created_at"] = f"2026-11-0{1 if run_id == RUN_1 else 2}T02:10:00Z"
    r["cell"].update(id=cell_id, runner="v1", backend="CPU_ATTN", model="tiny-llama-gsm",
                     prefill_block_size=128, decode_block_size=128, prefill_tp=prefill_tp,
                     fault=fault)
    r["verdict"].update(status=status, outcome=outcome or status, reason=reason,
                        expected_failure=None)
    r["cell"]["expected_failure"] = None
    r["metrics"]["accuracy_delta"] = delta
    return r


def old_caught_canary(**kw) -> dict:
    return record(CANARY, FAIL, reason=CAUGHT_REASON, fault="corrupt-block", **kw)


def history(tmp_path: Path, records: list[dict]) -> list[dict]:
    db = tmp_path / "h.sqlite"
    append_records(db, records)
    return load_cells(db)


# ---- reading cell ids -------------------------------------------------------------------------
@pytest.mark.parametrize("cell_id,variant", [
    (REAL, "p128d128 tp1x1"),
    ("v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x2", "p128d128 tp1x2"),
    ("v2-FLASHINFER-p128d128-Qwen3-0.6B-tp1x1-eager", "p128d128 tp1x1 eager"),
    ("v1-CPU_ATTN-p64d128-tiny-qwen3next-hybrid-gsm-tp1x1-x62f261", "p64d128 tp1x1 x62f261"),
    ("v1-FLASH_ATTN-p16d16-tiny-granite-hybrid-gsm-tp2x1-n2x1-kvbuf-cpu-eager-xa3ac39",
     "p16d16 tp2x1 n2x1 kvbuf-cpu eager xa3ac39"),
    (CANARY, "p128d128 tp1x1"),
])
def test_variant_is_the_id_without_runner_backend_model_and_fault(cell_id, variant):
    assert variant_of({"cell_id": cell_id}) == variant


def test_fault_read_from_the_id():
    assert fault_of(REAL) is None
    assert fault_of(CANARY) == "corrupt-block"
    assert fault_label(CANARY) == "corrupt-block (last)"
    assert fault_of("v1-CPU_ATTN-p16d16-m-tp1x1-fault-drop-transfer") == "drop-transfer"
    assert canary_summary([CAUGHT] * 4) == "4 canaries: 4 caught"
    assert canary_summary([MISSED]) == "1 canary: 1 missed"
    assert canary_summary([CAUGHT, MISSED, ERROR]) == "3 canaries: 1 caught, 1 missed, 1 ERROR"


@pytest.mark.parametrize("status,outcome,reason,expected", [
    (FAIL, FAIL, CAUGHT_REASON, CAUGHT),             # an old record, failed for its reason
    (FAIL, FAIL, "decode server died", MISSED),      # an old record, failed for another reason
    (PASS, PASS, "", MISSED),                        # an old record that passed
    (ERROR, ERROR, "no baseline", ERROR),
    (FAIL, MISSED, CAUGHT_REASON, MISSED),           # a new record's outcome stands
])
def test_old_canary_records_are_judged_like_the_verdict_does(status, outcome, reason, expected):
    assert canary_result(CANARY, None, status, outcome, reason) == expected
    row = {"cell_id": CANARY, "status": status, "outcome": outcome, "reason": reason}
    assert with_canary_outcome(row)["outcome"] == expected
    assert with_canary_outcome({**row, "cell_id": REAL})["outcome"] == outcome


# ---- heatmap ----------------------------------------------------------------------------------
def test_canary_on_the_same_blocks_leaves_the_real_square_pass(tmp_path):
    rows = history(tmp_path, [record(REAL, PASS), old_caught_canary()])
    row_labels, cols, squares = heatmap_squares(rows)
    assert (row_labels, cols) == (["v1 CPU_ATTN"], ["p128d128 tp1x1"])
    assert squares[("v1 CPU_ATTN", "p128d128 tp1x1")]["cell_id"] == REAL
    png = plot_heatmap("tiny-llama-gsm", rows, tmp_path / "heatmap.png")
    from matplotlib.image import imread

    pixels = {tuple(round(float(c) * 255) for c in px[:3]) for line in imread(png) for px in line}
    rgb = {o: tuple(int(OUTCOME_COLOURS[o][i:i + 2], 16) for i in (1, 3, 5))
           for o in (PASS, FAIL, CAUGHT)}
    assert rgb[PASS] in pixels                         # the real cell's square is green
    assert rgb[FAIL] not in pixels and rgb[CAUGHT] not in pixels


def test_two_tp_variants_of_the_same_blocks_are_two_columns(tmp_path):
    tp12 = "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x2"
    rows = history(tmp_path, [record(REAL, PASS),
                              record(tp12, FAIL, reason="accuracy dropped", prefill_tp=2)])
    _, cols, squares = heatmap_squares(rows)
    assert cols == ["p128d128 tp1x1", "p128d128 tp1x2"]
    assert {k: r["outcome"] for k, r in squares.items()} == {
        ("v1 CPU_ATTN", "p128d128 tp1x1"): PASS, ("v1 CPU_ATTN", "p128d128 tp1x2"): FAIL}


# ---- HTML report ------------------------------------------------------------------------------
def test_report_lists_canaries_as_canaries_outside_heatmaps_and_trends(tmp_path):
    db = tmp_path / "h.sqlite"
    append_records(db, [record(REAL, PASS, run_id=RUN_1), old_caught_canary(run_id=RUN_1),
                        record(REAL, PASS), old_caught_canary()])
    html = render_report(db, tmp_path / "report").read_text()
    head, rest = html.split("<body>")[1].split('id="cells"', 1)
    table = rest.split('id="forest"')[0]
    assert "2 cells:" in head and "1 PASS" in head and "1 canary caught" in head
    assert "FAIL" not in head                     # an old caught canary is no FAIL
    canary = table.split(f'data-id="{CANARY}"')[1].split("</tbody>")[0]
    assert 'data-kind="canary"' in table and "o-CAUGHT" in canary
    assert "corrupt-block (last)" in canary       # its fault, on its line
    assert 'data-kind="cell"' in table and REAL in table
    assert "heatmap-" + CANARY not in html and "trend-" + CANARY not in html
    assert not re.search(r"[\U0001F300-\U0001FAFF\u2600-\u27BF]", html.replace("\u25B2", "").replace("\u25BC", ""))


# ---- annotation -------------------------------------------------------------------------------
def test_annotation_counts_an_old_caught_canary_as_caught(tmp_path):
    records = [record(REAL, PASS), old_caught_canary()]
    markdown = render_markdown(records)
    # counted as `run` counts it: a canary is a canary caught, never a PASS or a FAIL
    assert markdown.startswith("### P/D accuracy: 2 cells: 1 PASS, 1 canary caught\n")
    cells_table, canary_section = markdown.split("#### Canaries")
    assert CANARY not in cells_table
    assert "1 canary: 1 caught" in canary_section
    assert f"| `{CANARY}` | corrupt-block (last) | CAUGHT | {CAUGHT_REASON} |" in canary_section
    assert annotation_style(cell_results(records)) == "success"


@pytest.mark.parametrize("canary", [
    record(CANARY, FAIL, outcome=MISSED, reason="decode server died", fault="corrupt-block"),
    record(CANARY, FAIL, reason="decode server died", fault="corrupt-block"),   # old record
    record(CANARY, PASS, fault="corrupt-block"),                                # old record
])
def test_a_missed_canary_makes_the_annotation_an_error(canary):
    records = [record(REAL, PASS), canary]
    assert annotation_style(cell_results(records)) == "error"
    markdown = render_markdown(records)
    assert "1 canary: 1 missed" in markdown
    assert markdown.startswith("### P/D accuracy: 2 cells: 1 PASS, 1 canary missed\n")


def test_annotation_of_canaries_only():
    markdown = render_markdown([old_caught_canary()])
    assert "No real cells ran, only canaries." in markdown
    assert "No result records were found" not in markdown and "1 canary: 1 caught" in markdown


def test_an_external_deployment_gets_its_own_heatmap_row_named_after_it():
    rows = [{"cell_id": "external-llm-d-2node", "runner": None, "backend": None,
             "p_block": None, "d_block": None, "outcome": "PASS"},
            {"cell_id": REAL, "runner": "v1", "backend": "CPU_ATTN", "outcome": "PASS"}]
    row_labels, cols, squares = heatmap_squares(rows)
    assert row_labels == ["external", "v1 CPU_ATTN"]
    assert squares[("external", "llm-d-2node")]["cell_id"] == "external-llm-d-2node"
    assert "pNonedNone" not in cols
