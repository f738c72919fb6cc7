"""The cells a command would run, and its run-wide options, from its arguments: a profile's
cells picked by the selection and cell options, or the one cell `--model` describes; every
cell validated (the matrix's rules, its models, its names and variables) before anything
starts. harness.cli.front_door admits a command through `admit_cells`."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Sequence

from harness.cli.inputs import Admission, given, one_line, spelled
from harness.cli.values import split_pair
from harness.core.cell import FAULT_ENV_PREFIX, Cell, weather_items
from harness.core.options import RunOptions, UsageError
from harness.serve.host.start_slots import StartSlots

_OPT = RunOptions()   # every option's one default
_CELL = Cell(model="-")


def weather_params(values: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """`--weather-param NAME=NUMBER` values (checked by their type) -> Cell.weather_params."""
    params = {}
    for item in values:
        name, _, raw = item.partition("=")
        value = float(raw)
        params[name] = int(value) if value.is_integer() else value
    return weather_items(params)


def fault_env(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The --fault-block/--fault-share/--fault-after options as the cell's fault variables."""
    given = (("BLOCK", getattr(args, "fault_block", None)), ("SHARE", getattr(args, "fault_share", None)),
             ("AFTER", getattr(args, "fault_after", None)))
    return tuple((f"{FAULT_ENV_PREFIX}_{k}", str(v)) for k, v in given if v is not None)


def _or(value, default):
    return default if value is None else value


def adhoc_cell(args: argparse.Namespace, platform, catalog) -> Cell:
    """The cell `--model ...` describes, normalized with the model facts of `catalog`."""
    d = _CELL
    device = args.device or platform.device
    backend = args.backend or ("CPU_ATTN" if device == "cpu" else "FLASH_ATTN")
    pb, db = split_pair(args.block_size or str(d.prefill_block_size))
    ptp, dtp = split_pair(args.tp or "1")
    pkv, dkv = split_pair(args.kv_cache_dtype or "auto", str)
    cell = Cell(model=args.model, runner=args.runner or d.runner, backend=backend,
                prefill_block_size=pb, decode_block_size=db, device=device,
                kv_buffer_device=args.kv_buffer_device or ("cpu" if device == "cpu" else "cuda"),
                prefill_tp=ptp, decode_tp=dtp, dtype=args.dtype or d.dtype,
                max_model_len=_or(args.max_model_len, d.max_model_len),
                compile=args.compile or d.compile, network=args.network or d.network,
                extra_args=tuple(args.server_arg or ()), fault=args.fault,
                async_scheduling=args.async_scheduling or d.async_scheduling,
                spec_decode=args.spec_decode, prefix_reuse=bool(args.prefix_reuse),
                chunked_prefill=args.chunked_prefill,
                cudagraph_mode=args.cudagraph_mode or d.cudagraph_mode,
                kv_layout=args.kv_layout or d.kv_layout,
                kv_connector=args.kv_connector or d.kv_connector,
                weather=args.weather or d.weather,
                weather_params=weather_params(args.weather_param or ()),
                prefill_kv_cache_dtype=pkv, decode_kv_cache_dtype=dkv,
                prefill_runner=args.prefill_runner, extra_env=fault_env(args))
    from harness import matrix
    return matrix.normalize_cell(cell, catalog)


def select_cells(args: argparse.Namespace, probe_vllm: bool = True
                 ) -> tuple[list[Cell], object, list]:
    """The cells to run, validated, and the selected cells the installed vLLM release cannot
    run (matrix.not_applicable: listed and recorded, never started); raises UsageError with one
    line on bad input. `probe_vllm` False: the rules of this machine only (a release run's
    cells are checked again under each release's vLLM)."""
    from harness import matrix
    from harness.core.model_config import ModelConfigError
    from harness.core.platform import PlatformInfo
    from harness.serve.launch.vllm_features import detect_platform

    platform = (PlatformInfo.from_spec(args.platform) if args.platform
                else detect_platform() if probe_vllm else PlatformInfo.detect())
    catalog = None
    not_applicable: list = []
    if args.model:
        # an ad-hoc cell comes from no matrix: the rules read the default matrix's model facts
        rules_catalog = matrix.load_matrix().models
        try:
            cells = [adhoc_cell(args, platform, rules_catalog)]
        except ModelConfigError as exc:   # its config.json is no model config
            raise UsageError(str(exc)) from None
    else:
        cells, catalog, not_applicable = _profile_cells(args, platform)
        rules_catalog = catalog
    if getattr(args, "gpu_layout", "shared") == "split":
        cuda = [c for c in cells if c.device == "cuda"]
        if not cuda:
            raise UsageError("--gpu-layout split places CUDA servers; no selected cell runs on "
                             "CUDA")
        for cell in cuda:
            need = cell.gpus_needed["total"]
            if need > platform.gpu_count:
                raise UsageError(f"cell {cell.cell_id}: --gpu-layout split needs {need} GPUs "
                                 f"(prefill and decode on their own), this machine has "
                                 f"{platform.gpu_count}; use --gpu-layout shared")
    try:
        matrix.validate_or_die(cells, platform, rules_catalog)
    except matrix.InvalidCellError as exc:
        raise UsageError(str(exc)) from None
    _resolve_models(cells, rules_catalog)
    return cells, catalog, not_applicable


