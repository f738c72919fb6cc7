"""Calibration: what repeated runs (`pd-accuracy run --repeats N`) say about the verdict itself.

A real cell that FAILs on a repeat is a false alarm; a canary that does not FAIL, or FAILs for
another reason, is a miss. `summarize` reads the per-repeat records (``<run>-rNN/*.json``) and
counts both, per cell. The canary reason patterns live in harness.judge.canaries, which the
verdict, the pytest suite and this count share.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from harness.judge.canaries import caught_for_its_reason


@dataclass
class CellCalibration:
    cell_id: str
    fault: str | None
    expected_failure: bool
    outcomes: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    accuracy_drops: list[float] = field(default_factory=list)   # baseline − P/D, per repeat
    differing: list[float] = field(default_factory=list)        # share of generations differing

    @property
    def repeats(self) -> int:
        return len(self.outcomes)

    @property
    def caught(self) -> int:
        """Canary: repeats that FAILed for the canary's own reason."""
        return sum(1 for s, r in zip(self.statuses, self.reasons)
                   if caught_for_its_reason(self.fault or "", s, r))

    @property
    def false_alarms(self) -> int:
        """Real cell: repeats that FAILed (an expected failure's FAIL is its XFAIL)."""
        return sum(1 for o in self.outcomes if o == "FAIL")

    def row(self) -> dict:
        counts = {o: self.outcomes.count(o) for o in sorted(set(self.outcomes))}
        row = {"cell": self.cell_id, "repeats": self.repeats, "outcomes": counts}
        if self.fault:
            row["caught"] = f"{self.caught}/{self.repeats}"
        else:
            row["false_alarms"] = f"{self.false_alarms}/{self.repeats}"
        if self.accuracy_drops:
            row["accuracy_drop_pts"] = [round(100 * d, 1) for d in
                                        (min(self.accuracy_drops), max(self.accuracy_drops))]
        if self.differing:
            row["generations_differing"] = [round(min(self.differing), 2),
                                            round(max(self.differing), 2)]
        return row


def record_paths(results_dir: str | Path) -> list[Path]:
    """Every repeat's cell records under `results_dir` (a --results-dir): ``<run>-rNN/*.json``,
    plus ``<run>/*.json`` of those runs (a cell whose servers never started has one record there
    instead of one per repeat; it counts as one attempt)."""
    root = Path(results_dir)
    repeats = sorted(root.glob("*-r[0-9][0-9]/*.json"))
    runs = {p.parent.name.rsplit("-r", 1)[0] for p in repeats}
    return repeats + sorted(p for run in runs for p in (root / run).glob("*.json"))


def summarize(paths: Iterable[Path]) -> list[CellCalibration]:
    cells: dict[str, CellCalibration] = {}
    for path in paths:
        rec = json.loads(Path(path).read_text())
        cell, verdict, metrics = rec["cell"], rec["verdict"], rec.get("metrics") or {}
        cid = cell.get("id") or path.stem
        cal = cells.setdefault(cid, CellCalibration(cid, cell.get("fault"),
                                                    bool(cell.get("expected_failure"))))
        cal.outcomes.append(verdict["outcome"])
        cal.statuses.append(verdict.get("status") or verdict["outcome"])
        cal.reasons.append(verdict.get("reason", ""))
        if metrics.get("baseline_accuracy") is not None and metrics.get("pd_accuracy") is not None:
            cal.accuracy_drops.append(metrics["baseline_accuracy"] - metrics["pd_accuracy"])
        if metrics.get("generations_differing") is not None and metrics.get("n"):
            cal.differing.append(metrics["generations_differing"] / metrics["n"])
    return list(cells.values())
