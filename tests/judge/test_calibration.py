"""harness.judge.calibration: counting false alarms and canary catches over per-repeat records."""
from __future__ import annotations

import json
from pathlib import Path

from harness.cli.main import main
from harness.core.cell import FAULTS
from harness.core.outcomes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from harness.judge.calibration import record_paths, summarize
from harness.judge.canaries import CANARY_REASONS


def _record(root: Path, repeat: int, cell_id: str, outcome: str, reason: str,
            fault: str | None = None, base: float = 1.0, pd: float = 1.0, differ: int = 0) -> None:
    d = root / f"20261130T000000Z-abc123-r{repeat:02d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{cell_id}.json").write_text(json.dumps({
        "cell": {"id": cell_id, "fault": fault, "expected_failure": None},
        "verdict": {"outcome": outcome, "status": outcome, "reason": reason},
        "metrics": {"baseline_accuracy": base, "pd_accuracy": pd, "generations_differing": differ,
                    "n": 50},
    }))


def test_false_alarms_and_catches(tmp_path, capsys):
    for r in range(3):
        _record(tmp_path, r, "real", "PASS" if r else "FAIL", "P/D evaluation failed")
        _record(tmp_path, r, "canary", "FAIL", "P/D accuracy is lower (60 pts)", "corrupt-block",
                pd=0.4, differ=40)
        _record(tmp_path, r, "drop", "FAIL" if r < 2 else "PASS",
                "decode recomputed the prompt: no KV crossed", "drop-transfer")
    cells = {c.cell_id: c for c in summarize(record_paths(tmp_path))}
    assert cells["real"].false_alarms == 1 and cells["real"].repeats == 3
    assert cells["canary"].caught == 3
    assert cells["canary"].row()["accuracy_drop_pts"] == [60.0, 60.0]
    assert cells["drop"].caught == 2
    assert main(["calibration", "--results-dir", str(tmp_path), "--json"]) == EXIT_FAIL
    rows = {r["cell"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["real"]["false_alarms"] == "1/3" and rows["drop"]["caught"] == "2/3"


def test_wrong_reason_is_a_miss_and_clean_runs_pass(tmp_path):
    _record(tmp_path, 0, "canary", "FAIL", "P/D evaluation failed: 502", "corrupt-block")
    assert summarize(record_paths(tmp_path))[0].caught == 0
    # a pair that never started leaves one record in the run directory itself: one missed attempt
    run_dir = tmp_path / "20261130T000000Z-abc123"
    run_dir.mkdir()
    (run_dir / "canary.json").write_text(
        (tmp_path / "20261130T000000Z-abc123-r00" / "canary.json").read_text())
    assert summarize(record_paths(tmp_path))[0].repeats == 2
    clean = tmp_path / "clean"
    for r in range(2):
        _record(clean, r, "real", "PASS", "ok")
        _record(clean, r, "canary", "FAIL", "another request's transfer parameters", "foreign-params")
    assert main(["calibration", "--results-dir", str(clean)]) == EXIT_OK
    assert set(CANARY_REASONS) == set(FAULTS)   # every fault says what catching it means


def test_no_records_is_a_usage_error(tmp_path, capsys):
    assert main(["calibration", "--results-dir", str(tmp_path)]) == EXIT_USAGE
    assert "no per-repeat records" in capsys.readouterr().err
