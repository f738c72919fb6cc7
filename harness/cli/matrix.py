"""`pd-accuracy list`: show the cells a profile expands to on this (or a pretend) machine."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.matrix import MatrixError, describe_rules, expand, load_matrix, parse_shard, select, shard
from harness.core.platform import PlatformInfo
from harness.core.outcomes import EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    from harness.cli import vocabulary as vocab

    p = subparsers.add_parser("list", help="list the cells of a matrix profile",
                              description="Expand a matrix profile and show its cells (and, with "
                                          "--show-excluded, the cells dropped and why).")
    vocab.add_selection(p, profile_default="smoke")
    vocab.add_platform(p, allow_any=True, what="list the cells of this machine")
    p.add_argument("--show-excluded", action="store_true",
                   help="also list excluded cells with rule and reason")
    vocab.add_json(p)
    p.add_argument("--rules", action="store_true", help="list the validity rules and exit")
    p.set_defaults(func=run_list)


def _error(message: str) -> int:
    print(f"pd-accuracy: error: {' '.join(str(message).split())}", file=sys.stderr)
    return EXIT_USAGE


def run_list(args: argparse.Namespace) -> int:
    # logs and CI pipes are not terminals: give them one line per cell instead of 80 columns
    console = Console(width=None if sys.stdout.isatty() else 220, soft_wrap=False)
    if args.rules:
        table = Table(title="validity rules (harness/rules.py)")
        for column in ("rule", "kind", "what it checks"):
            table.add_column(column)
        for name, kind, summary in describe_rules():
            table.add_row(name, kind, summary)
        console.print(table)
        return EXIT_OK
    try:
        if args.platform == "any":
            platform = None
        else:
            platform = PlatformInfo.from_spec(args.platform) if args.platform else PlatformInfo.detect()
        spec = load_matrix(args.matrix)
        expansion = expand(spec, args.profile, platform)
        only = None if args.only is None else [c for c in args.only.split(",") if c]
        cells = select(expansion.cells, only, args.keyword)
        if args.shard:
            cells = shard(cells, *parse_shard(args.shard))
    except (MatrixError, ValueError) as exc:
        return _error(str(exc))

    where = platform.describe() if platform is not None else "any machine"
    if args.json:
        payload = {
            "profile": args.profile,
            "platform": where,
            "cells": [{**c.to_dict(), "gpus": c.gpus_needed, "baseline_key": c.baseline_key,
                       "notes": list(expansion.notes.get(c.cell_id, ()))} for c in cells],
            "excluded": [{"id": x.cell.cell_id, "rule": x.rule, "reason": x.reason}
                         for x in expansion.excluded] if args.show_excluded else [],
            "pairwise": [{**dataclasses.asdict(c), "line": c.line()} for c in expansion.coverage],
            "vllm_releases": list(spec.profile(args.profile).vllm_releases),
        }
        print(json.dumps(payload, indent=1))
        return EXIT_OK

    table = Table(title=f"profile {args.profile} on {where}: {len(cells)} cell(s)")
    table.add_column("cell id", no_wrap=True)
    table.add_column("GPUs p+d/base", justify="right")
    table.add_column("baseline")
    table.add_column("expected failure / note")
    for cell in cells:
        need = cell.gpus_needed
        gpus = f"{need['prefill']}+{need['decode']}/{need['baseline']}" if cell.device == "cuda" else "cpu"
        remarks = []
        if cell.expected_failure:
            remarks.append(f"[yellow]xfail:[/] {cell.expected_failure}")
        if cell.fault:
            remarks.append(f"[magenta]canary {cell.fault}:[/] must be caught")
        remarks += [f"[dim]{n}[/]" for n in expansion.notes.get(cell.cell_id, ())]
        table.add_row(cell.cell_id, gpus, cell.baseline_key[:8], "\n".join(remarks))
    console.print(table)
    if args.show_excluded:
        dropped = Table(title=f"excluded: {len(expansion.excluded)} cell(s)")
        dropped.add_column("cell id", no_wrap=True)
        dropped.add_column("rule")
        dropped.add_column("reason")
        for item in expansion.excluded:
            dropped.add_row(item.cell.cell_id, item.rule, item.reason)
        console.print(dropped)
    elif expansion.excluded:
        console.print(f"[dim]{len(expansion.excluded)} cell(s) excluded; --show-excluded lists them with reasons[/]")
    if not expansion.cells and platform is not None:
        from harness.cli.cells import no_cells_here

        console.print(no_cells_here(spec, args.profile, platform, expansion), highlight=False,
                      soft_wrap=True)
    for coverage in expansion.coverage:   # a pairwise grid: its covering array against the product
        console.print(f"pairwise {coverage.line()}", highlight=False, soft_wrap=True)
    releases = spec.profile(args.profile).vllm_releases
    if releases:
        console.print(releases_line(releases), highlight=False, soft_wrap=True)
    return EXIT_OK


def releases_line(releases: Any) -> str:
    """What `list` says of a profile's vllm_releases (docs/releases.md)."""
    return (f"vLLM releases: {', '.join(releases)} (the pipeline's release step runs the smoke "
            f"cells on each)")
