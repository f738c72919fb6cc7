"""`pd-accuracy warm`: fill the JIT and compile caches a profile's servers need, ahead of a run.

A GPU server's cold start is mostly work that one server of a configuration can do for all the
others: FlashInfer compiles its kernels on first use (210-264 s on the H200), vLLM's
torch.compile writes AOT artifacts, Triton caches its kernels. They all land in caches keyed by
the configuration (harness.run.plan.packing.warm_key: model, backend, runner, dtype, compilation, KV
dtype). `warm` starts the baseline and first P/D pair of one cell per such key, waits until they
are healthy and stops them; a farm can run it once and keep the cache directories it prints
(a packed `run` fills them in its own first wave when nothing was warmed). Takes `run`'s
selection, cell and server options (no evaluation: nothing is asked); `--dry-run` prints the
servers it would start. Exit 0 when every server became healthy, 3 otherwise.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from harness.core.outcomes import EXIT_ERROR, EXIT_OK

# where the servers' caches live (the defaults of FlashInfer, vLLM, Triton and Inductor)
CACHE_DIRS = ("~/.cache/flashinfer", "~/.cache/vllm", "~/.triton/cache",
              "/tmp/torchinductor_" + os.environ.get("USER", "root"))


def warm(args: argparse.Namespace) -> int:
    from harness.cli import front_door
    from harness.cli.run import dry_run
    from harness.core.options import UsageError
    from harness.judge.verdict import Policy
    from harness.run.plan.packing import warm_key
    from harness.run.runner import Runner
    from harness.serve.supervision.process import ManagedProcessError, install_signal_handlers

    try:
        admission = front_door.admit(args)
    except UsageError as exc:
        return front_door.report(str(exc))
    options, cells = admission.options, admission.cells
    leaders = {}
    for cell in cells:
        if cell.fault is None:
            leaders.setdefault(warm_key(cell), cell)
    if not leaders:
        return front_door.report("no cell selected: warm starts the servers of cells without a "
                                 "fault, and every selected cell is a canary")
    if args.dry_run:
        print(f"# warm: {len(leaders)} configuration(s) of {len(cells)} cell(s)")
        catalog = admission.catalog
        hybrid = [c.model for c in leaders.values()
                  if catalog is not None and catalog.get(c.model).is_hybrid]
        return dry_run(list(leaders.values()), options, hybrid, args, settings=False)
    install_signal_handlers()
    runner = Runner(options, Policy.from_options(options), progress=lambda m: print(m, flush=True))
    print(f"warming {len(leaders)} configuration(s) of {len(cells)} cell(s): one baseline and "
          f"one P/D pair each; logs in {runner.log_dir}", flush=True)
    started = time.monotonic()
    servers = []
    try:
        for cell in leaders.values():
            group = runner.planner.plan([cell])
            for deployment in (runner.planner.baseline(group), runner.planner.pair(group, 0)):
                deployment.launch()
                servers.append((cell, deployment))
        failed = 0
        for cell, deployment in servers:
            try:
                deployment.wait()
                print(f"warm: {deployment.name} healthy after "
                      f"{time.monotonic() - started:.0f} s ({cell.backend}, {cell.runner})",
                      flush=True)
            except ManagedProcessError as exc:
                failed += 1
                print(f"warm: {deployment.name} failed: {exc}", flush=True)
    finally:
        for _, deployment in servers:
            deployment.stop()
        runner.close()
    present = [d for d in (Path(p).expanduser() for p in CACHE_DIRS) if d.is_dir()]
    print(f"warm: {len(servers) - failed} of {len(servers)} servers healthy in "
          f"{time.monotonic() - started:.0f} s; caches to keep: "
          f"{', '.join(map(str, present)) or 'none found'}")
    return EXIT_ERROR if failed else EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli import vocabulary as vocab

    p = sub.add_parser("warm", help="fill the JIT and compile caches of a profile's server "
                                    "configurations (one baseline and pair each), then stop")
    vocab.add_selection(p)
    vocab.add_platform(p)
    vocab.add_cell(p)
    vocab.add_servers(p, parallel_groups=False)
    out = p.add_argument_group("output")
    vocab.add_results_dir(out, "results/warm", "where the servers' logs go")
    vocab.add_dry_run(out, "print the servers it would start; start nothing")
    vocab.add_verbose(out)
    p.set_defaults(func=warm)
