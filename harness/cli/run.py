"""`pd-accuracy run`: expand a profile (or one ad-hoc cell), validate everything before any server
starts, run the cells, print the verdict table, write records (and JUnit XML). With
`--deployment FILE`: judge a running deployment the harness did not start, as one cell
(harness.run.external), after every endpoint answered the pre-flight checks."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

from harness.cli.cells import (_random_weights, adhoc_cell, options_from,  # noqa: F401 (callers')
                               parallel_groups, print_not_applicable, select_cells, weather_params)
from harness.core.cell import Cell
from harness.cli.vocabulary import add_run_arguments, run_parser  # noqa: F401 (callers')
from harness.core.redact import install_log_redaction, redact
from harness.report.console import save_console_log, start_console_log, stop_console_log
from harness.report.junit import write_junit
from harness.core.options import RunOptions, UsageError
from harness.core.outcomes import EXIT_CODES, EXIT_USAGE, MISSED, summary_line, worst_outcome


def print_table(results, stream=None) -> None:
    """The verdict table (harness.report.console): ids whole, reasons wrapped at words."""
    from harness.report.console import print_table as print_verdicts

    print_verdicts(results, stream)


def run_command(args: argparse.Namespace, on_runner=None) -> int:
    """`pd-accuracy run`; `on_runner(runner)` is called once the Runner exists (bench reads its
    run directory and peak RSS afterwards)."""
    from harness.cli import front_door

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    install_log_redaction()
    start_console_log()        # the run folder keeps a copy of what it prints (console.log)
    try:
        admission = front_door.admit(args)
    except UsageError as exc:
        return front_door.report(str(exc))
    if getattr(args, "deployment", None):
        return deployment_command(args, on_runner)
    if getattr(args, "vllm", None):
        from harness.run.releases import run_releases

        return run_releases(args.vllm, args.argv, args.results_dir, args.dry_run)
    options, cells, catalog = admission.options, admission.cells, admission.catalog
    not_applicable = admission.not_applicable
    hybrid_models = [c.model for c in cells
                     if catalog is not None and catalog.get(c.model).is_hybrid]
    parallel = parallel_groups(args)
    if args.dry_run:
        return dry_run(cells, options, hybrid_models, args)

    from harness.judge.verdict import Policy
    from harness.serve.supervision.process import install_signal_handlers
    from harness.run.runner import Runner
    install_signal_handlers()

    def started(runner) -> None:
        """The run has its folder: record what this release cannot run, before any server."""
        if not_applicable:
            from harness.run.record import write_not_applicable
            write_not_applicable(Path(runner.run_dir), runner.run_id, not_applicable)
        if on_runner is not None:
            on_runner(runner)

    if parallel != 1 and packs(cells, parallel):
        from harness.cli.run_packed import packed_command
        return packed_command(args, run_parser(), cells, options, parallel, finish, started)
    from harness.serve.launch.server_spec import Features

    features = Features.detect()
    policy = Policy.from_options(options)
    began = time.monotonic()
    runner = Runner(options, policy, features=features, progress=lambda m: print(redact(m), flush=True),
                    hybrid_models=hybrid_models, run_id=getattr(args, "run_id", None))
    started(runner)
    print(f"run {runner.run_id}: {len(cells)} cell(s), results in {runner.run_dir}", flush=True)
    try:
        results = runner.run(cells)
    finally:
        runner.close()
    return finish(results, args, runner, began)


def packs(cells: Sequence[Cell], parallel: int | None) -> bool:
    """Whether the run packs its groups, each its own process: CUDA cells of more than one
    baseline group on a machine that has GPUs; CPU cells only when `--parallel-groups N` asks
    (a CPU run otherwise keeps one group in process and starts the next ahead)."""
    if not cells or len({c.baseline_key for c in cells}) < 2:
        return False
    if all(c.device == "cpu" for c in cells):
        return parallel is not None and parallel > 1
    if any(c.device != "cuda" for c in cells):
        return False
    from harness.core.platform import detect_gpus
    return bool(detect_gpus())


def deployment_command(args: argparse.Namespace, on_runner=None) -> int:
    """`pd-accuracy run --deployment FILE`: refuse other cell flags, load the file and ask every
    endpoint (each problem one line, exit 2, no question sent), then judge it as one cell."""
    from harness.cli import run_deployment as deployment

    try:
        options = options_from(args)
        dep, facts = deployment.preflight(args.deployment, options,
                                          allowed_auth_envs=tuple(args.allow_auth_env or ()))
    except UsageError as exc:
        for line in getattr(exc, "lines", None) or [str(exc)]:
            print(f"pd-accuracy: error: {redact(line)}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        deployment.describe(dep, facts)
        return 0
    from harness.judge.verdict import Policy
    from harness.run.external import run_external
    from harness.run.runner import Runner
    from harness.serve.supervision.process import install_signal_handlers

    install_signal_handlers()
    started = time.monotonic()
    runner = Runner(options, Policy.from_options(options), progress=lambda m: print(redact(m), flush=True))
    if on_runner is not None:
        on_runner(runner)
    print(f"run {runner.run_id}: deployment {dep.name} ({dep.source}), results in "
          f"{runner.run_dir}", flush=True)
    results = run_external(dep, runner, facts=facts)
    for line in dict.fromkeys(x for r in results for x in r.verdict.not_available):
        print(f"not checked: {line}")
    return finish(results, args, runner, started)


def final_line(outcomes: list[str], seconds: float, run_dir: object) -> str:
    """The run's last line: its outcomes counted, its time and where its records are."""
    return f"{summary_line(outcomes)} in {seconds:.0f}s; records under {run_dir}"


