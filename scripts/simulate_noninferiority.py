#!/usr/bin/env python3
"""Calibrate the sequential non-inferiority gate: error rates and questions used, two ways.

For a grid of synthetic cells (baseline accuracy 0.6-1.0, chance discordance 0-10 %, true drop
0, margin/2, margin, 2 margin, 10 pts) it runs the full sequential rule of
`harness.judge.sequential` on many synthetic paired datasets (Monte Carlo,
`harness.judge.power.simulate`) and computes the same probabilities exactly
(`harness.judge.power.operating_characteristics`), for the default plan (looks at 50, 100, 200,
400) and for GSM8K's budget (50 ... 800, 1319). It checks

    false PASS  (true drop >= margin, declared PASS) <= alpha_pass
    false FAIL  (true drop = 0, declared FAIL)       <= alpha_fail

exactly and within Monte-Carlo error (rate <= alpha + 3 standard errors), records the exact
one-look error of Tango's bound at high discordance, the questions a clean cell needs, and how
the spending functions compare. Writes summary.json and summary.md under --out.

    .venv/bin/python scripts/simulate_noninferiority.py [--reps 20000] [--seed 20261201]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.judge import noninferiority as ni  # noqa: E402
from harness.judge.power import (  # noqa: E402
    cell_probabilities, doubling_stages, operating_characteristics, simulate)
from harness.judge.sequential import SPENDING_FUNCTIONS, SequentialPlan  # noqa: E402

ACCURACIES = (0.6, 0.7, 0.8, 0.9, 0.97, 1.0)
DISCORDANCES = (0.0, 0.02, 0.05, 0.10)
CLEAN_CELLS = ((1.0, 0.0), (0.97, 0.02))


def _round(x: float) -> float:
    return float(f"{x:.5g}")


def scenarios(margin: float) -> list[tuple[float, float, float]]:
    drops = sorted({0.0, margin / 2, margin, 2 * margin, 0.10})
    out = []
    for acc in ACCURACIES:
        for psi in DISCORDANCES:
            for drop in drops:
                try:
                    cell_probabilities(acc, psi, drop)
                except ValueError:
                    continue        # impossible at this accuracy (e.g. discordance at 100 %)
                out.append((acc, psi, drop))
    return out


SIMULATED_COLUMNS = ["accuracy", "discordance", "drop", "pass", "fail", "inconclusive",
                     "questions"]
EXACT_COLUMNS = SIMULATED_COLUMNS[1:]


def run_plan(plan: SequentialPlan, reps: int, rng: np.random.Generator) -> dict:
    """Simulated rates for every cell; exact ones per (discordance, drop): the rule sees only
    b and c, whose law does not depend on the baseline accuracy beyond what it makes possible."""
    simulated, exact = [], {}
    for acc, psi, drop in scenarios(plan.margin):
        p_b, p_c = cell_probabilities(acc, psi, drop)
        mc = simulate(plan, acc, p_b, p_c, reps, rng)
        simulated.append([acc, psi, drop] + [_round(x) for x in (
            mc.p_pass, mc.p_fail, mc.inconclusive, mc.expected_questions)])
        if (psi, drop) not in exact:
            ex = operating_characteristics(plan, p_b, p_c)
            exact[(psi, drop)] = [psi, drop, _round(ex.p_pass), _round(ex.p_fail),
                                  _round(ex.inconclusive), _round(ex.expected_questions)]
    return {"simulated_columns": SIMULATED_COLUMNS, "simulated": simulated,
            "exact_columns": EXACT_COLUMNS, "exact": list(exact.values())}


def check(plan: SequentialPlan, cells: dict, reps: int) -> dict:
    out = {}
    for name, key, alpha, hypothesis in (
            ("false_pass", "pass", plan.alpha_pass, lambda drop: drop >= plan.margin - 1e-12),
            ("false_fail", "fail", plan.alpha_fail, lambda drop: drop == 0.0)):
        mc = max(row[SIMULATED_COLUMNS.index(key)] for row in cells["simulated"]
                 if hypothesis(row[2]))
        exact = max(row[EXACT_COLUMNS.index(key)] for row in cells["exact"]
                    if hypothesis(row[1]))
        limit = alpha + 3.0 * math.sqrt(alpha * (1.0 - alpha) / reps)
        out[name] = {"alpha": alpha, "mc_max": mc, "mc_limit": _round(limit),
                     "exact_max": exact, "ok": bool(mc <= limit and exact <= alpha)}
    # the two computations share only `look_outcomes`: they must agree within MC error
    exact_by_cell = {(row[0], row[1]): row for row in cells["exact"]}
    worst_z = 0.0
    for row in cells["simulated"]:
        ex = exact_by_cell[(row[1], row[2])]
        for key in ("pass", "fail", "inconclusive"):
            p = ex[EXACT_COLUMNS.index(key)]
            se = math.sqrt(max(p * (1.0 - p), 1.0 / reps) / reps)
            worst_z = max(worst_z, abs(row[SIMULATED_COLUMNS.index(key)] - p) / se)
    out["simulated_vs_exact_worst_z"] = _round(worst_z)
    return out


def tango_size(margin: float, alphas=(0.01, 0.001)) -> list[dict]:
    """Exact one-look P(claim non-inferiority | drop = margin), worst over the discordance."""
    rows = []
    for n in (50, 100, 200, 400, 800, 1319):
        for alpha in alphas:
            realistic = [ni.rejection_probability(n, psi / 2 + margin, psi / 2, margin, alpha)
                         for psi in (0.0, 0.01, 0.02, 0.05, 0.1, 0.15)]
            extreme = [ni.rejection_probability(n, psi / 2 + margin, psi / 2, margin, alpha)
                       for psi in (0.2, 0.3, 0.5, 0.7, 0.9, 1.0 - margin)]
            rows.append({"n": n, "alpha": alpha,
                         "worst_ratio_discordance_le_0.15": _round(max(realistic) / alpha),
                         "worst_ratio_discordance_0.2_to_0.95": _round(max(extreme) / alpha)})
    return rows


def compare_spending(stages: tuple[int, ...]) -> list[dict]:
    rows = []
    for spending in sorted(SPENDING_FUNCTIONS):
        plan = SequentialPlan(stages=stages, fail_spending=spending, pass_spending=spending)
        row: dict = {"spending": spending}
        for acc, psi in CLEAN_CELLS + ((0.8, 0.1),):
            oc = operating_characteristics(plan, *cell_probabilities(acc, psi, 0.0))
            row[f"clean {acc}/{psi}"] = {"pass": _round(oc.p_pass),
                                         "questions": _round(oc.expected_questions)}
        for drop in (0.025, 0.10):
            oc = operating_characteristics(plan, *cell_probabilities(0.9, 0.05, drop))
            row[f"drop {drop} (0.9/0.05)"] = {"fail": _round(oc.p_fail),
                                              "questions": _round(oc.expected_questions)}
        row["worst false pass"] = _round(max(
            operating_characteristics(plan, psi / 2 + plan.margin, psi / 2).p_pass
            for psi in (0.0, 0.02, 0.1, 0.3, 0.6, 0.9)))
        rows.append(row)
    return rows


def clean_facts(plan: SequentialPlan) -> dict:
    first_pass = next((k for k in range(1, plan.n_looks + 1)
                       if ni.clean_upper_bound(plan.stages[k - 1], 1 - plan.levels(k)[1])
                       <= plan.margin), None)
    return {"first_look_a_clean_cell_can_pass": first_pass,
            "at_questions": plan.stages[first_pass - 1] if first_pass else None}


def markdown(summary: dict) -> str:
    lines = ["# Non-inferiority gate: calibration", "",
             f"Generated by `scripts/simulate_noninferiority.py` (seed {summary['seed']}, "
             f"{summary['reps']} synthetic datasets per cell, exact sums alongside). Margin "
             f"{100 * summary['margin']:.0f} pts, alpha_fail = alpha_pass = "
             f"{summary['alpha']}.", "",
             "## Clean cells (every question agrees)", "",
             f"- 99 % upper bound of the drop at n = 50 with b = c = 0: "
             f"{100 * summary['clean_bound_n50']:.2f} pts (> 5: no PASS at 50 questions "
             f"even with the full alpha); fewest questions for a clean PASS at 99 %: "
             f"{summary['clean_pass_questions']}.", ""]
    for name, block in summary["plans"].items():
        lines += [f"## Plan {name}: looks at {block['plan']['stages']}, "
                  f"{block['plan']['pass_spending']} spending", "",
                  f"- per-look levels (fail, pass): "
                  + ", ".join(f"({a:.2g}, {b:.2g})" for a, b in block["plan"]["levels"]),
                  f"- a clean cell can first PASS at look {block['clean']['first_look_a_clean_cell_can_pass']}"
                  f" ({block['clean']['at_questions']} questions)"]
        for key, label in (("false_pass", "false PASS (drop >= margin)"),
                           ("false_fail", "false FAIL (drop = 0)")):
            c = block["checks"][key]
            lines.append(f"- {label}: worst exact {c['exact_max']:.4g}, worst simulated "
                         f"{c['mc_max']:.4g} (limit {c['mc_limit']:.4g}) vs alpha "
                         f"{c['alpha']}: {'ok' if c['ok'] else 'VIOLATED'}")
        lines.append(f"- simulated vs exact: worst difference "
                     f"{block['checks']['simulated_vs_exact_worst_z']} standard errors over "
                     f"{len(block['cells']['simulated'])} cells x 3 outcomes")
        lines += ["", "Exact probabilities (the same at every baseline accuracy that allows the "
                  "discordance; the simulated ones per accuracy are in summary.json):", "",
                  "| discordance | drop | PASS | FAIL | INCONCLUSIVE | E[questions] |",
                  "|---|---|---|---|---|---|"]
        for psi, drop, p_pass, p_fail, p_inc, questions in block["cells"]["exact"]:
            lines.append(f"| {psi} | {drop} | {p_pass:.4f} | {p_fail:.4f} | {p_inc:.4f} | "
                         f"{questions:.0f} |")
        lines.append("")
        lines += ["Spending functions compared (exact):", "",
                  "| spending | " + " | ".join(k for k in block["spending"][0] if k != "spending")
                  + " |", "|---" * len(block["spending"][0]) + "|"]
        for row in block["spending"]:
            cells = [row["spending"]] + [
                ", ".join(f"{k} {v:.4g}" for k, v in val.items()) if isinstance(val, dict)
                else f"{val:.4g}" for key, val in row.items() if key != "spending"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Tango's bound alone: exact one-look error at drop = margin / alpha", "",
              "| n | alpha | discordance <= 0.15 | discordance 0.2-0.95 |", "|---|---|---|---|"]
    for r in summary["tango_one_look"]:
        lines.append(f"| {r['n']} | {r['alpha']} | {r['worst_ratio_discordance_le_0.15']} | "
                     f"{r['worst_ratio_discordance_0.2_to_0.95']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--out", type=Path,
                        default=Path("results/calibration/noninferiority-sim"))
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    default = SequentialPlan()
    gsm8k = SequentialPlan(stages=doubling_stages(1319))
    summary = {"seed": args.seed, "reps": args.reps, "margin": default.margin,
               "alpha": default.alpha_pass,
               "clean_bound_n50": _round(ni.clean_upper_bound(50, 1 - default.alpha_pass)),
               "clean_pass_questions": ni.questions_for_clean_pass(default.margin,
                                                                   1 - default.alpha_pass),
               "plans": {}}
    for name, plan in (("default", default), ("gsm8k", gsm8k)):
        rows = run_plan(plan, args.reps, rng)
        summary["plans"][name] = {"plan": plan.to_dict(), "clean": clean_facts(plan),
                                  "checks": check(plan, rows, args.reps), "cells": rows,
                                  "spending": compare_spending(plan.stages)}
    summary["tango_one_look"] = tango_size(default.margin)
    summary["seconds"] = round(time.monotonic() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, indent=1)
    # one line per table row: collapse the innermost lists
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m[1]) + "]",
                  text)
    (args.out / "summary.json").write_text(text + "\n")
    (args.out / "summary.md").write_text(markdown(summary))
    ok = all(block["checks"][key]["ok"] for block in summary["plans"].values()
             for key in ("false_pass", "false_fail"))
    print(f"wrote {args.out}/summary.json and summary.md in {summary['seconds']} s; "
          f"error rates {'within' if ok else 'OUTSIDE'} the stated alphas")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
