"""What `pd-accuracy run` prints at its end, read as a person reads a log: the verdict table keeps
every cell id whole on one line and every word of a reason whole, fits the width it is given
(wider only for the longest id), and lm-eval's progress bars stay out of it and out of the run
folder's console.log. The records are committed ones (CPU smoke and an H100 run)."""
from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cli.run import finish
from harness.core.outcomes import summary_line
from harness.report.console import (CONSOLE_LOG, render_table, save_console_log, short_reason,
                                    start_console_log, stop_console_log, table_width, table_rows)
from harness.run.record import load_records

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "results/reference/cpu-kv-digest-20261201/smoke"
H100 = ROOT / "results/reference/gpu-h100-soak-expiry-digest-20261206/soak-expiry/records"
BAR = re.compile(r"\d+%\|")


def records() -> list[dict]:
    return load_records(SMOKE) + load_records(H100)


def rows_of(table: str) -> dict[str, dict]:
    """The body rows of a rendered table by cell id: outcome, the reason below the id (its
    lines joined with a space) and the numbers column's lines."""
    rows, lines = {}, table.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("├")) + 1:]
    current: list[list[str]] = []
    for line in body:
        if line.startswith(("├", "└")):
            cell, *why = [c[1] for c in current if c[1]]
            rows[cell] = {"outcome": current[0][0], "why": " ".join(why),
                          "numbers": [c[2] for c in current if c[2]], "n": current[0][3]}
            current = []
            continue
        current.append([c.strip() for c in line.strip().strip("│").split("│")])
    return rows


@pytest.mark.parametrize("width", [80, 120, 160, 220])
def test_ids_stay_whole_and_reasons_break_only_between_words(width):
    recs = records()
    table = render_table(recs, width)
    lines = table.splitlines()
    for record in recs:
        cell_id = record["cell"]["id"]
        assert any(f" {cell_id} " in line for line in lines), cell_id
    rows = rows_of(table)
    assert set(rows) == {r["cell"]["id"] for r in recs}
    for record in recs:
        shown = rows[record["cell"]["id"]]["why"]
        # joined at line ends with a space: a word folded mid-way would come back split in two
        assert shown.split() == short_reason(record["verdict"]["reason"]).split()
    widest = max(len(line) for line in lines)
    assert widest == table_width(table_rows(recs), width)
    assert widest == width or width < widest <= 260   # wider only to keep the longest id whole


def test_a_table_of_short_ids_fits_an_100_column_terminal():
    short = [r for r in load_records(SMOKE) if len(r["cell"]["id"]) <= 50]
    assert len(short) >= 3
    assert max(len(line) for line in render_table(short, 100).splitlines()) <= 100


def test_the_interval_is_the_one_the_verdict_used():
    rows = rows_of(render_table(records(), 160))
    # the XFAIL of the CPU smoke: its verdict's look, 99.61 % (not the 95 % bootstrap interval)
    xfail = rows["v1-CPU_ATTN-p64d128-tiny-llama-gsm-tp1x1-eager"]
    assert (xfail["outcome"], xfail["n"]) == ("XFAIL", "50")
    assert xfail["numbers"] == ["-98.0 [-99.8, -69.7]", "99.61 %", "100.0 % → 2.0 %"]
    # a PASS at look 2 of 3: its lower end is the verdict's "99.82 % upper bound of the drop 4.1"
    soak = rows["v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-w_soak_requests2000"]
    assert soak["numbers"][:2] == ["+0.0 [-4.1, +4.1]", "99.64 %"]
    assert "99.82 % upper bound of the drop 4.1 pts" in soak["why"]
    # decided by the weather check before any look: the bootstrap interval, marked descriptive
    expiry = rows["v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-w_expiry"]
    assert expiry["numbers"][:2] == ["-12.0 [-24.0, -4.0]", "95 % *"]
    # a reason's "[kv-digest]" is text, not markup
    assert "[kv-digest]" in xfail["why"]


def _result(record: dict) -> SimpleNamespace:
    verdict = record["verdict"]
    return SimpleNamespace(record=record, cell=SimpleNamespace(cell_id=record["cell"]["id"],
                                                               fault=record["cell"].get("fault")),
                           verdict=SimpleNamespace(outcome=verdict["outcome"],
                                                   status=verdict["status"],
                                                   reason=verdict["reason"]))


def test_a_runs_console_log_has_the_table_whole_and_no_progress_bar(tmp_path, monkeypatch):
    """`run`'s end (harness.cli.run.finish) after lm-eval's real tqdm bars, into a log (not a
    terminal): console.log in the run folder is what was printed, less the bars."""
    from tqdm import tqdm

    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("COLUMNS", raising=False)
    start_console_log()
    try:
        print("evaluating baseline (gsm_synth, 50 questions)", flush=True)
        for _ in tqdm(range(50), desc="Requesting API", mininterval=0):
            time.sleep(0.001)
        recs = load_records(SMOKE)
        code = finish([_result(r) for r in recs], SimpleNamespace(junit_xml=None),
                      SimpleNamespace(run_dir=tmp_path, run_id="r"), time.monotonic())
    finally:
        stop_console_log()
    assert code == 0
    log = (tmp_path / CONSOLE_LOG).read_text()
    assert log == out.getvalue() + err.getvalue()          # everything printed, nothing else
    assert not BAR.search(log) and "\r" not in log and not BAR.search(err.getvalue())
    table = log[log.index("pd-accuracy verdicts"):log.index("11 cells:")]
    assert set(rows_of(table)) == {r["cell"]["id"] for r in recs}
    assert log.rstrip().splitlines()[-1].startswith(
        summary_line(r["verdict"]["outcome"] for r in recs) + " in ")


def test_bars_still_reach_a_terminal_but_not_the_log(tmp_path, monkeypatch):
    from tqdm import tqdm

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    start_console_log()
    try:
        for _ in tqdm(range(5), mininterval=0):
            pass
        print("after the bar", file=sys.stderr)
        path = save_console_log(tmp_path)
    finally:
        stop_console_log()
    assert BAR.search(err.getvalue())                       # redrawn in place for a person
    assert path is not None and path.read_text() == "after the bar\n"


def test_the_annotation_counts_and_numbers_are_the_runs(tmp_path, capsys, monkeypatch):
    """The committed CPU smoke: the annotation's heading is the line `run` ended with, the
    command says the same, counts are integers and the interval is the verdict's."""
    from harness.cli.main import main
    from harness.cli.run import final_line

    monkeypatch.delenv("BUILDKITE", raising=False)
    recs = load_records(SMOKE)
    run_said = final_line([r["verdict"]["outcome"] for r in recs], 0, "x").split(" in 0s")[0]
    assert run_said == "11 cells: 4 PASS, 1 XFAIL, 6 canaries caught"
    out = tmp_path / "annotation.md"
    assert main(["annotate", "--results-dir", str(SMOKE), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.splitlines()[0] == f"### P/D accuracy: {run_said}"
    assert f"{out}: {run_said}; style success" in capsys.readouterr().out
    xfail = next(line for line in text.splitlines()
                 if line.startswith("| `v1-CPU_ATTN-p64d128-tiny-llama-gsm-tp1x1-eager` |"))
    assert "| -98.0 | [-99.8, -69.7] pts (99.61 %, verdict) | 50 |" in xfail
    assert "22997/22997 prompt tokens external" in xfail and ".0/" not in xfail
