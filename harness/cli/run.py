"""`pd-accuracy run`: expand a profile (or one ad-hoc cell), validate everything before any server
starts, run the cells, print the verdict table, write records (and JUnit XML). With
`--deployment FILE`: judge a running deployment the harness did not start, as one cell
(harness.run.external), after every endpoint answered the pre-flight checks."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from harness.core.cell import (ASYNC_SCHEDULING, COMPILE_MODES, CUDAGRAPH_MODES, KV_CACHE_DTYPES,
                               KV_LAYOUTS, NETWORKS, RUNNERS, SPEC_DECODE_METHODS, Cell,
                               weather_items)
from harness.connectors import KV_CONNECTORS
from harness.weathers import WEATHERS
from harness.cli import run_checks
from harness.core.redact import install_log_redaction, redact
from harness.report.console import save_console_log, start_console_log, stop_console_log
from harness.report.junit import write_junit
from harness.core.options import GPU_LAYOUTS, SERVER_STARTS, RunOptions, UsageError
from harness.serve.host.start_slots import StartSlots
from harness.core.outcomes import EXIT_CODES, EXIT_USAGE, MISSED, summary_line, worst_outcome


_OPT = RunOptions()   # every option's one default
_CELL = Cell(model="-")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of `pd-accuracy run`, in its help groups."""
    _add_selection(p)
    _add_adhoc_cell(p)
    _add_evaluation(p)
    _add_output(p)


def _add_selection(p: argparse.ArgumentParser) -> None:
    sel = p.add_argument_group("which cells")
    sel.add_argument("--deployment", metavar="FILE", default=None,
                     help="judge a running P/D deployment described by FILE (docs/deployment.md) "
                          "instead of starting servers; no --profile or cell flags with it")
    sel.add_argument("--profile", help="matrix profile (smoke, cpu-full, pr, nightly)")
    sel.add_argument("--matrix", help="matrix YAML (default: harness/matrix/default.yaml)")
    sel.add_argument("--only", help="comma-separated cell ids or globs (as list --only)")
    sel.add_argument("-k", dest="keyword", help="keyword expression on cell ids (like pytest -k)")
    sel.add_argument("--shard", help="I/N: run the I-th of N deterministic shards (0-based)")


def _add_adhoc_cell(p: argparse.ArgumentParser) -> None:
    adhoc = p.add_argument_group("one ad-hoc cell (instead of --profile)")
    adhoc.add_argument("--model", help="zoo name, local path or hub id")
    adhoc.add_argument("--backend", default=None)
    adhoc.add_argument("--runner", default=_CELL.runner, help="the decode's and the baseline's")
    adhoc.add_argument("--prefill-runner", choices=RUNNERS, default=None,
                       help="the prefill's runner when not --runner (mixed runners, GPU)")
    adhoc.add_argument("--block-size", default="128", help="N or PREFILL:DECODE")
    adhoc.add_argument("--device", default=None, help="cpu | cuda (default: what this machine has)")
    adhoc.add_argument("--kv-buffer-device", default=None)
    adhoc.add_argument("--tp", default="1", help="N or PREFILL:DECODE")
    adhoc.add_argument("--dtype", default=_CELL.dtype)
    adhoc.add_argument("--max-model-len", type=int, default=_CELL.max_model_len)
    adhoc.add_argument("--fault", default=None, help="canary: drop-transfer | foreign-params | "
                       "corrupt-block | swap-blocks")
    adhoc.add_argument("--fault-block", default=None, metavar="first|last|N",
                       help="which received block a server-side canary breaks (default first)")
    adhoc.add_argument("--fault-share", default=None, metavar="S",
                       help="a server-side canary breaks this share of the questions only (0-1)")
    adhoc.add_argument("--fault-after", default=None, metavar="N",
                       help="a server-side canary breaks no request before the proxy's (N+1)-th "
                            "(a fault that starts late, e.g. in a soak)")
    adhoc.add_argument("--compile", choices=COMPILE_MODES, default=_CELL.compile,
                       help="default: vLLM's (torch.compile, CUDA graphs); eager: --enforce-eager")
    adhoc.add_argument("--network", choices=NETWORKS, default=_CELL.network,
                       help="local: one host; netns: prefill and decode in network namespaces of "
                            "their own, UCX over TCP on a veth link (root; docs/two-host.md)")
    adhoc.add_argument("--async-scheduling", choices=ASYNC_SCHEDULING, default=_CELL.async_scheduling,
                       help="on: --async-scheduling, off: --no-async-scheduling, every server (GPU)")
    adhoc.add_argument("--spec-decode", choices=SPEC_DECODE_METHODS, default=_CELL.spec_decode,
                       help="speculative decoding on the decode and the baseline (--speculative-config); "
                            "a draft model (draft_p1_d3) on the prefill too, with its own count")
    adhoc.add_argument("--prefix-reuse", action="store_true",
                       help="prompts share a long prefix that the decode holds in its own prefix cache")
    adhoc.add_argument("--chunked-prefill", type=int, default=_CELL.chunked_prefill, metavar="TOKENS",
                       help="prefill at most TOKENS per step on every server (--max-num-batched-tokens)")
    adhoc.add_argument("--cudagraph-mode", choices=CUDAGRAPH_MODES, default=_CELL.cudagraph_mode,
                       help="--compilation-config cudagraph_mode, every server (GPU)")
    adhoc.add_argument("--kv-layout", choices=KV_LAYOUTS, default=_CELL.kv_layout,
                       help="VLLM_KV_CACHE_LAYOUT of the decode server only (GPU)")
    adhoc.add_argument("--kv-connector", choices=tuple(KV_CONNECTORS), default=_CELL.kv_connector,
                       help=kv_connector_help())
    adhoc.add_argument("--kv-cache-dtype", default="auto", metavar="DTYPE|PREFILL:DECODE",
                       help=f"--kv-cache-dtype of the servers ({', '.join(KV_CACHE_DTYPES)}); "
                            "the baseline runs the decode's")
    adhoc.add_argument("--weather", default=_CELL.weather, metavar="NAME",
                       help=f"the workload and environment the pair is judged in "
                            f"({', '.join(WEATHERS)}; docs/weather.md); calm: today's")
    adhoc.add_argument("--weather-param", action="append", default=[], metavar="NAME=VALUE",
                       help="a parameter of the weather (repeatable), e.g. in_flight=96")
    adhoc.add_argument("--server-arg", action="append", default=[], help="extra vLLM argument")


