"""CI sub-commands: ``pipeline``, ``annotate``, ``report``, ``history``, ``farm``.

Exit codes follow harness.cli.main: 0 done, 2 bad input (nothing was run), 3 environment error
(e.g. ``buildkite-agent annotate`` failed); ``farm`` returns its jobs' verdict (0, 1 or 3).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from harness.core.outcomes import EXIT_ERROR, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from harness.matrix import MatrixSpec

# Pipelines are generated on a CPU agent for the GPU farm, so the matrix is not expanded for
# this machine; each job's `pd-accuracy run` re-expands for its own agent.
DEFAULT_PLATFORM = "any"


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"pd-accuracy: error: {message}", file=sys.stderr)
    return code


def _queues(text: str | None) -> dict[int, str] | None:
    """--queues (checked by its type) as GPU count -> queue name."""
    if not text:
        return None
    from harness.ci.pipeline import normalize_queues

    return normalize_queues(json.loads(text))


def _cells(spec: "MatrixSpec", profile: str, platform_spec: str) -> list:
    """The cells of `profile` for the target machines (not this one): 'any' applies only the
    matrix's validity rules; a spec like 'cuda:8' also drops what such a machine cannot run."""
    from harness import matrix
    from harness.core.platform import PlatformInfo

    platform = None if platform_spec == "any" else PlatformInfo.from_spec(platform_spec)
    expansion = matrix.expand(spec, profile, platform)
    if not expansion.cells:
        raise ValueError(f"profile {profile!r} expands to no cells on {platform_spec}")
    return list(expansion.cells)


RELEASES_OFF = "none"


def pipeline_releases(option: str | None, profile_releases: Sequence[str]) -> list[str]:
    """The releases of the pipeline's release step: the profile's ``vllm_releases`` unless
    ``--vllm`` is given; ``--vllm none`` switches the step off. A bad release
    is a ReleaseError (a ValueError, one line)."""
    from harness.core.vllm_releases import ReleaseError, parse_releases

    if option is None:
        return list(profile_releases)
    if option.strip().lower() == RELEASES_OFF:
        return []
    names = [part.strip() for part in option.split(",") if part.strip()]
    if not names:
        raise ReleaseError(f"--vllm names no release (`--vllm {RELEASES_OFF}`: no release step)")
    try:
        parse_releases(names, source="the list")
    except ReleaseError as exc:
        raise ReleaseError(f"--vllm: {exc}") from None
    return names


def _run_args(args: argparse.Namespace) -> list[str]:
    return ["--limit", str(args.limit)] if getattr(args, "limit", None) else []


# ---- pipeline ---------------------------------------------------------------------------------
def cmd_pipeline(args: argparse.Namespace) -> int:
    import yaml

    from harness.ci import pipeline, test_areas

    try:
        from harness.matrix import load_matrix

        queues = _queues(args.queues)
        spec = load_matrix(args.matrix)
        cells = _cells(spec, args.profile, args.platform)
        releases = pipeline_releases(args.vllm, spec.profile(args.profile).vllm_releases)
        common: dict[str, Any] = dict(profile=args.profile, queues=queues,
                                      results_dir=args.results_dir,
                                      timeout_minutes=args.timeout_minutes,
                                      parallelism=args.parallelism, matrix_path=args.matrix,
                                      run_args=_run_args(args))
        if args.format == "test-areas":
            steps = test_areas.export_test_areas(cells, device=args.ci_device,
                                                 setup_commands=args.setup or (), **common)
            texts = [yaml.safe_dump(test_areas.vllm_test_areas_document(steps), sort_keys=False,
                                    width=100_000)]
        else:
            docs = pipeline.generate_pipeline(cells, max_steps=args.max_steps,
                                              report_dir=args.report_dir,
                                              vllm_releases=releases, **common)
            texts = [pipeline.pipeline_yaml(doc) for doc in docs]
    except (ImportError, ValueError, KeyError, FileNotFoundError) as exc:
        return _fail(str(exc))

    if args.out_dir:
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("pipeline-*.yml"):
            old.unlink()   # a previous, longer generation must not leave extra uploads behind
        for index, text in enumerate(texts, start=1):
            path = out_dir / f"pipeline-{index:03d}.yml"
            path.write_text(text)
            print(path)
        return EXIT_OK
    if len(texts) > 1:
        return _fail(f"{len(texts)} uploads are needed (at most {args.max_steps} steps each); "
                     f"use --out-dir and upload each file")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(texts[0])
    else:
        sys.stdout.write(texts[0])
    return EXIT_OK


