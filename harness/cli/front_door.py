"""The front door: every input of a command is parsed and checked before any process,
environment or results folder is created. `pd-accuracy` (harness.cli.main) sends every command
through `admit`, and so do the commands that run another's flow (bench runs `run`) and the
pytest plugin; a problem is one line on stderr and exit 2.

What is checked where:
* an option's own value: its type, at parse time (harness.cli.values: ranges, names, paths);
* options together: here (`option_problems`): an option the command would not use is refused,
  never dropped (`bench --from` with run options, `list --rules` with a profile, ...); a cell
  option given with a profile picks the profile's cells that have that value (as pytest's
  --pd-kv-connector does);
* PD_ACCURACY_* variables (harness.cli.inputs), with the parsers the servers use, for the
  commands that read them; the same parsers check what a cell's `extra_env` gives its servers;
* the cells a command would run (harness.cli.cells: the matrix, its rules, the models, each
  cell's names and variables), and a bisect's releases (`walk_releases`).
"""
from __future__ import annotations

import argparse
from typing import Callable

from harness.cli.cells import admit_cells, options_from
from harness.cli.inputs import (Admission, env_problems, given, one_line,  # noqa: F401 (report:
                                refuse_unless_used, report)                #  the commands' one line)
from harness.core.options import UsageError

# options that shape the one --model cell and do not pick among a profile's cells
ADHOC_ONLY = ("server_arg", "fault_block", "fault_share", "fault_after")
# options that pick among a profile's cells, meaningless with the one --model cell
PROFILE_ONLY = ("matrix", "only", "keyword", "shard")
SERVER_OPTIONS = ("startup_timeout", "max_starting", "server_start", "parallel_groups",
                  "gpu_layout", "kv_cache_bytes")
EVALUATION_OPTIONS = ("limit", "task", "dataset_dir", "num_fewshot", "concurrency", "seed",
                      "max_gen_toks", "no_noise_floor", "no_kv_digest", "repeats", "sample_seed",
                      "alpha", "max_questions", "margin")


# ---- options together, per command ------------------------------------------------------------

def _cell_mode_problems(args: argparse.Namespace) -> list[str]:
    """--model runs one cell; a profile's cells are picked by the selection and cell options."""
    if given(args, "model"):
        if given(args, "profile"):
            return ["give either --profile or --model, not both"]
        return refuse_unless_used(args, [d for d in PROFILE_ONLY if hasattr(args, d)],
                                  "they pick among a profile's cells; --model runs one cell")
    return refuse_unless_used(args, [d for d in ADHOC_ONLY if hasattr(args, d)],
                              "they shape the --model cell; a profile's cells take them from "
                              "the matrix (extra_args, extra_env)")


def _run_problems(args: argparse.Namespace) -> list[str]:
    if given(args, "deployment"):
        from harness.cli.run_deployment import refuse_cell_flags
        from harness.cli.vocabulary import run_parser

        try:
            refuse_cell_flags(args, run_parser(releases=True))
        except UsageError as exc:
            return [str(exc)]
        return []
    problems = refuse_unless_used(args, ["allow_auth_env"], "only with --deployment")
    problems += _cell_mode_problems(args)
    if getattr(args, "dry_run", False):
        problems += refuse_unless_used(args, ["junit_xml"], "--dry-run writes no verdicts")
    if given(args, "vllm"):
        problems += refuse_unless_used(args, ["run_id"], "a release run names its own runs")
    return problems


def _bench_problems(args: argparse.Namespace) -> list[str]:
    if not given(args, "from_dir"):
        return _run_problems(args)
    others = [d for d in (args.given or {}) if d not in ("from_dir", "out", "verbose")]
    return refuse_unless_used(args, others, "bench --from reads a finished run; they shape a new one")


def _bisect_problems(args: argparse.Namespace) -> list[str]:
    problems = _cell_mode_problems(args)
    if not (given(args, "only") or given(args, "keyword") or given(args, "model")):
        problems.append("name the cell to bisect: --only ID, -k EXPR or --model")
    return problems


