"""`pd-accuracy bench`: time the smoke cell end to end and print the numbers (no assertions).

Prints start-up (servers healthy), baseline eval, P/D eval, total wall time and the peak RSS of
all servers together, so speed and memory targets are measured, not asserted in tests."""
from __future__ import annotations

import argparse
import time


def bench(args: argparse.Namespace) -> int:
    from harness.core.cell import Cell
    from harness.core.options import RunOptions
    from harness.matrix.rules import normalize_cell
    from harness.run.runner import Runner
    from harness.judge.verdict import Policy

    cell = normalize_cell(Cell(model=args.model, prefill_block_size=args.block_size,
                               decode_block_size=args.block_size))
    options = RunOptions(limit=args.limit, results_dir=args.results_dir,
                         noise_floor=not args.no_noise_floor)
    started = time.monotonic()
    runner = Runner(options, Policy(), progress=lambda m: print(m, flush=True))
    [result] = runner.run([cell])
    total = time.monotonic() - started
    t = result.record.get("timings", {})
    rows = [
        ("cell", cell.cell_id),
        ("verdict", f"{result.verdict.outcome}: {result.verdict.reason[:120]}"),
        ("questions", str(options.limit)),
        ("start-up (baseline + P/D pair, concurrent)", f"{t.get('startup_s', float('nan')):.1f} s"),
        ("baseline eval (incl. A/A re-run)", f"{t.get('baseline_eval_s', float('nan')):.1f} s"),
        ("P/D eval", f"{t.get('pd_eval_s', float('nan')):.1f} s"),
        ("total wall time", f"{total:.1f} s"),
        ("peak RSS, all servers", f"{runner.peak_rss_bytes / 2**30:.2f} GiB"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time and measure the smoke cell (prints numbers)")
    p.add_argument("--model", default="tiny-llama-gsm")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--no-noise-floor", action="store_true")
    p.add_argument("--results-dir", default="results/bench")
    p.set_defaults(func=bench)
