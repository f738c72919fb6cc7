"""`pd-accuracy bench`: where the time of a run went. Runs the selected cells exactly as
`pd-accuracy run` does (same arguments), or reads a finished run (`--from RUN_DIR`), then prints

* every server's start-up, broken into phases read from its log (harness.serve.launch.startup_phases),
  the phases summed over all servers, and each phase's median over all servers and per role
  (baseline, prefill, decode);
* per cell: start-up, baseline eval, P/D eval, start-up's share of the cell's wall time, and
  the KV digest's hashing time (both sides, summed over the cell's requests) against its P/D
  eval;
* the run's wall time, peak RSS of all servers together and how busy the host's cores were
  (when it ran here: on 2 cores the smoke profile is CPU-bound, so overlapping work only fills
  idle core time);
* when it ran here, the CPU load sampled every 100 ms (harness.run.evidence.cpu_load): the
  host's run queue against its cores, system and steal time, and per process of the run (each
  server's API server, engine core and worker, the harness with lm-eval and the proxy) its
  runnable threads by name and its CPU seconds; and the host's CPU model and ISA (bf16 speed
  depends on it).

`--out FILE` writes the same numbers as a benchmark record (JSON) to commit. Numbers only, no
thresholds: speed targets are read from records, never asserted in tests.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.core.outcomes import EXIT_OK, EXIT_USAGE


def server_logs(run_dir: Path) -> list[Path]:
    """vLLM server logs of a run, or of every group of a packed run (the proxy's logs have no
    start-up to read)."""
    logs = [p for pattern in ("logs/*.log", "logs/*.log.gz", "*/logs/*.log", "*/logs/*.log.gz")
            for p in sorted(run_dir.glob(pattern))]
    return [p for p in logs if "proxy" not in p.name]


def packing_of(run_dir: Path) -> dict[str, Any] | None:
    """A packed run's packing.json (harness.run.plan.packed): groups at once, GPUs, wall time."""
    path = run_dir / "packing.json"
    return json.loads(path.read_text()) if path.is_file() else None


ROLES = ("baseline", "prefill", "decode")
# a server log's stem ends in its spec's name: baseline, prefill-0, decode-1, decode-0.restart1
_ROLE_RE = re.compile(r"-(baseline|prefill|decode)(?:-\d+)?(?:\.restart\d+)?$")


def role_of(server: str) -> str | None:
    """baseline, prefill or decode, from a server log's stem; None for any other log."""
    match = _ROLE_RE.search(server)
    return match.group(1) if match else None


def _server_name(log_path: str) -> str:
    """A server log's name less .log (and .log.gz: committed runs keep their logs gzipped)."""
    name = Path(log_path).name
    return name.removesuffix(".gz").removesuffix(".log")


def median(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(numbers), 1) if numbers else None


def phase_medians(servers: list[dict[str, Any]], phases: tuple[str, ...]) -> dict[str, Any]:
    """Servers that became ready, their start-up median and each phase's median (a phase a
    server's log lacks, e.g. compile of an eager server, is left out of that phase's median)."""
    ready = [s for s in servers if s.get("total_s") is not None]
    return {"servers": len(ready), "startup_median_s": median([s["total_s"] for s in ready]),
            "phase_median_s": {p: median([s.get(p) for s in ready]) for p in phases}}


def _baseline_key(record: dict) -> str:
    from harness.core.cell import Cell

    return Cell.from_dict(record["cell"]).baseline_key


def cell_rows(run_dir: Path) -> list[dict[str, Any]]:
    from harness.run.record import load_records

    rows = []
    for rec in load_records(run_dir):
        t = rec.get("timings") or {}
        startup, base, pd = (t.get("startup_s") or 0.0, t.get("baseline_eval_s") or 0.0,
                             t.get("pd_eval_s") or 0.0)
        total = t.get("total_s") or startup + base + pd
        cost = ((rec.get("metrics") or {}).get("transfer") or {}).get("kv_digest") or {}
        digest_s = sum((cost.get("cost_s") or {}).values()) if cost else None
        rows.append({"kv_digest_s": digest_s,
                     "kv_digest_share_of_pd_eval": digest_s / pd if digest_s and pd else None,"cell": rec["cell"]["id"], "outcome": rec["verdict"]["outcome"],
                     "group": f"{rec['run_id']}/{_baseline_key(rec)}",
                     "startup_s": startup, "startup_wait_s": t.get("startup_wait_s"),
                     "baseline_eval_s": base, "pd_eval_s": pd, "total_s": total,
                     "group_total_s": t.get("group_total_s")})
    return rows