def finish(results, args: argparse.Namespace, runner, started: float) -> int:
    """The verdict table, JUnit XML, the canaries missed and the summary line; the exit code."""
    print_table(results)
    if args.junit_xml:
        write_junit(args.junit_xml, results, runner.run_id)
    outcomes = [r.verdict.outcome for r in results]
    for r in results:
        if r.verdict.outcome == MISSED:
            print(f"canary missed: {r.cell.cell_id} ({r.cell.fault}): {r.verdict.status}: "
                  f"{redact(r.verdict.reason)[:300]}")
    worst = worst_outcome(outcomes)
    print(final_line(outcomes, time.monotonic() - started, runner.run_dir))
    save_console_log(runner.run_dir)
    stop_console_log()
    return EXIT_CODES[worst]


def dry_run(cells: Sequence[Cell], options: RunOptions, hybrid_models: Sequence[str],
            args: argparse.Namespace | None = None, settings: bool = True) -> int:
    """The run's settings, then each cell's servers as the run would plan and start them (the
    same planners: ports, the digest files, a canary's armed decode, a netns cell's `ip netns
    exec`); nothing starts."""
    import tempfile

    from harness.serve.deploy import DeployContext, Placement, plan_baseline, plan_pair
    from harness.serve.launch.models import resolve
    from harness.protocol.faults import FAULT_KINDS as SERVER_FAULTS
    from harness.protocol.faults import PREFILL_FAULT_KINDS
    from harness.serve.host.ports import PortAllocator
    from harness.run.plan.group_plan import weather_servers

    run_id = getattr(args, "run_id", None) or "RUN_ID"
    if settings:
        print_settings(options, args)
    log_dir = Path(options.results_dir) / run_id / "logs"
    with tempfile.TemporaryDirectory() as locks:
        ctx = DeployContext(allocator=PortAllocator(lock_dir=locks),
                            placement=Placement.detect(options.gpu_layout), log_dir=log_dir,
                            startup_timeout_s=options.startup_timeout_s,
                            kv_cache_bytes=options.kv_cache_bytes, kv_digest=options.kv_digest)
        for cell in cells:
            model = resolve(cell.model)
            served = dict(model_path=model.path,
                          hybrid=model.hybrid or cell.model in hybrid_models,
                          load_format=model.load_format,
                          model_kv_cache_bytes=model.kv_cache_bytes)
            pair = plan_pair(cell, ctx, **served, arm_faults=cell.fault in SERVER_FAULTS,
                             weather=weather_servers(cell),
                             arm_prefill=cell.fault in PREFILL_FAULT_KINDS)
            print(f"# {cell.cell_id}  (baseline {cell.baseline_key})")
            for line in plan_baseline(cell, ctx, **served).commands() + pair.commands():
                print(redact(line))
            print()
    return 0


def print_settings(options: RunOptions, args: argparse.Namespace | None) -> None:
    """The run-wide settings a run would use, each as it was resolved (options and variables)."""
    settings = {**options.to_dict(), "looks": list(options.stages)}
    if args is not None:
        settings["parallel_groups"] = parallel_groups(args) or "auto"
        settings["log_level"] = "INFO" if getattr(args, "verbose", False) else "WARNING"
    print("# run settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run cells: real baseline vs real P/D pair, one verdict each")
    add_run_arguments(p)
    p.set_defaults(func=run_command)
