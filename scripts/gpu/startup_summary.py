#!/usr/bin/env python3
"""Start-up summary of GPU runs made with scripts/gpu/run_profile.sh (docs/startup.md's numbers).

    .venv/bin/python scripts/gpu/startup_summary.py RUN_DIR [RUN_DIR ...] > startup.json

RUN_DIR is one unpacked `results/gpu/<TAG>` directory whose `records/*/bench.json` were written
by `pd-accuracy bench --from` (run_profile.sh does that). Per run: the servers' start-up median
and range, each phase's median, the same per role, and per cell its wall time, start-up and P/D
evaluation with GPU-minutes (the cell's wall time x 1 GPU: servers share one GPU).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

PHASES = ("imports", "api_config", "engine_init", "weights", "compile", "kv_cache", "ready")


def _median(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 1) if values else None


def _phases(servers: list[dict]) -> dict:
    return {p: _median([s.get(p) for s in servers]) for p in PHASES}


def summarize(run_dir: Path) -> dict:
    servers = [s for p in sorted(run_dir.glob("records/*/bench.json"))
               for s in json.loads(p.read_text())["servers"] if s.get("total_s")]
    cells = []
    for path in sorted(run_dir.glob("records/*/*.json")):
        record = json.loads(path.read_text())
        if "verdict" not in record:
            continue
        t = record.get("timings") or {}
        cells.append({"cell": record["cell"]["id"], "outcome": record["verdict"]["outcome"],
                      "total_s": t.get("total_s"), "startup_s": t.get("startup_s"),
                      "pd_eval_s": t.get("pd_eval_s"),
                      "gpu_min": round(t["total_s"] / 60, 2) if t.get("total_s") else None})
    totals = [s["total_s"] for s in servers]
    return {
        "servers": len(servers),
        "startup_median_s": _median(totals),
        "startup_range_s": [min(totals), max(totals)] if totals else None,
        "phase_median_s": _phases(servers),
        "by_role": {role: {"servers": len(mine), "startup_median_s": _median([s["total_s"] for s in mine]),
                           "phase_median_s": _phases(mine)}
                    for role in ("baseline", "prefill", "decode")
                    for mine in [[s for s in servers if f"-{role}" in s["server"]]]},
        "cell_total_s_median": _median([c["total_s"] for c in cells]),
        "gpu_min_per_cell_median": _median([c["gpu_min"] for c in cells]),
        "cells": cells,
        "per_server": servers,
    }


if __name__ == "__main__":
    json.dump({Path(d).name: summarize(Path(d)) for d in sys.argv[1:]}, sys.stdout, indent=1)
    print()
