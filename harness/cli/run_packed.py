"""`pd-accuracy run` on a GPU machine: the run's baseline groups packed on the GPUs
(harness.run.plan.packing plans, harness.run.plan.packed runs them), then one verdict table, one
JUnit file, one summary line and one exit code, as for a run in one process."""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.core.redact import redact

# options a child does not get from the parent: the parent chose its cells and where it writes
_PARENT_ONLY = frozenset({"keyword", "shard", "only", "junit_xml", "results_dir", "run_id",
                          "parallel_groups", "dry_run"})


@dataclass(frozen=True)
class _RunPlace:
    """What `finish` reads of a runner: where the records are, and the run's id."""

    run_dir: Path
    run_id: str
    peak_rss_bytes: int | None = None   # each group's servers are its child's to measure


def child_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The options the parent was given that every child repeats, as a command line: each
    option whose value differs from its default, minus those the parent decides per group."""
    argv: list[str] = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk of its options
        if not action.option_strings or action.dest in _PARENT_ONLY or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default or value is None:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):   # noqa: SLF001
            argv.append(flag)
        elif isinstance(action, argparse._AppendAction):   # noqa: SLF001
            argv += [f"{flag}={item}" for item in value]   # "=": a value may start with "-"
        else:
            argv.append(f"{flag}={value}")
    return argv


def packed_command(args: argparse.Namespace, parser: argparse.ArgumentParser,
                   cells: Sequence[Cell], options: RunOptions, parallel: int | None,
                   finish: Callable, on_runner: Callable | None = None) -> int:
    """Plan the groups, run them packed, collect every record, print and exit as `run` does.
    `parser` is `run`'s (the children repeat its options); `on_runner` gets what `bench` reads
    of a runner (the run directory)."""
    from harness.core.platform import detect_gpus, query_gpu_used_bytes
    from harness.judge.verdict import Policy
    from harness.run.plan.packed import (PackedRun, collect_results, host_room, kv_cache_bytes,
                                    weight_bytes)
    from harness.run.plan.packing import (STARTING_PER_GPU, Packer, group_jobs, max_parallel_groups,
                                     read_gpu_rooms)
    from harness.run.record import Recorder
    from harness.run.runner import new_run_id
    from harness.serve.host.start_slots import ENV_VAR as MAX_STARTING_ENV

    on_cpu = cells[0].device == "cpu"
    devices = [] if on_cpu else detect_gpus()
    rooms = [host_room()] if on_cpu else read_gpu_rooms(devices, query_gpu_used_bytes())
    jobs = group_jobs(cells, kv_cache_bytes=lambda c: kv_cache_bytes(c, options),
                      weight_bytes=weight_bytes, layout=options.gpu_layout)
    max_groups = parallel or max_parallel_groups(os.cpu_count() or 1, len(rooms))
    packer = Packer(rooms, max_groups)
    for job in jobs:
        why = packer.never_fits(job)
        if why and job.gpus > len(rooms):
            print(f"pd-accuracy: error: group {job.name} ({job.cell_ids[0]}, ...) {why}",
                  file=sys.stderr)
            return 2
        if why:
            print(f"warning: group {job.name} {why}; it runs alone", flush=True)
    run_id = getattr(args, "run_id", None) or new_run_id()
    run_dir = Path(options.results_dir) / run_id
    # a per-GPU cap on servers in start-up; a CPU run keeps the caller's (or none)
    starting = options.max_starting or (None if on_cpu else STARTING_PER_GPU * len(rooms))
    child_argv = child_options(args, parser)

    def argv_of(job) -> list[str]:
        return [sys.executable, "-m", "harness.cli.main", "run", *child_argv,
                "--only", ",".join(job.cell_ids), "--results-dir", str(run_dir),
                "--run-id", f"{run_id}-{job.name}", "--parallel-groups", "1"]

    def env_of(gpus: tuple[int, ...]) -> dict[str, str]:
        env = {MAX_STARTING_ENV: str(starting)} if starting else {}
        if not on_cpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(devices[g].index) for g in gpus)
        return env

    where = "this host's memory" if on_cpu else f"{len(devices)} GPU(s)"
    print(f"run {run_id}: {len(cells)} cell(s) in {len(jobs)} baseline groups on "
          f"{where}, up to {max_groups} groups at once and {starting or 'any number of'} "
          f"servers starting at once; results in {run_dir}", flush=True)
    if on_runner is not None:
        on_runner(_RunPlace(run_dir, run_id))
    started = time.monotonic()
    packed = PackedRun(jobs, packer, argv_of, env_of, run_dir,
                       progress=lambda m: print(redact(m), flush=True))
    try:
        turns = packed.run()
    except (KeyboardInterrupt, SystemExit) as stop:
        # no verdict after a stop (the recorder refuses one): show what the groups judged
        return judged_before_stop(cells, run_dir, stop, time.monotonic() - started)
    finally:
        packed.write_record({"cells": len(cells), "gpus": len(devices),
                             "gpu_names": [d.name for d in devices],
                             "cores": os.cpu_count(), "max_starting": starting})
    recorder = Recorder(options, asdict(Policy.from_options(options)), run_id,
                        Path(options.results_dir), lambda m: print(redact(m), flush=True))
    results = collect_results(cells, turns, run_dir, recorder)
    return finish(results, args, _RunPlace(run_dir, run_id), started)


__all__ = ["child_options", "packed_command"]


def judged_before_stop(cells: Sequence[Cell], run_dir: Path, stop: BaseException,
                       seconds: float) -> int:
    """After a stop signal: the verdict table of the records the groups wrote before it, one
    line saying how many cells that is, and the stop's exit status (130 for SIGINT)."""
    from harness.judge.verdict import Verdict
    from harness.report.console import print_table
    from harness.run.record import CellResult, load_records

    wanted = {c.cell_id: c for c in cells}
    results = [CellResult(wanted[r["cell"]["id"]], Verdict.from_dict(r["verdict"]),
                          Path(r["_path"]), r)
               for r in load_records(run_dir) if r["cell"].get("id") in wanted]
    print_table(results)
    print(f"interrupted after {seconds:.0f}s: {len(results)} of {len(cells)} cells judged; "
          f"records under {run_dir}", flush=True)
    code = stop.code if isinstance(stop, SystemExit) and isinstance(stop.code, int) else 130
    return code