def _add_evaluation(p: argparse.ArgumentParser) -> None:
    ev = p.add_argument_group("evaluation")
    ev.add_argument("--limit", type=int, default=None, help=f"questions per cell (default {_OPT.limit})")
    ev.add_argument("--task", default=_OPT.task, help="lm-eval task (default: by model)")
    ev.add_argument("--dataset-dir", default=None, help="local GSM8K-style jsonl directory")
    ev.add_argument("--num-fewshot", type=int, default=None)
    ev.add_argument("--concurrency", type=int, default=_OPT.concurrency)
    ev.add_argument("--seed", type=int, default=_OPT.seed)
    ev.add_argument("--max-gen-toks", type=int, default=None)
    ev.add_argument("--no-noise-floor", action="store_true", help="skip the A/A baseline re-run")
    ev.add_argument("--no-kv-digest", action="store_true",
                    help="P/D servers do not hash each request's prompt KV (no kv-digest check)")
    ev.add_argument("--repeats", type=int, default=_OPT.repeats,
                    help="evaluate every cell N times on different question samples, servers kept "
                         "up (calibration: false-alarm and canary rates); one record per repeat")
    ev.add_argument("--sample-seed", type=int, default=None,
                    help="draw the questions at random with this seed instead of the first N")
    ev.add_argument("--alpha", type=float, default=_OPT.alpha)
    ev.add_argument("--max-questions", type=int, default=_OPT.max_questions,
                    help="question budget of a cell: undecided cells are asked more questions "
                         "(looks at --limit, 2x, 4x, ... this), then INCONCLUSIVE "
                         f"(default {_OPT.max_questions})")
    ev.add_argument("--margin", type=float, default=100 * _OPT.margin, metavar="PTS",
                    help="PASS means P/D is not worse than the baseline by more than this many "
                         f"accuracy points (default {100 * _OPT.margin:.0f})")


