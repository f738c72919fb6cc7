#!/usr/bin/env python3
"""Markdown summary of GPU runs made with scripts/gpu/run_profile.sh.

    .venv/bin/python scripts/gpu/summarize.py RUN_DIR:NGPU [RUN_DIR:NGPU ...] > SUMMARY-table.md

RUN_DIR is one unpacked `results/gpu/<TAG>` directory (cells.json + records/); NGPU the GPUs
that run held (for GPU-minutes = the cell's wall time x GPUs, so concurrent runs overlap).
Prints one table row per record, the totals, the KV digest's cost (the seconds both sides spent
hashing, which block their servers' steps, over the P/D evaluation's wall time: an upper bound
of its share), and per run the cells that wrote no record.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.report.annotate import md_cell, outcome_of  # noqa: E402  (the annotation's own formatting)


def _fmt(x, digits=2):
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def digest_cost(rec: dict) -> tuple[float | None, float | None]:
    """(seconds the prefill and decode spent hashing, P/D eval seconds) of one record."""
    digest = ((rec.get("metrics") or {}).get("transfer") or {}).get("kv_digest") or {}
    cost = digest.get("cost_s") or {}
    spent = sum(cost.values()) if cost else None
    return spent, (rec.get("timings") or {}).get("pd_eval_s")


def digest_share(rec: dict) -> str:
    spent, pd = digest_cost(rec)
    return "-" if spent is None or not pd else f"{spent:.1f} / {pd:.0f} = {100 * spent / pd:.1f} %"


def rows_of(run_dir: Path, ngpu: int) -> tuple[list[str], float, list[str], list[dict]]:
    tag = run_dir.name
    records = []
    for path in sorted(run_dir.glob("records/*/*.json")):
        rec = json.loads(path.read_text())
        if "verdict" in rec:
            records.append(rec)
    lines, gpu_min = [], 0.0
    for rec in sorted(records, key=lambda r: r["cell"]["id"]):
        m = rec.get("metrics") or {}
        t = rec.get("timings") or {}
        wall = t.get("total_s") or t.get("startup_s") or 0.0
        minutes = wall * ngpu / 60
        gpu_min += minutes
        agree = m.get("agreement")
        ext = (m.get("transfer") or {}).get("prompt_tokens_external")
        reason = md_cell(rec["verdict"]["reason"][:220])
        lines.append(" | ".join([
            "", tag, f"`{rec['cell']['id']}`", outcome_of(rec),
            _fmt(m.get("baseline_accuracy")), _fmt(m.get("pd_accuracy")),
            _fmt(agree.get("rate") if isinstance(agree, dict) else agree),
            _fmt(ext, 0) if isinstance(ext, float) else _fmt(ext),
            _fmt(t.get("startup_s"), 0), _fmt(t.get("pd_eval_s"), 1), digest_share(rec),
            f"{minutes:.1f}", reason, ""]
        ).strip())
    cells = json.loads((run_dir / "cells.json").read_text())["cells"]
    done = {r["cell"]["id"] for r in records}
    missing = [c["id"] for c in cells if c["id"] not in done]
    return lines, gpu_min, missing, records


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print("| run | cell | outcome | baseline | P/D | gen. agree | ext. tokens | start-up s "
          "| P/D eval s | digest s / P/D eval s | GPU-min | reason |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    every: list[dict] = []
    total, outcomes, not_run = 0.0, Counter(), []
    for arg in argv:
        path, _, ngpu = arg.rpartition(":")
        lines, minutes, missing, records = rows_of(Path(path), int(ngpu))
        print("\n".join(lines))
        total += minutes
        outcomes.update(outcome_of(r) for r in records)
        every += records
        if missing:
            not_run.append(f"- {Path(path).name}: {len(missing)} not run: "
                           + ", ".join(f"`{c}`" for c in missing))
    n = sum(outcomes.values())
    print(f"\n**{n} records, " + ", ".join(f"{v} {k}" for k, v in sorted(outcomes.items()))
          + f"; GPU-minutes (wall x GPUs of the run, per cell; concurrent runs overlap): "
          f"{total:.1f} total.**")
    costs = [(r["cell"]["id"], *digest_cost(r)) for r in every]
    costs = [(c, s, p) for c, s, p in costs if s is not None and p]
    if costs:
        spent, pd = sum(s for _, s, _ in costs), sum(p for _, _, p in costs)
        worst = max(costs, key=lambda x: x[1] / x[2])
        print(f"\nKV digest: {spent:.1f} s of hashing (prefill + decode) over {pd:.0f} s of P/D "
              f"evaluation in {len(costs)} cells = {100 * spent / pd:.1f} % (target <= 10 %); "
              f"highest `{worst[0]}` {100 * worst[1] / worst[2]:.1f} %.")
    if not_run:
        print("\nCells that wrote no record (the call's time ran out first):\n")
        print("\n".join(not_run))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
