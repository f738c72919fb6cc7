"""A GPU run packed by harness.run.plan.packing: every baseline group is one `pd-accuracy run` child
process on the GPUs the packer gave it, as many at once as fit, the next admitted as soon as one
ends (so a group starts while others evaluate).

Children are separate processes because a group's flow (servers, proxy, lm-eval) is built for
one group at a time per process; the parent only admits, waits and collects. Each child is its
own process group (ManagedProcess) and is stopped on every exit path of the parent. Their
records land under the parent's run directory, one folder per group; a group that ended without
a record for one of its cells gets an ERROR record from the parent that points at its console.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.judge.verdict import Verdict, error
from harness.run.evidence.effective_config_evidence import record_judged
from harness.run.plan.packing import GIB, GpuRoom, GroupJob, Packer, model_weight_bytes
from harness.run.record import CellResult, Recorder, load_records
from harness.serve.supervision.process import ManagedProcess

POLL_S = 0.5
STOP_GRACE_S = 30.0


@dataclass
class GroupTurn:
    """One group's life in the packed run (times are seconds since the run began)."""

    job: GroupJob
    gpus: tuple[int, ...] = ()
    started_s: float | None = None
    ended_s: float | None = None
    exit_code: int | None = None
    console: str = ""

    def to_dict(self) -> dict:
        return {"group": self.job.name, "cells": list(self.job.cell_ids), "gpus": list(self.gpus),
                "peak_gib": round(self.job.peak_bytes / GIB, 2),
                "started_s": None if self.started_s is None else round(self.started_s, 1),
                "ended_s": None if self.ended_s is None else round(self.ended_s, 1), "exit_code": self.exit_code, "console": self.console}


@dataclass
class PackedRun:
    """Runs `jobs` through `packer`. `child_argv(job)`: the child's command line;
    `gpu_env(gpus)`: the child's environment for the GPUs it got (CUDA_VISIBLE_DEVICES)."""

    jobs: Sequence[GroupJob]
    packer: Packer
    child_argv: Callable[[GroupJob], list[str]]
    gpu_env: Callable[[tuple[int, ...]], Mapping[str, str]]
    run_dir: Path
    progress: Callable[[str], None] = print
    poll_s: float = POLL_S
    turns: list[GroupTurn] = field(default_factory=list)
    wall_s: float = 0.0

    def run(self) -> list[GroupTurn]:
        console_dir = self.run_dir / "console"
        console_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        pending = [GroupTurn(job) for job in self.jobs]
        self.turns = list(pending)
        running: dict[str, tuple[GroupTurn, ManagedProcess]] = {}
        try:
            while pending or running:
                for name, (turn, proc) in list(running.items()):
                    if proc.returncode is None:
                        continue
                    turn.ended_s, turn.exit_code = time.monotonic() - began, proc.returncode
                    self.packer.release(turn.job)
                    del running[name]
                    self.progress(f"group {turn.job.name} ended (exit {turn.exit_code}) after "
                                  f"{turn.ended_s - (turn.started_s or 0):.0f} s; "
                                  f"{len(running)} running, {len(pending)} waiting")
                for turn in list(pending):
                    gpus = self.packer.place(turn.job)
                    if gpus is None:
                        continue
                    pending.remove(turn)
                    turn.gpus, turn.started_s = gpus, time.monotonic() - began
                    turn.console = str(console_dir / f"{turn.job.name}.log")
                    proc = ManagedProcess(turn.job.name, self.child_argv(turn.job), turn.console,
                                          env=dict(self.gpu_env(gpus)))
                    proc.start()
                    running[turn.job.name] = (turn, proc)
                    self.progress(f"group {turn.job.name} started on GPU "
                                  f"{','.join(map(str, gpus))} ({len(turn.job.cell_ids)} cell(s), "
                                  f"~{turn.job.peak_bytes / GIB:.0f} GiB); {len(running)} running")
                if pending and not running:
                    # nothing runs and nothing fits: the packer's own rule admits a lone group
                    raise RuntimeError(f"group {pending[0].job.name} cannot be placed")
                time.sleep(self.poll_s)
        finally:
            for _, proc in running.values():
                proc.stop(term_timeout_s=STOP_GRACE_S)
            self.wall_s = time.monotonic() - began
        return self.turns

    def write_record(self, extra: Mapping | None = None) -> Path:
        """packing.json: each group's GPUs and times, how many ran at once, the wall time."""
        path = self.run_dir / "packing.json"
        spans = [(t.started_s, t.ended_s) for t in self.turns
                 if t.started_s is not None and t.ended_s is not None]
        path.write_text(json.dumps({
            "wall_s": round(self.wall_s, 1), "groups": [t.to_dict() for t in self.turns],
            "max_groups": self.packer.max_groups,
            "peak_concurrent_groups": peak_overlap(spans),
            "started_while_another_ran": started_while_another_ran(spans),
            **dict(extra or {})}, indent=1) + "\n")
        return path