def _list_problems(args: argparse.Namespace) -> list[str]:
    if given(args, "rules"):
        return refuse_unless_used(args, [d for d in (args.given or {}) if d != "rules"],
                                  "--rules lists the validity rules, not a profile's cells")
    return []


def _pipeline_problems(args: argparse.Namespace) -> list[str]:
    problems = refuse_unless_used(args, ["out"], "--out-dir writes every upload; give one of "
                                                 "them") if given(args, "out_dir") else []
    if args.format == "test-areas":
        problems += refuse_unless_used(args, ["max_steps", "report_dir", "vllm"],
                                       "they shape a Buildkite pipeline, not --format test-areas")
    else:
        problems += refuse_unless_used(args, ["ci_device", "setup"],
                                       "they shape --format test-areas")
    return problems


OPTION_RULES: dict[str, Callable[[argparse.Namespace], list[str]]] = {
    "run": _run_problems, "warm": _cell_mode_problems, "bench": _bench_problems,
    "bisect": _bisect_problems, "list": _list_problems, "pipeline": _pipeline_problems,
}


def option_problems(command: str, args: argparse.Namespace) -> list[str]:
    rules = OPTION_RULES.get(command)
    return rules(args) if rules else []


# ---- what each command admits ---------------------------------------------------------------

def _admit_run(args: argparse.Namespace) -> Admission:
    if given(args, "deployment"):
        return Admission(options_from(args))
    # a release run's cells are checked again in each release; here without this vLLM's view
    return admit_cells(args, probe_vllm=not given(args, "vllm"))


def _admit_bench(args: argparse.Namespace) -> Admission:
    return Admission() if given(args, "from_dir") else _admit_run(args)


def walk_releases(args: argparse.Namespace) -> list[str] | None:
    """The releases to walk from --good to --bad, checked before any environment is made: those
    of --vllm between them (both must be there, oldest first), or None: the index's, looked up
    when the walk starts."""
    from harness.run.releases import ReleaseError, parse_release

    good, bad = parse_release(args.good), parse_release(args.bad)
    if good.label == bad.label:
        raise ReleaseError(f"--good and --bad name the same release {good.label}")
    if args.vllm:
        names = [part.strip() for part in args.vllm.split(",") if part.strip()]
        labels = [parse_release(n).label for n in names]
        missing = [x.label for x in (good, bad) if x.label not in labels]
        if missing:
            raise ReleaseError(f"--vllm must list --good and --bad; it lacks {', '.join(missing)}")
        lo, hi = labels.index(good.label), labels.index(bad.label)
        if lo > hi:
            raise ReleaseError("--vllm lists releases oldest first: --good comes before --bad")
        return names[lo:hi + 1]
    if good.kind == bad.kind == "pypi":
        return None
    return [args.good, args.bad]


def _admit_bisect(args: argparse.Namespace) -> Admission:
    from harness.core.vllm_releases import ReleaseError

    try:
        args.walk = walk_releases(args)   # the releases, checked before any environment is made
    except ReleaseError as exc:
        raise UsageError(str(exc)) from None
    return admit_cells(args, probe_vllm=False)


ADMIT: dict[str, Callable[[argparse.Namespace], Admission]] = {
    "run": _admit_run, "warm": lambda a: admit_cells(a), "bench": _admit_bench,
    "bisect": _admit_bisect,
}


def admit(args: argparse.Namespace) -> Admission:
    """Check every input of `args`'s command (UsageError: the first problem, one line) and
    select its cells; cached on `args`, so a command that runs another's flow checks once."""
    cached = getattr(args, "admission", None)
    if cached is not None:
        return cached
    command = getattr(args, "command", None) or "run"
    problems = option_problems(command, args) + env_problems(command)
    if problems:
        raise UsageError(one_line(problems))
    admit_it = ADMIT.get(command)
    admission = admit_it(args) if admit_it else Admission()
    args.admission = admission
    return admission


__all__ = ["ADHOC_ONLY", "Admission", "EVALUATION_OPTIONS", "SERVER_OPTIONS", "admit",
           "option_problems", "report", "walk_releases"]