def _add_output(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    out.add_argument("--results-dir", default=_OPT.results_dir)
    out.add_argument("--junit-xml", default=None)
    out.add_argument("--startup-timeout", type=float, default=_OPT.startup_timeout_s,
                     help="seconds a server may take to become healthy (default 600: three servers starting together on a loaded 2-core machine took up to 7 min)")
    out.add_argument("--max-starting", type=int, default=None, metavar="N",
                     help="at most N servers of this host in start-up at once; the others wait "
                          "for a slot and their --startup-timeout counts from it (default: "
                          "$PD_ACCURACY_MAX_STARTING, else no cap)")
    out.add_argument("--server-start", choices=SERVER_STARTS, default=None,
                     help="exec: each server a fresh interpreter; template: each a fork of one "
                          "interpreter per run and core set that imported vLLM already; auto: "
                          "template for pinned TP1 CPU servers, exec for the rest (default: "
                          "$PD_ACCURACY_SERVER_START, else auto)")
    out.add_argument("--parallel-groups", default=None, metavar="N|auto",
                     help="on GPUs: baseline groups run at once, each its own process on the "
                          "GPUs the packer gives it (auto: as many as the GPUs' free memory and "
                          "the cores allow; 1: one after another). Default: "
                          "$PD_ACCURACY_PARALLEL_GROUPS, else auto. CPU runs keep one group and "
                          "start the next ahead")
    out.add_argument("--run-id", default=None, help=argparse.SUPPRESS)   # a packed run's child
    out.add_argument("--gpu-layout", choices=GPU_LAYOUTS, default=_OPT.gpu_layout,
                     help="cuda: all servers from the first visible GPU, or prefill then decode GPUs")
    out.add_argument("--kv-cache-bytes", type=int, default=None,
                     help="KV cache per server (default: 512 MiB, enough for the tiny zoo models)")
    out.add_argument("--platform", default=None,
                     help="validate for this platform instead of this machine (cpu, cuda:N)")
    out.add_argument("--dry-run", action="store_true", help="print the server commands and stop")
    out.add_argument("-v", "--verbose", action="store_true")


def _pair(value: str, what: str, cast: type = int) -> tuple:
    try:
        parts = [cast(x) for x in str(value).split(":")]
    except ValueError:
        raise UsageError(f"{what} must be N or PREFILL:DECODE, got {value!r}") from None
    if len(parts) == 1:
        return parts[0], parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise UsageError(f"{what} must be N or PREFILL:DECODE, got {value!r}")


def weather_params(values: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """`--weather-param NAME=VALUE` options -> Cell.weather_params (the rules check names and
    bounds); a value that is no number is a UsageError."""
    params = {}
    for item in values:
        name, sep, raw = item.partition("=")
        try:
            value = float(raw) if sep else None
        except ValueError:
            value = None
        if not name or value is None:
            raise UsageError(f"--weather-param must be NAME=NUMBER, got {item!r}")
        params[name.strip()] = int(value) if value.is_integer() else value
    return weather_items(params)


def adhoc_cell(args: argparse.Namespace, platform, catalog) -> Cell:
    """The cell `--model ...` describes, normalized with the model facts of `catalog`."""
    device = args.device or platform.device
    backend = args.backend or ("CPU_ATTN" if device == "cpu" else "FLASH_ATTN")
    pb, db = _pair(args.block_size, "--block-size")
    ptp, dtp = _pair(args.tp, "--tp")
    pkv, dkv = _pair(args.kv_cache_dtype, "--kv-cache-dtype", str)   # the rules check the names
    cell = Cell(model=args.model, runner=args.runner, backend=backend, prefill_block_size=pb,
                decode_block_size=db, device=device,
                kv_buffer_device=args.kv_buffer_device or ("cpu" if device == "cpu" else "cuda"),
                prefill_tp=ptp, decode_tp=dtp, dtype=args.dtype, max_model_len=args.max_model_len,
                compile=args.compile, network=args.network, extra_args=tuple(args.server_arg),
                fault=args.fault,
                async_scheduling=args.async_scheduling, spec_decode=args.spec_decode,
                prefix_reuse=args.prefix_reuse, chunked_prefill=args.chunked_prefill,
                cudagraph_mode=args.cudagraph_mode, kv_layout=args.kv_layout,
                kv_connector=args.kv_connector,
                weather=args.weather, weather_params=weather_params(args.weather_param),
                prefill_kv_cache_dtype=pkv, decode_kv_cache_dtype=dkv,
                prefill_runner=args.prefill_runner,
                extra_env=tuple((k, v) for k, v in (("PD_ACCURACY_FAULT_BLOCK", args.fault_block),
                                                    ("PD_ACCURACY_FAULT_SHARE", args.fault_share),
                                                    ("PD_ACCURACY_FAULT_AFTER", args.fault_after))
                                if v))
    from harness import matrix
    return matrix.normalize_cell(cell, catalog)


def select_cells(args: argparse.Namespace) -> tuple[list[Cell], object, list]:
    """The cells to run, validated, and the selected cells the installed vLLM release cannot
    run (matrix.not_applicable: listed and recorded, never started); raises UsageError with one
    line on bad input."""
    from harness import matrix
    from harness.core.model_config import ModelConfigError
    from harness.core.platform import PlatformInfo
    from harness.serve.launch.vllm_features import detect_platform

    platform = (PlatformInfo.from_spec(args.platform) if args.platform
                else detect_platform())
    catalog = None
    not_applicable: list = []
    if args.model:
        if args.profile:
            raise UsageError("give either --profile or --model, not both")
        # an ad-hoc cell comes from no matrix: the rules read the default matrix's model facts
        rules_catalog = matrix.load_matrix().models
        try:
            cells = [adhoc_cell(args, platform, rules_catalog)]
        except ModelConfigError as exc:   # its config.json is no model config
            raise UsageError(str(exc)) from None
    else:
        try:
            spec = matrix.load_matrix(args.matrix)
            expansion = matrix.expand(spec, args.profile or "smoke", platform)
        except matrix.MatrixError as exc:
            raise UsageError(str(exc)) from None
        catalog = rules_catalog = spec.models
        cells = expansion.cells
        try:
            cells = matrix.select(cells, args.only.split(",") if args.only else None, args.keyword)
        except matrix.MatrixError as exc:
            raise UsageError(str(exc)) from None
        unrunnable = {e.cell.cell_id: e for e in matrix.not_applicable(expansion)}
        picked = matrix.select([e.cell for e in unrunnable.values()], None, args.keyword)
        not_applicable = [unrunnable[c.cell_id] for c in picked]
        if args.shard:
            try:
                cells = matrix.shard(cells, *matrix.parse_shard(args.shard))
            except matrix.MatrixError as exc:
                raise UsageError(str(exc)) from None
    if getattr(args, "gpu_layout", "shared") == "split":
        for cell in cells:
            need = cell.gpus_needed["total"]
            if cell.device == "cuda" and need > platform.gpu_count:
                raise UsageError(f"cell {cell.cell_id}: --gpu-layout split needs {need} GPUs "
                                 f"(prefill and decode on their own), this machine has "
                                 f"{platform.gpu_count}; use --gpu-layout shared")
    try:
        matrix.validate_or_die(cells, platform, rules_catalog)
    except matrix.InvalidCellError as exc:
        raise UsageError(str(exc)) from None
    from harness.serve.launch.models import ModelNotFound, resolve
    for model in dict.fromkeys(c.model for c in cells):
        try:
            resolve(model)
        except ModelNotFound as exc:
            raise UsageError(str(exc)) from None
    return cells, catalog, not_applicable


def print_not_applicable(excluded: Sequence, out=None) -> None:
    """One line per reason, then the cells: what this release cannot run, before anything starts."""
    by_reason: dict[str, list[str]] = {}
    for e in excluded:
        by_reason.setdefault(e.reason, []).append(e.cell.cell_id)
    for reason, ids in by_reason.items():
        print(f"{len(ids)} cell(s) {reason}; not started: {', '.join(ids)}", file=out or sys.stdout,
              flush=True)


def options_from(args: argparse.Namespace) -> RunOptions:
    """The one way RunOptions are built from `pd-accuracy run` arguments (the pytest plugin parses
    its options with the same parser, `run_parser`). Raises UsageError with one line."""
    max_starting = args.max_starting
    if max_starting is None:  # resolved (and checked) once here; the record shows the cap used
        try:
            max_starting = StartSlots.limit_from_env()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return RunOptions(
        limit=_OPT.limit if args.limit is None else args.limit,
        seed=args.seed, concurrency=args.concurrency, alpha=args.alpha, margin=args.margin / 100,
        max_questions=args.max_questions,
        task=args.task, dataset_dir=args.dataset_dir, results_dir=args.results_dir,
        startup_timeout_s=args.startup_timeout, noise_floor=not args.no_noise_floor,
        kv_digest=not args.no_kv_digest,
        num_fewshot=args.num_fewshot, max_gen_toks=args.max_gen_toks, gpu_layout=args.gpu_layout,
        kv_cache_bytes=args.kv_cache_bytes, repeats=args.repeats, sample_seed=args.sample_seed,
        max_starting=max_starting, profile=args.profile,
        server_start=args.server_start or os.environ.get("PD_ACCURACY_SERVER_START", "auto"))


def run_parser() -> argparse.ArgumentParser:
    """`pd-accuracy run`'s own parser, for callers that build RunOptions from run arguments."""
    p = argparse.ArgumentParser(prog="pd-accuracy run")
    add_run_arguments(p)
    run_checks.add_trust_arguments(p)
    return p


def print_table(results, stream=None) -> None:
    """The verdict table (harness.report.console): ids whole, reasons wrapped at words."""
    from harness.report.console import print_table as print_verdicts

    print_verdicts(results, stream)


def run_command(args: argparse.Namespace, on_runner=None) -> int:
    """`pd-accuracy run`; `on_runner(runner)` is called once the Runner exists (bench reads its
    run directory and peak RSS afterwards)."""
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    install_log_redaction()
    start_console_log()        # the run folder keeps a copy of what it prints (console.log)
    problems = run_checks.argument_problems(args)
    if problems:
        run_checks.print_problems(problems, sys.stderr)
        return EXIT_USAGE
    if getattr(args, "deployment", None):
        return deployment_command(args, on_runner)
    if getattr(args, "vllm", None):
        from harness.run.releases import run_releases

        return run_releases(args.vllm, args.argv, args.results_dir, args.dry_run)
    try:
        options = options_from(args)
        cells, catalog, not_applicable = select_cells(args)
    except UsageError as exc:
        run_checks.print_problems([str(exc)], sys.stderr)
        return EXIT_USAGE
    print_not_applicable(not_applicable)
    if not cells:
        print("pd-accuracy: error: no cell selected", file=sys.stderr)
        return EXIT_USAGE
    problems = run_checks.cell_problems(cells) or run_checks.random_weight_problems(
        (c.model for c in cells), options.kv_digest, _random_weights)
    if problems:
        run_checks.print_problems(problems, sys.stderr)
        return EXIT_USAGE
    from harness.judge.verdict import Policy

    hybrid_models = [c.model for c in cells
                     if catalog is not None and catalog.get(c.model).is_hybrid]
    if args.dry_run:
        return dry_run(cells, options, hybrid_models)

    from harness.serve.supervision.process import install_signal_handlers
    from harness.run.runner import Runner
    install_signal_handlers()
    try:
        parallel = parallel_groups(args)
    except UsageError as exc:
        run_checks.print_problems([str(exc)], sys.stderr)
        return EXIT_USAGE
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
                    hybrid_models=hybrid_models, run_id=args.run_id)
    started(runner)
    print(f"run {runner.run_id}: {len(cells)} cell(s), results in {runner.run_dir}", flush=True)
    try:
        results = runner.run(cells)
    finally:
        runner.close()
    return finish(results, args, runner, began)


def parallel_groups(args: argparse.Namespace) -> int | None:
    """`--parallel-groups` (or $PD_ACCURACY_PARALLEL_GROUPS): a count, or None for auto."""
    raw = str(args.parallel_groups or os.environ.get("PD_ACCURACY_PARALLEL_GROUPS") or "auto")
    if raw.strip().lower() == "auto":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"--parallel-groups must be a number >= 1 or auto, got {raw!r}")
    return value


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
        deployment.refuse_cell_flags(args, run_parser())
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