# ---- annotate / history / report --------------------------------------------------------------
def cmd_annotate(args: argparse.Namespace) -> int:
    import subprocess

    from harness.report.annotate import annotate

    agent: bool | str = {"auto": "auto", "always": True, "never": False}[args.agent]
    try:
        result = annotate(args.results_dir, args.out, agent=agent)
    except FileNotFoundError as exc:
        return _fail(str(exc))
    except (OSError, subprocess.CalledProcessError) as exc:
        return _fail(f"posting the annotation failed: {exc}", EXIT_ERROR)
    print(f"{result.path}: {result.summary}; style {result.style}"
          + (", posted to Buildkite" if result.posted else ""))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    from harness.report.history import append_results_dir

    if not Path(args.results_dir).is_dir():
        return _fail(f"results directory {args.results_dir} does not exist")
    written = append_results_dir(args.history, args.results_dir)
    print(f"{args.history}: {written} records appended from {args.results_dir}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Render the HTML report. It writes only under --out-dir: the records of --results-dir are
    rendered from a temporary store (with --history's rows, for trends); the history store is
    only read (`pd-accuracy history --results-dir DIR` adds a run to it)."""
    import shutil
    import tempfile

    from harness.report.history import DEFAULT_HISTORY_PATH, append_results_dir, load_cells
    from harness.report.html import render_report

    history = args.history or DEFAULT_HISTORY_PATH
    if args.results_dir and not Path(args.results_dir).is_dir():
        return _fail(f"results directory {args.results_dir} does not exist")
    if not args.results_dir and not Path(history).is_file():
        return _fail(f"history {history} does not exist (give --results-dir)")
    with tempfile.TemporaryDirectory(prefix="pd-accuracy-report-") as tmp:
        db = history
        if args.results_dir:
            db = str(Path(tmp) / "history.sqlite")
            if args.history and Path(args.history).is_file():
                shutil.copyfile(args.history, db)
            append_results_dir(db, args.results_dir)
        if not load_cells(db):
            print(f"pd-accuracy: warning: no cells to report in {args.results_dir or history}; "
                  f"the report is empty", file=sys.stderr)
        index = render_report(db, args.out_dir)
    print(index)
    return EXIT_OK


# ---- farm -------------------------------------------------------------------------------------
def cmd_farm(args: argparse.Namespace) -> int:
    from harness.ci.farm import run_farm

    gpus: int | str = args.gpus if args.gpus == "auto" else int(args.gpus)
    try:
        return run_farm(args.profile, matrix_path=args.matrix, parallelism=args.parallelism,
                        gpus=gpus, cpu_slots=args.cpu_slots, queues=_queues(args.queues),
                        results_dir=args.results_dir, run_args=_run_args(args),
                        log_dir=args.log_dir, dry_run=args.dry_run)
    except (ImportError, ValueError, KeyError, FileNotFoundError) as exc:
        return _fail(str(exc))


# ---- registration -----------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the CI sub-commands to the ``pd-accuracy`` parser."""
    _register_pipeline(subparsers)
    _register_reports(subparsers)
    _register_farm(subparsers)


def _register_pipeline(subparsers: argparse._SubParsersAction) -> None:
    from harness.ci.pipeline import DEFAULT_REPORT_DIR, DEFAULT_RESULTS_DIR, DEFAULT_TIMEOUT_MINUTES
    from harness.ci.validate import MAX_STEPS_PER_UPLOAD
    from harness.cli import values as v
    from harness.cli import vocabulary as vocab

    p = subparsers.add_parser(
        "pipeline", help="generate the Buildkite pipeline (or vLLM test_areas) for a profile",
        description="Print a Buildkite pipeline (YAML) running a matrix profile; pipe it to "
                    "`buildkite-agent pipeline upload`. More than --max-steps steps need "
                    "several uploads: use --out-dir.")
    p.add_argument("--profile", required=True, type=v.text("--profile", 200),
                   help="matrix profile whose cells the pipeline runs")
    p.add_argument("--matrix", type=v.existing("file", "--matrix"), metavar="FILE",
                   help="matrix YAML (default: the harness's own, harness/matrix/default.yaml)")
    vocab.add_platform(p, allow_any=True, default=DEFAULT_PLATFORM,
                       what="the machines the cells will run on")
    p.add_argument("--queues", type=v.queues(), metavar="JSON",
                   help='GPUs needed -> agent queue, e.g. \'{"0": "cpu", "1": "gpu-1"}\'')
    p.add_argument("--parallelism", type=v.whole(1, 1000), default=1, metavar="N",
                   help="N > 1: one sharded step per GPU queue with `parallelism: N`")
    p.add_argument("--format", choices=("buildkite", "test-areas"), default="buildkite",
                   help="a Buildkite pipeline, or vLLM's test_areas steps")
    vocab.add_out(p, "write the YAML here instead of stdout")
    p.add_argument("--out-dir", type=v.writable("dir", "--out-dir"), metavar="DIR",
                   help="write pipeline-001.yml, pipeline-002.yml, ... here")
    vocab.add_results_dir(p, DEFAULT_RESULTS_DIR, "where the steps write their records")
    p.add_argument("--timeout-minutes", type=v.whole(1, 7 * 24 * 60),
                   default=DEFAULT_TIMEOUT_MINUTES, metavar="MIN",
                   help="per cell; a step's timeout scales with its cells")
    p.add_argument("--max-steps", type=v.whole(1, 100_000), default=MAX_STEPS_PER_UPLOAD,
                   metavar="N", help=f"steps per upload (default {MAX_STEPS_PER_UPLOAD})")
    p.add_argument("--report-dir", type=v.text("--report-dir"), metavar="DIR",
                   help=f"also render the HTML report there in the final step (e.g. "
                        f"{DEFAULT_REPORT_DIR})")
    p.add_argument("--limit", type=v.whole(1, 1_000_000), metavar="N",
                   help="questions per cell (passed to `run --limit`)")
    p.add_argument("--ci-device", type=v.text("--ci-device", 100), metavar="NAME",
                   help="test-areas: ci-infra device of GPU steps (e.g. h200)")
    vocab.add_vllm(p, "a CPU step running the smoke cells once per vLLM release (`run --vllm`); "
                      "default: the profile's vllm_releases", allow_none=True)
    p.add_argument("--setup", action="append", type=v.text("--setup"), metavar="CMD",
                   help="test-areas: command run before pd-accuracy in every step (repeatable)")
    p.set_defaults(func=cmd_pipeline)


def _register_reports(subparsers: argparse._SubParsersAction) -> None:
    from harness.ci.pipeline import DEFAULT_ANNOTATION_PATH, DEFAULT_REPORT_DIR, DEFAULT_RESULTS_DIR
    from harness.cli import values as v
    from harness.cli import vocabulary as vocab
    from harness.report.history import DEFAULT_HISTORY_PATH

    history = dict(default=DEFAULT_HISTORY_PATH, type=v.writable("file", "--history"),
                   metavar="FILE", help=f"the history store (default {DEFAULT_HISTORY_PATH})")
    p = subparsers.add_parser("annotate", help="render (and post) the Buildkite annotation")
    vocab.add_results_dir(p, DEFAULT_RESULTS_DIR, "the records to annotate")
    vocab.add_out(p, "the annotation's markdown", default=DEFAULT_ANNOTATION_PATH)
    p.add_argument("--agent", choices=("auto", "always", "never"), default="auto",
                   help="post with buildkite-agent: auto = when running inside Buildkite")
    p.set_defaults(func=cmd_annotate)

    p = subparsers.add_parser("history", help="append result records to the history store")
    vocab.add_results_dir(p, None, "the records to append", read=True, required=True)
    p.add_argument("--history", **history)
    p.set_defaults(func=cmd_history)

    p = subparsers.add_parser(
        "report", help="render the HTML report of a results directory or the history",
        description="Render the HTML report (verdict table, forest plot, heatmaps, trends) into "
                    "--out-dir and writes nothing else (`history` adds a run to the store).")
    vocab.add_results_dir(p, None, "report these records (with --history's, for trends)",
                          read=True)
    p.add_argument("--history", default=None, type=v.writable("file", "--history"),
                   metavar="FILE", help=f"the history store to read (default {DEFAULT_HISTORY_PATH} "
                                        f"when no --results-dir is given)")
    p.add_argument("--out-dir", default=DEFAULT_REPORT_DIR, type=v.writable("dir", "--out-dir"),
                   metavar="DIR", help=f"where the report goes (default {DEFAULT_REPORT_DIR})")
    p.set_defaults(func=cmd_report)


def _register_farm(subparsers: argparse._SubParsersAction) -> None:
    from harness.cli import values as v
    from harness.cli import vocabulary as vocab

    p = subparsers.add_parser(
        "farm", help="run a profile's generated pipeline on this machine",
        description="Generate the Buildkite pipeline of a profile and execute its command "
                    "steps here, with Buildkite's depends_on/retry/soft_fail/parallelism rules.")
    p.add_argument("--profile", required=True, type=v.text("--profile", 200),
                   help="matrix profile whose pipeline the farm runs")
    p.add_argument("--matrix", type=v.existing("file", "--matrix"), metavar="FILE",
                   help="matrix YAML (default: the harness's own, harness/matrix/default.yaml)")
    p.add_argument("--parallelism", type=v.whole(1, 1000), default=1, metavar="N",
                   help="shards per GPU step, as the pipeline's `parallelism: N`")
    p.add_argument("--gpus", type=v.count_or_auto(0, v.MAX_GPUS), default="auto", metavar="N|auto",
                   help="GPUs to schedule on: 'auto' (CUDA_VISIBLE_DEVICES / nvidia-smi) or N")
    p.add_argument("--cpu-slots", type=v.whole(1, 1024), default=1, metavar="N",
                   help="CPU-only jobs run at once")
    p.add_argument("--queues", type=v.queues(), metavar="JSON",
                   help="GPUs needed -> agent queue, as pipeline --queues")
    vocab.add_results_dir(p, None, "where the jobs write their records (default: the pipeline's)")
    p.add_argument("--limit", type=v.whole(1, 1_000_000), metavar="N",
                   help="questions per cell (passed to `run --limit`)")
    p.add_argument("--log-dir", default="results/farm", type=v.writable("dir", "--log-dir"),
                   metavar="DIR", help="where each job's log goes (default results/farm)")
    vocab.add_dry_run(p, "print the pipeline, run nothing")
    p.set_defaults(func=cmd_farm)