def _profile_cells(args: argparse.Namespace, platform) -> tuple[list[Cell], object, list]:
    """A profile's cells picked by --only, -k, the cell options and --shard."""
    from harness import matrix
    profile = args.profile or "smoke"
    try:
        spec = matrix.load_matrix(args.matrix)
        expansion = matrix.expand(spec, profile, platform)
        if not expansion.cells:
            raise UsageError(no_cells_here(spec, profile, platform, expansion))
        # one selection over the runnable cells and those this release cannot run, so that
        # --only, -k and the cell options pick both alike (a V1 id on 0.34 is not applicable,
        # not unknown; cells left out of the selection are not listed)
        unrunnable = {e.cell.cell_id: e for e in matrix.not_applicable(expansion)}
        picked = matrix.select([*expansion.cells, *(e.cell for e in unrunnable.values())],
                               args.only.split(",") if args.only else None, args.keyword)
        picked = filter_cells(picked, args, profile)
        cells = [c for c in picked if c.cell_id not in unrunnable]
        not_applicable = [unrunnable[c.cell_id] for c in picked if c.cell_id in unrunnable]
        if getattr(args, "shard", None):
            cells = matrix.shard(cells, *matrix.parse_shard(args.shard))
    except matrix.MatrixError as exc:
        raise UsageError(str(exc)) from None
    return cells, spec.models, not_applicable


def no_cells_here(spec, profile: str, platform, expansion) -> str:
    """Why `profile` has no cell this machine can run; for GPU cells, how to list them."""
    from harness import matrix

    from harness.core.platform import PlatformInfo

    anywhere = [c for c in matrix.expand(spec, profile, None).cells if c.device == "cuda"]
    where = platform.describe() if platform is not None else "any machine"
    line = f"profile {profile} has no cell that {where} can run ({len(expansion.excluded)} excluded"
    if anywhere:   # the fewest GPUs on which some of its cells run
        counts = sorted({1, 2, 4, 8, *(c.gpus_needed["total"] for c in anywhere)})
        gpus = next((n for n in counts if matrix.expand(
            spec, profile, PlatformInfo.from_spec(f"cuda:{n}")).cells), counts[-1])
        return (f"{line}: its cells need GPUs); `pd-accuracy list --profile {profile} "
                f"--platform cuda:{gpus}` lists them")
    reasons = sorted({e.reason for e in expansion.excluded})
    return f"{line}{': ' + reasons[0] if reasons else ''})"


def _resolve_models(cells: Sequence[Cell], catalog) -> None:
    """Every cell's model is a zoo name, a local model or a hub id; a typo says the closest."""
    from harness.core.suggest import did_you_mean
    from harness.serve.launch.models import ModelNotFound, resolve
    from harness.zoo import registry

    for model in dict.fromkeys(c.model for c in cells):
        try:
            resolve(model)
        except ModelNotFound as exc:
            known = [*registry.zoo_names(), *registry.shape_names(),
                     *(getattr(catalog, "models", None) or {})]
            raise UsageError(f"{exc}{did_you_mean(model, known)}") from None


def print_not_applicable(excluded: Sequence, out=None) -> None:
    """One line per reason, then the cells: what this release cannot run, before anything starts."""
    by_reason: dict[str, list[str]] = {}
    for e in excluded:
        by_reason.setdefault(e.reason, []).append(e.cell.cell_id)
    for reason, ids in by_reason.items():
        print(f"{len(ids)} cell(s) {reason}; not started: {', '.join(ids)}", file=out or sys.stdout,
              flush=True)


def options_from(args: argparse.Namespace) -> RunOptions:
    """The one way RunOptions are built from a command's arguments (the pytest plugin parses
    its options with `run_parser`); an option the command does not take keeps its default.
    Raises UsageError with one line."""
    def get(name: str, default):
        value = getattr(args, name, None)
        return default if value is None else value

    max_starting = get("max_starting", None)
    if max_starting is None:  # resolved (and checked) once here; the record shows the cap used
        try:
            max_starting = StartSlots.limit_from_env()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    margin = getattr(args, "margin", None)
    return RunOptions(
        limit=get("limit", _OPT.limit), seed=get("seed", _OPT.seed),
        concurrency=get("concurrency", _OPT.concurrency), alpha=get("alpha", _OPT.alpha),
        margin=_OPT.margin if margin is None else margin / 100,
        max_questions=get("max_questions", _OPT.max_questions), task=get("task", _OPT.task),
        dataset_dir=get("dataset_dir", None), results_dir=get("results_dir", _OPT.results_dir),
        startup_timeout_s=get("startup_timeout", _OPT.startup_timeout_s),
        noise_floor=not get("no_noise_floor", False), kv_digest=not get("no_kv_digest", False),
        num_fewshot=get("num_fewshot", None), max_gen_toks=get("max_gen_toks", None),
        gpu_layout=get("gpu_layout", _OPT.gpu_layout), kv_cache_bytes=get("kv_cache_bytes", None),
        repeats=get("repeats", _OPT.repeats), sample_seed=get("sample_seed", None),
        max_starting=max_starting, profile=get("profile", None),
        server_start=get("server_start", None)
        or os.environ.get("PD_ACCURACY_SERVER_START", "").strip().lower() or "auto")


