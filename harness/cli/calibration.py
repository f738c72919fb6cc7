"""`pd-accuracy calibration --results-dir DIR`: false alarms and canary catches over repeated runs."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from harness.core.outcomes import EXIT_FAIL, EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibration", help="summarize a --repeats run: false alarms and canary catches",
        description="Read the per-repeat records of `pd-accuracy run --repeats N` and count, per "
                    "cell, the FAILs of real cells (false alarms) and the canaries caught for "
                    "their own reason. Exit 1 when a real cell failed or a canary was missed.")
    from harness.cli import vocabulary as vocab

    vocab.add_results_dir(p, None, "the --results-dir of the --repeats run", read=True,
                          required=True, repeat=True)
    vocab.add_json(p, "print JSON rows instead of a table")
    p.set_defaults(func=run_calibration)


def run_calibration(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harness.judge.calibration import record_paths, summarize

    paths = [p for d in args.results_dir for p in record_paths(d)]
    if not paths:
        print(f"pd-accuracy: error: no per-repeat records (<run>-rNN/*.json) under "
              f"{', '.join(args.results_dir)}", file=sys.stderr)
        return EXIT_USAGE
    cells = summarize(paths)
    if args.json:
        print(json.dumps([c.row() for c in cells], indent=2))
    else:
        table = Table(title=f"calibration over {len(paths)} records")
        for col in ("cell", "repeats", "outcomes", "false alarms / caught", "accuracy drop (pts)",
                    "generations differing"):
            table.add_column(col)
        for c in cells:
            row = c.row()
            table.add_row(c.cell_id, str(c.repeats),
                          " ".join(f"{k} {v}" for k, v in row["outcomes"].items()),
                          f"caught {row['caught']}" if c.fault else f"false alarms {row['false_alarms']}",
                          "–".join(map(str, row.get("accuracy_drop_pts", []))),
                          "–".join(map(str, row.get("generations_differing", []))))
        Console(width=None if sys.stdout.isatty() else 200).print(table)
    bad = any((c.fault and c.caught < c.repeats) or (not c.fault and not c.expected_failure
                                                     and c.false_alarms) for c in cells)
    return EXIT_FAIL if bad else EXIT_OK