def kv_connector_help() -> str:
    """Every kv_connector value with its vLLM class, from the one table (those the harness does
    not drive say so; `pd-accuracy list --show-excluded` says why)."""
    named = [f"{value} ({row.vllm_name}{'' if row.driven else ', not driven'})"
             for value, row in KV_CONNECTORS.items()]
    return f"what moves the KV (default {_CELL.kv_connector}): " + ", ".join(named)


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


def _random_weights(model: str) -> bool:
    """Whether `model` is served with --load-format dummy (a local directory without weights)."""
    from harness.serve.launch.models import ModelNotFound, resolve

    try:
        return resolve(model).random_weights
    except (ModelNotFound, FileNotFoundError):
        return False   # the run names the model's problem where it resolves it


def dry_run(cells: Sequence[Cell], options: RunOptions, hybrid_models: Sequence[str]) -> int:
    """Each cell's servers as the run would plan and start them (the same planners: ports, the
    digest files, a canary's armed decode, a netns cell's `ip netns exec`); nothing starts."""
    import tempfile

    from harness.serve.deploy import DeployContext, Placement, plan_baseline, plan_pair
    from harness.serve.launch.models import resolve
    from harness.protocol.faults import FAULT_KINDS as SERVER_FAULTS
    from harness.protocol.faults import PREFILL_FAULT_KINDS
    from harness.serve.host.ports import PortAllocator
    from harness.run.plan.group_plan import weather_servers

    log_dir = Path(options.results_dir) / "RUN_ID" / "logs"
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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run cells: real baseline vs real P/D pair, one verdict each")
    add_run_arguments(p)
    run_checks.add_trust_arguments(p)
    p.add_argument("--vllm", default=None, metavar="RELEASES",
                   help="the vLLM release axis: run once per release (comma-separated versions, "
                        ".whl files or vLLM checkouts), each in its own cached environment "
                        "(docs/releases.md)")
    p.set_defaults(func=run_command)