def parallel_groups(args: argparse.Namespace) -> int | None:
    """`--parallel-groups` (or $PD_ACCURACY_PARALLEL_GROUPS): a count, or None for auto."""
    raw = str(getattr(args, "parallel_groups", None)
              or os.environ.get("PD_ACCURACY_PARALLEL_GROUPS") or "auto")
    if raw.strip().lower() == "auto":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 4096:
        raise UsageError(f"--parallel-groups must be a number from 1 to 4096 or auto, got {raw[:40]!r}")
    return value


def _random_weights(model: str) -> bool:
    """Whether `model` is served with --load-format dummy (a local directory without weights)."""
    from harness.serve.launch.models import ModelNotFound, resolve

    try:
        return resolve(model).random_weights
    except (ModelNotFound, FileNotFoundError):
        return False   # the run names the model's problem where it resolves it


def _pair_text(prefill: Any, decode: Any) -> str:
    return str(prefill) if prefill == decode else f"{prefill}:{decode}"


def _same_pair(text: str) -> str:
    parts = str(text).split(":")
    return parts[0] if len(parts) == 2 and parts[0] == parts[1] else str(text)


# a cell option -> what it reads off a cell; with a profile, the cells whose value it equals
CELL_FILTERS: dict[str, Callable[[Any], Any]] = {
    "backend": lambda c: c.backend, "runner": lambda c: c.runner,
    "prefill_runner": lambda c: c.prefill_runner or c.runner,
    "block_size": lambda c: _pair_text(c.prefill_block_size, c.decode_block_size),
    "device": lambda c: c.device, "kv_buffer_device": lambda c: c.kv_buffer_device,
    "tp": lambda c: _pair_text(c.prefill_tp, c.decode_tp), "dtype": lambda c: c.dtype,
    "max_model_len": lambda c: c.max_model_len, "compile": lambda c: c.compile,
    "network": lambda c: c.network, "async_scheduling": lambda c: c.async_scheduling,
    "spec_decode": lambda c: c.spec_decode, "prefix_reuse": lambda c: c.prefix_reuse,
    "chunked_prefill": lambda c: c.chunked_prefill, "cudagraph_mode": lambda c: c.cudagraph_mode,
    "kv_layout": lambda c: c.kv_layout, "kv_connector": lambda c: c.kv_connector,
    "kv_cache_dtype": lambda c: _pair_text(c.prefill_kv_cache_dtype, c.decode_kv_cache_dtype),
    "weather": lambda c: c.weather, "fault": lambda c: c.fault,
}


def filter_cells(cells: list, args: argparse.Namespace, profile: str) -> list:
    """A profile's `cells` with the value of every cell option given; UsageError naming the
    first option that leaves none, with the values the cells have."""
    for dest, value_of in CELL_FILTERS.items():
        if not given(args, dest):
            continue
        wanted = getattr(args, dest)
        wanted = _same_pair(wanted) if dest in ("block_size", "tp", "kv_cache_dtype") else wanted
        kept = [c for c in cells if value_of(c) == wanted]
        if cells and not kept:
            have = sorted({str(value_of(c)) for c in cells})
            raise UsageError(f"no selected cell of profile {profile} has {spelled(args, dest)} "
                             f"{wanted} (they have: {', '.join(have[:12])}); with --model it "
                             f"describes one cell")
        cells = kept
    if given(args, "weather_param"):
        wanted_params = dict(weather_params(args.weather_param))
        kept = [c for c in cells if wanted_params.items() <= dict(c.weather_params).items()]
        if cells and not kept:
            raise UsageError(f"no selected cell of profile {profile} sets the weather parameters "
                             f"{', '.join(args.weather_param)}")
        cells = kept
    return cells


def admit_cells(args: argparse.Namespace, *, probe_vllm: bool = True) -> Admission:
    """The run's options and its selected cells, every cell's names and variables checked."""
    from harness.cli import run_checks

    options = options_from(args)
    if hasattr(args, "parallel_groups"):
        parallel_groups(args)
    task = run_checks.task_problem(args) if hasattr(args, "task") else None
    if task:
        raise UsageError(task)
    cells, catalog, not_applicable = select_cells(args, probe_vllm=probe_vllm)
    print_not_applicable(not_applicable)   # what this release cannot run, said before anything
    if not cells:
        raise UsageError("no cell selected")
    problems = run_checks.cell_problems(cells) or run_checks.random_weight_problems(
        (c.model for c in cells), options.kv_digest, _random_weights)
    if problems:
        raise UsageError(one_line(problems))
    return Admission(options, cells, catalog, not_applicable)




__all__ = ["CELL_FILTERS", "adhoc_cell", "admit_cells", "filter_cells", "no_cells_here",
           "options_from", "parallel_groups", "print_not_applicable", "select_cells",
           "weather_params"]