def peak_overlap(spans: Sequence[tuple[float, float]]) -> int:
    """The most spans open at one moment."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda ev: (ev[0], ev[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def started_while_another_ran(spans: Sequence[tuple[float, float]]) -> int:
    """Groups that started while an earlier-started group was still running."""
    return sum(1 for i, (s, _) in enumerate(spans)
               if any(s0 <= s < e0 for j, (s0, e0) in enumerate(spans) if j != i and s0 <= s))


def collect_results(cells: Sequence[Cell], turns: Sequence[GroupTurn], run_dir: Path,
                    recorder: Recorder) -> list[CellResult]:
    """Every cell's result from its group's record, in `cells` order; a cell whose group wrote
    none gets an ERROR record naming the group's exit and console."""
    by_id = {}
    for record in load_records(run_dir):
        by_id.setdefault(record["cell"]["id"], []).append(record)
    turn_of = {cid: t for t in turns for cid in t.job.cell_ids}
    results = []
    for cell in cells:
        records = by_id.get(cell.cell_id)
        if records:
            for record in records:
                results.append(CellResult(cell, Verdict.from_dict(record["verdict"]),
                                          Path(record["_path"]), record))
            continue
        turn = turn_of.get(cell.cell_id)
        why = ("its group never started" if turn is None or turn.started_s is None else
               f"its group {turn.job.name} exited {turn.exit_code} without a record "
               f"(console: {turn.console})")
        results.append(record_judged(recorder, cell, error(why, cell.expected_failure),
                                     artifacts={"console": turn.console if turn else ""}))
    return results


# what the packer is told of a cell and of the host, read from the cell's model and options
def host_room() -> GpuRoom:
    """A CPU run's one room: the host's memory available now."""
    import psutil

    memory = psutil.virtual_memory()
    return GpuRoom(0, memory.total, memory.available)


def kv_cache_bytes(cell: Cell, options: RunOptions) -> int:
    """The KV cache a server of `cell` gets (harness.serve.deploy.plan_server's rule)."""
    from harness.serve.deploy import DEFAULT_KV_CACHE_BYTES
    from harness.serve.launch.models import resolve

    return options.kv_cache_bytes or resolve(cell.model).kv_cache_bytes or DEFAULT_KV_CACHE_BYTES


def weight_bytes(cell: Cell) -> int:
    """The weights a server of `cell` places on its GPU, from its config.json's shape."""
    from harness.serve.launch.models import resolve

    model = resolve(cell.model)
    config = Path(model.path) / "config.json"
    if not model.local or not config.is_file():
        return 0   # a hub id not cached here: the overhead term carries it
    return model_weight_bytes(json.loads(config.read_text()), cell.dtype)


__all__ = ["GroupTurn", "PackedRun", "collect_results", "host_room", "kv_cache_bytes",
           "peak_overlap", "started_while_another_ran", "weight_bytes"]