def _records_hardware(run_dir: Path) -> dict[str, Any] | None:
    """The hardware the run's first record names, or None where it has none."""
    from harness.run.record import load_records

    return next((r["hardware"] for r in load_records(run_dir) if r.get("hardware")), None)


def busy_share(before: Any, after: Any) -> float | None:
    """The share of the host's CPU time between two `psutil.cpu_times()` readings that was
    not idle (idle and iowait count as idle)."""
    spent = {f: getattr(after, f) - getattr(before, f) for f in after._fields}
    total = sum(spent.values())
    idle = spent.get("idle", 0.0) + spent.get("iowait", 0.0)
    return (total - idle) / total if total > 0 else None


def bench_record(run_dir: Path, wall_s: float | None = None,
                 peak_rss_bytes: int | None = None,
                 cpu_busy_share: float | None = None,
                 cpu_load: dict[str, Any] | None = None) -> dict[str, Any]:
    from harness.run.evidence.provenance import hardware
    from harness.serve.launch.startup_phases import PHASES, parse_logs, summed

    servers = [s for s in parse_logs(server_logs(run_dir)) if s.phases]
    rows = [{"server": _server_name(s.log_path), "total_s": s.total_s, **s.phases} for s in servers]
    cells = cell_rows(run_dir)
    packing = packing_of(run_dir)
    if packing and wall_s is None:
        wall_s = packing.get("wall_s")
    ready = sorted(s.total_s for s in servers if s.total_s is not None)
    # wall time: each baseline group once; start-up: what the run sat waiting for servers
    # a group's wall time; a group stopped before it ended wrote none: its longest cell then
    groups: dict[str, float] = {}
    for c in cells:
        groups[c["group"]] = c["group_total_s"] or max(groups.get(c["group"], 0.0),
                                                       c["total_s"] or 0.0)
    # the cells of a group share its servers: their start-up wait is counted once per group
    waits: dict[str, float] = {}
    for c in cells:
        waits[c["group"]] = max(waits.get(c["group"], 0.0), c["startup_wait_s"] or 0.0)
    waited = sum(waits.values())
    return {
        "run_dir": str(run_dir),
        # the machine the servers ran on, as the records say (a packed run's parent runs none);
        # CPU timings compare only across equal cpu_isa
        "hardware": _records_hardware(run_dir) or hardware("cpu"),
        "wall_s": wall_s,
        "peak_rss_bytes": peak_rss_bytes,
        "host_cpu_busy_share": cpu_busy_share,
        "servers": rows,
        "phases_summed_s": summed(servers),
        "phase_median_s": phase_medians(rows, PHASES)["phase_median_s"],
        "by_role": {role: phase_medians([r for r in rows if role_of(r["server"]) == role], PHASES)
                    for role in ROLES},
        "phases": list(PHASES),
        "server_startup_median_s": ready[len(ready) // 2] if ready else None,
        "server_startup_range_s": [ready[0], ready[-1]] if ready else None,
        "cells": cells,
        "startup_wait_s": waited,
        "cell_wall_s": sum(groups.values()),
        "startup_share_of_cell_time": waited / sum(groups.values()) if groups else None,
        "kv_digest_share_of_pd_eval": _digest_share(cells),
        "cpu_load": cpu_load,
        # CPU-seconds carry across hosts where wall time does not (a busy or slower host)
        "cpu_s_per_cell": (cpu_load["run_cpu_s"] / len(cells)
                           if cpu_load and cpu_load.get("run_cpu_s") and cells else None),
        # a packed run (GPU): groups at once, and each cell's share of the GPUs' time
        "packing": ({k: packing.get(k) for k in ("max_groups", "peak_concurrent_groups",
                                                 "started_while_another_ran", "gpus",
                                                 "gpu_names", "cores", "max_starting")}
                    if packing else None),
        "gpu_s_per_cell": (wall_s * packing["gpus"] / len(cells)
                           if packing and packing.get("gpus") and wall_s and cells else None),
    }


def _digest_share(cells: list[dict[str, Any]]) -> float | None:
    """The digest's hashing time over the P/D eval time, summed over the cells that digested."""
    digested = [c for c in cells if c["kv_digest_s"] is not None and c["pd_eval_s"]]
    total = sum(c["pd_eval_s"] for c in digested)
    return sum(c["kv_digest_s"] for c in digested) / total if total else None


def print_bench(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    phases = record["phases"]
    table = Table(title="server start-up, seconds per phase (read from each server's log)")
    for col in ("server", *phases, "total"):
        table.add_column(col, justify="left" if col == "server" else "right")
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    for s in record["servers"]:
        table.add_row(s["server"], *(fmt(s.get(p)) for p in phases), fmt(s["total_s"]))
    table.add_row("all servers (summed)", *(fmt(record["phases_summed_s"][p]) for p in phases),
                  fmt(sum(record["phases_summed_s"].values())))
    table.add_row("median, all servers", *(fmt(record["phase_median_s"][p]) for p in phases),
                  fmt(median([s["total_s"] for s in record["servers"]])))
    for role, mine in record["by_role"].items():
        if mine["servers"]:
            table.add_row(f"median, {mine['servers']} {role}",
                          *(fmt(mine["phase_median_s"][p]) for p in phases),
                          fmt(mine["startup_median_s"]))
    console.print(table)
    cells = Table(title="cells")
    for col in ("cell", "outcome", "waited for servers s", "baseline eval s", "P/D eval s",
                "KV digest s"):
        cells.add_column(col)
    for c in record["cells"]:
        digest = c.get("kv_digest_s")
        cells.add_row(c["cell"], c["outcome"], fmt(c["startup_wait_s"]),
                      fmt(c["baseline_eval_s"]), fmt(c["pd_eval_s"]),
                      "-" if digest is None else f"{digest:.2f}")
    console.print(cells)
    if record.get("cpu_load"):
        print_cpu_load(console, record["cpu_load"])
    hw = record["hardware"]
    console.print(f"host: {hw.get('cpu')}, {hw.get('cpu_count')} cores, ISA "
                  f"{' '.join(hw.get('cpu_isa') or []) or '-'}")
    share = record["startup_share_of_cell_time"]
    med = record["server_startup_median_s"]
    console.print(f"servers: {len(record['servers'])}, start-up median {fmt(med)} s "
                  f"(range {record['server_startup_range_s']}); waited for servers "
                  f"{fmt(record['startup_wait_s'])} s of {fmt(record['cell_wall_s'])} s cell time: "
                  f"{'-' if share is None else f'{100 * share:.0f}%'}"
                  + (f"; run wall time {record['wall_s']:.0f} s" if record.get("wall_s") else "")
                  + (f"; peak RSS {record['peak_rss_bytes'] / 2**30:.2f} GiB"
                     if record.get("peak_rss_bytes") else "")
                  + (f"; cores busy {100 * record['host_cpu_busy_share']:.0f}%"
                     if record.get("host_cpu_busy_share") is not None else "")
                  + (f"; KV digest {100 * record['kv_digest_share_of_pd_eval']:.1f}% of P/D eval"
                     if record.get("kv_digest_share_of_pd_eval") else "")
                  + (f"; CPU {record['cpu_s_per_cell']:.0f} s per cell"
                     if record.get("cpu_s_per_cell") else ""))


def print_cpu_load(console: Any, load: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"runnable threads per process (sampled every {load['interval_s']} s, "
                        f"{load['samples']} samples)")
    for col in ("process", "comm", "runnable mean", "peak", "threads", "CPU s",
                "ctx switches vol/invol", "runnable threads (share of samples)"):
        table.add_column(col)
    for p in load["processes"]:
        if not p["cpu_s"] and not p["runnable_mean"]:
            continue
        top = ", ".join(f"{name} {share:.2f}" for name, share in
                        list(p["runnable_threads"].items())[:4])
        table.add_row(p["process"], p["comm"], f"{p['runnable_mean']:.2f}",
                      str(p["runnable_peak"]), str(p["threads_peak"]), f"{p['cpu_s']:.0f}",
                      f"{p['voluntary_switches']}/{p['involuntary_switches']}", top)
    console.print(table)
    shares = load.get("cpu_shares") or {}
    pct = lambda k: f"{100 * shares[k]:.0f}%" if k in shares else "-"  # noqa: E731
    console.print(f"run queue (procs_running): mean {load['run_queue_mean']:.1f}, p95 "
                  f"{load['run_queue_p95']}, max {load['run_queue_max']} on {load['cores']} cores; "
                  f"the run's threads runnable: mean {load['run_runnable_mean']:.1f}; CPU "
                  f"{load['run_cpu_s']:.0f} s; host time user {pct('user')}, system "
                  f"{pct('system')}, steal {pct('steal')}, idle {pct('idle')}")
    pd = load.get("during_pd") or {}
    if pd.get("samples"):
        console.print(f"while a P/D pair was evaluated ({pd['samples']} samples): run queue mean "
                      f"{pd['run_queue_mean']:.1f}, p95 {pd['run_queue_p95']}; the run's threads "
                      f"runnable mean {pd['run_runnable_mean']:.1f}, p95 {pd['run_runnable_p95']}"
                      + (f"; less the yielding start-ups' threads (nice > 0): run queue mean "
                         f"{pd['contending_run_queue_mean']:.1f}, p95 "
                         f"{pd['contending_run_queue_p95']}"
                         if pd.get("contending_run_queue_mean") is not None else ""))


def bench(args: argparse.Namespace) -> int:
    wall = rss = busy = load = None
    if args.from_dir:
        run_dir = Path(args.from_dir)
        if not ((run_dir / "logs").is_dir() or (run_dir / "packing.json").is_file()):
            print(f"pd-accuracy: error: {run_dir} has no logs/ (not a run directory)",
                  file=sys.stderr)
            return EXIT_USAGE
    else:
        import psutil

        from harness.cli.run import run_command
        from harness.run.evidence.cpu_load import CpuLoadSampler

        started, cpu_before = time.monotonic(), psutil.cpu_times()
        holder: dict[str, Any] = {}
        sampler = CpuLoadSampler().start()
        try:
            code = run_command(args, on_runner=lambda r: holder.setdefault("runner", r))
        finally:
            load = sampler.stop()
        if "runner" not in holder:
            return code
        runner = holder["runner"]
        run_dir, wall, rss = runner.run_dir, time.monotonic() - started, runner.peak_rss_bytes
        busy = busy_share(cpu_before, psutil.cpu_times())
    record = bench_record(run_dir, wall, rss, busy, load)
    print_bench(record)
    if args.out:
        from harness.core.atomic import atomic_write_text

        atomic_write_text(args.out, json.dumps(record, indent=2) + "\n")
        print(f"benchmark record: {args.out}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli import values as v
    from harness.cli import vocabulary as vocab

    p = sub.add_parser("bench", help="run cells (as `run` does) and show where the time went: "
                                     "start-up phases per server, eval, shares")
    p.add_argument("--from", dest="from_dir", metavar="RUN_DIR",
                   type=v.text("--from"),
                   help="read a finished run's logs and records instead of running (no other "
                        "option but --out)")
    vocab.add_out(p, "also write the numbers as a benchmark record (JSON) to FILE")
    vocab.add_selection(p)
    vocab.add_platform(p)
    vocab.add_cell(p)
    vocab.add_canary(p)
    vocab.add_evaluation(p)
    vocab.add_servers(p)
    out = p.add_argument_group("output")
    vocab.add_results_dir(out, "results/bench")
    vocab.add_junit(out)
    vocab.add_verbose(out)
    p.set_defaults(func=bench, dry_run=False)
