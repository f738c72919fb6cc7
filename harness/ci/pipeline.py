"""Buildkite pipeline generation: a matrix expansion as pipeline documents to upload.

One matrix expansion becomes one or more Buildkite pipeline documents:

* cells that share a ``baseline_key`` run in ONE command step, so the run command starts their
  baseline server once and reuses it;
* steps are wrapped in ``group`` steps, one group per model/backend;
* the agent queue is chosen from the GPUs a step needs (``queues``: GPUs needed -> queue name;
  a step goes to the smallest queue that has enough GPUs);
* ``retry.automatic`` retries only exit status 3 (ERROR: environment, retry is reasonable);
  exit status 1 (FAIL) is a verdict and is never retried;
* steps of expected-failure cells ``soft_fail`` on exit status 1 (strict-xfail XPASS: the cell
  now passes, which is news but must not break the build). Expected-failure cells never share
  a step with regular cells, because ``soft_fail`` applies to the whole step;
* a final annotate step (``depends_on`` every group, ``allow_dependency_failure: true``)
  downloads the result artifacts and runs ``pd-accuracy annotate``.

Buildkite accepts at most 500 steps per upload (groups and the steps inside them count), so
``generate_pipeline`` returns a list of documents, each of which must be uploaded separately.

Sharded mode (``parallelism > 1``): one step per (GPU queue, expected-failure) class with
``parallelism: N``; each of its jobs runs ``pd-accuracy run ... --shard
$$BUILDKITE_PARALLEL_JOB/$$BUILDKITE_PARALLEL_JOB_COUNT`` and the run command picks its share
with ``harness.matrix.shard``. ``$$`` is Buildkite's escape for a literal ``$``: the variable is
then expanded by the job's shell at run time, not by ``buildkite-agent pipeline upload``.

Steps are built with ``buildkite-sdk`` typed models and every document is validated
(harness.ci.validate) against the vendored Buildkite pipeline JSON schema. The same command steps
in vLLM ci-infra's ``test_areas`` format come from harness.ci.test_areas.
"""
from __future__ import annotations

import math
import re
import shlex
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from harness.ci.validate import MAX_STEPS_PER_UPLOAD, validate_uploads
from harness.core.cell import Cell
from harness.core.outcomes import EXIT_ERROR, EXIT_FAIL

DEFAULT_QUEUES: dict[int, str] = {0: "cpu", 1: "gpu-1", 2: "gpu-2", 4: "gpu-4", 8: "gpu-8"}
DEFAULT_RESULTS_DIR = "results/runs"
DEFAULT_JUNIT_DIR = "results/junit"
DEFAULT_ANNOTATION_PATH = "results/annotation.md"
DEFAULT_REPORT_DIR = "results/report"
DEFAULT_TIMEOUT_MINUTES = 30       # per cell; a step's timeout scales with its cells
DEFAULT_RETRY_LIMIT = 2
ANNOTATE_KEY = "pd-accuracy-annotate"
RUN_COMMAND = "pd-accuracy"
PARALLEL_JOB = "$$BUILDKITE_PARALLEL_JOB"
PARALLEL_JOB_COUNT = "$$BUILDKITE_PARALLEL_JOB_COUNT"

_KEY_CHARS = re.compile(r"[^a-zA-Z0-9_\-]+")


# ---- cells -> batches -------------------------------------------------------------------------
def queue_for(gpus: int, queues: Mapping[int, str]) -> tuple[int, str]:
    """The smallest configured queue with at least `gpus` GPUs, as (its GPU count, its name)."""
    by_gpus = normalize_queues(queues)
    fitting = sorted(n for n in by_gpus if n >= gpus)
    if not fitting:
        raise ValueError(f"no agent queue has {gpus} GPUs (queues: {by_gpus})")
    return fitting[0], by_gpus[fitting[0]]


def normalize_queues(queues: Mapping[Any, str]) -> dict[int, str]:
    """`queues` with integer GPU counts as keys (JSON gives strings)."""
    try:
        by_gpus = {int(n): str(name) for n, name in queues.items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"queue keys must be GPU counts: {dict(queues)}") from exc
    if any(n < 0 for n in by_gpus) or not by_gpus:
        raise ValueError(f"queues must map GPU counts >= 0 to names: {dict(queues)}")
    return by_gpus


def slug(text: str, max_len: int = 40) -> str:
    """`text` reduced to characters valid in a Buildkite step key."""
    return _KEY_CHARS.sub("-", text).strip("-").lower()[:max_len].strip("-") or "x"


@dataclass(frozen=True)
class Batch:
    """Cells that run in one Buildkite command step."""

    key: str
    label: str
    group_key: str
    group_label: str
    cells: tuple[Cell, ...]
    gpus: int                 # GPUs of the queue the step runs on
    queue: str
    expected_failure: bool
    parallelism: int = 1      # > 1: jobs of one step, each running a shard of `cells`

    @property
    def cell_ids(self) -> list[str]:
        return [c.cell_id for c in self.cells]

    @property
    def baseline_groups(self) -> int:
        return len({c.baseline_key for c in self.cells})


def _group_of(cell: Cell) -> tuple[str, str]:
    key = f"grp-{slug(cell.model_short, 50)}-{slug(cell.backend, 20)}"
    return key, f"{cell.model_short} / {cell.backend}"


def step_gpus(cell: Cell, layout: str = "shared") -> int:
    """GPUs a step running `cell` asks its agent for: with the shared layout (`run`'s default)
    every server of a group sits on the GPUs of its widest server, so a TP1 cell asks for one
    GPU; with `--gpu-layout split` prefill and decode have GPUs of their own."""
    return cell.gpus_needed["total" if layout == "split" else "min_shared"]


def layout_of(run_args: Sequence[str]) -> str:
    """The `--gpu-layout` the steps' run commands are given (`run`'s default: shared)."""
    args = list(run_args)
    for i, arg in enumerate(args):
        if arg == "--gpu-layout" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--gpu-layout="):
            return arg.split("=", 1)[1]
    return "shared"


def plan_batches(cells: Iterable[Cell], queues: Mapping[int, str] = DEFAULT_QUEUES,
                 parallelism: int = 1, layout: str = "shared") -> list[Batch]:
    """Split `cells` into command steps (see module docstring), in first-seen order."""
    cells = list(cells)
    ids = [c.cell_id for c in cells]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"{len(dupes)} duplicate cell ids, e.g. {', '.join(dupes[:5])}")
    buckets: OrderedDict[tuple, list[Cell]] = OrderedDict()
    for cell in cells:
        xfail = cell.expected_failure is not None
        if parallelism > 1:
            bucket = (queue_for(step_gpus(cell, layout), queues)[0], xfail)
        else:
            bucket = (cell.baseline_key, xfail)
        buckets.setdefault(bucket, []).append(cell)

    batches = []
    for bucket, members in buckets.items():
        xfail = bucket[1]
        gpus, queue = queue_for(max(step_gpus(c, layout) for c in members), queues)
        suffix = "-xfail" if xfail else ""
        if parallelism > 1:
            groups = len({c.baseline_key for c in members})
            # More jobs than baseline groups would only split groups or leave shards empty.
            jobs = max(1, min(parallelism, groups))
            batches.append(Batch(
                key=f"pd-shards-gpu{gpus}{suffix}",
                label=f"P/D accuracy, {gpus} GPU queue{' (expected failures)' if xfail else ''}"
                      f": {len(members)} cell{'s' * (len(members) != 1)}",
                group_key="grp-sharded", group_label="P/D accuracy (sharded)",
                cells=tuple(members), gpus=gpus, queue=queue, expected_failure=xfail,
                parallelism=jobs))
            continue
        first = members[0]
        group_key, group_label = _group_of(first)
        key = (f"pd-{slug(first.model_short, 40)}-{slug(first.backend, 16)}-{first.runner}"
               f"-{first.baseline_key}{suffix}")
        label = (f"{first.runner} {first.backend} d{first.decode_block_size} "
                 f"{first.model_short} tp{first.baseline_tp}"
                 f"{' xfail' if xfail else ''}: {len(members)} cell{'s' * (len(members) != 1)}")
        batches.append(Batch(key=key, label=label, group_key=group_key, group_label=group_label,
                             cells=tuple(members), gpus=gpus, queue=queue, expected_failure=xfail))
    keys = [b.key for b in batches]
    if len(set(keys)) != len(keys):
        raise ValueError(f"step keys collide: {keys}")
    return batches


# ---- commands ---------------------------------------------------------------------------------
def run_command(batch: Batch, *, profile: str, results_dir: str, junit_dir: str = DEFAULT_JUNIT_DIR,
                matrix_path: str | None = None, extra_args: Sequence[str] = ()) -> str:
    """The ``pd-accuracy run`` command line a step runs (Buildkite-escaped)."""
    args = [RUN_COMMAND, "run", "--profile", profile]
    if matrix_path:
        args += ["--matrix", matrix_path]
    args += ["--only", ",".join(batch.cell_ids), "--results-dir", results_dir]
    args += list(extra_args)
    line = shlex.join(args)
    if batch.parallelism > 1:
        # Not shlex-quoted: the job's shell must expand these at run time.
        line += f" --shard {PARALLEL_JOB}/{PARALLEL_JOB_COUNT}"
        junit = f"{junit_dir}/{batch.key}-{PARALLEL_JOB}.xml"
    else:
        junit = shlex.quote(f"{junit_dir}/{batch.key}.xml")
    return f"{line} --junit-xml {junit}"


def annotate_commands(results_dir: str, *, annotation_path: str = DEFAULT_ANNOTATION_PATH,
                      report_dir: str | None = None) -> list[str]:
    """Commands of the final step: fetch every job's records, annotate, optionally report."""
    commands = [
        # A build whose jobs all died before writing a record has nothing to download; the
        # annotation must still be posted (it then says so), hence the fallback.
        f'buildkite-agent artifact download "{results_dir}/**/*" . '
        f'|| echo "no result artifacts to download"',
        shlex.join([RUN_COMMAND, "annotate", "--results-dir", results_dir,
                    "--out", annotation_path]),
    ]
    if report_dir:
        # the nightly's trend store grows by this run, then the report draws the whole store
        history = ' --history "$${PD_ACCURACY_HISTORY:-results/history.sqlite}"'
        commands.append(shlex.join([RUN_COMMAND, "history", "--results-dir", results_dir])
                        + history)
        commands.append(shlex.join([RUN_COMMAND, "report", "--out-dir", report_dir]) + history)
    return commands


def step_timeout(batch: Batch, timeout_minutes: int) -> int:
    """``timeout_in_minutes`` of `batch`'s step: `timeout_minutes` per cell one of its jobs runs."""
    cells_per_job = len(batch.cells)
    if batch.parallelism > 1:
        largest_group = max(sum(1 for c in batch.cells if c.baseline_key == k)
                            for k in {c.baseline_key for c in batch.cells})
        # A shard holds whole baseline groups, so it can exceed the even share by one group.
        cells_per_job = min(len(batch.cells),
                            math.ceil(len(batch.cells) / batch.parallelism) + largest_group)
    return max(1, int(timeout_minutes) * max(1, cells_per_job))


# ---- pipeline documents -----------------------------------------------------------------------
def generate_pipeline(cells: Iterable[Cell], *, profile: str,
                      queues: Mapping[int, str] | None = None,
                      results_dir: str = DEFAULT_RESULTS_DIR,
                      timeout_minutes: int = DEFAULT_TIMEOUT_MINUTES,
                      max_steps: int = MAX_STEPS_PER_UPLOAD,
                      parallelism: int = 1,
                      junit_dir: str = DEFAULT_JUNIT_DIR,
                      matrix_path: str | None = None,
                      run_args: Sequence[str] = (),
                      retry_limit: int = DEFAULT_RETRY_LIMIT,
                      annotation_path: str = DEFAULT_ANNOTATION_PATH,
                      report_dir: str | None = None,
                      vllm_releases: Sequence[str] = (),
                      validate: bool = True) -> list[dict[str, Any]]:
    """Buildkite pipeline documents (each ≤ `max_steps` steps) that run `cells`.

    `timeout_minutes` is per cell: a step's ``timeout_in_minutes`` is that times the number of
    cells one of its jobs runs. `run_args` are appended to every ``pd-accuracy run`` (e.g.
    ``["--limit", "20"]``). `report_dir` adds a history + HTML report command to the final step.
    `vllm_releases` adds the release axis: one CPU step running the smoke cells once per vLLM
    release (`run --vllm`), its records beside the others' (the annotation and report read
    them; the report's release x cell heatmap shows them). `pd-accuracy pipeline` passes the
    profile's `vllm_releases` (the matrix) unless `pipeline --vllm` overrides them.
    Every document is validated (`validate_uploads`) unless `validate` is False.
    """
    from buildkite_sdk import CommandStep, Pipeline

    if max_steps < 3:
        raise ValueError("max_steps must leave room for a group, a step and the annotate step")
    queues = normalize_queues(queues or DEFAULT_QUEUES)
    steps = StepSettings(profile=profile, results_dir=results_dir, junit_dir=junit_dir,
                         matrix_path=matrix_path, run_args=tuple(run_args),
                         timeout_minutes=timeout_minutes, retry_limit=retry_limit)
    docs, group_keys = pack_groups(plan_batches(cells, queues, parallelism, layout_of(run_args)),
                                   steps, max_steps)
    if vllm_releases:
        docs[-1].append(release_axis_step(vllm_releases, results_dir, queue_for(0, queues)[1],
                                          retry_limit, run_args))
        group_keys = [*group_keys, RELEASE_AXIS_KEY]
    annotate = CommandStep(
        label="P/D accuracy annotation",
        key=ANNOTATE_KEY,
        commands=annotate_commands(results_dir, annotation_path=annotation_path,
                                   report_dir=report_dir),
        agents={"queue": queue_for(0, queues)[1]},
        depends_on=list(group_keys),
        allow_dependency_failure=True,
        artifact_paths=[annotation_path] + ([f"{report_dir}/**/*"] if report_dir else []),
        timeout_in_minutes=30,
    )
    out = []
    for i, groups in enumerate(docs):
        pipeline = Pipeline()
        for group in groups:
            pipeline.add_step(group)
        if i == len(docs) - 1:
            pipeline.add_step(annotate)
        out.append(_readable(pipeline.to_dict()))
    if validate:
        validate_uploads(out, max_steps=max_steps)
    return out


RELEASE_AXIS_KEY = "pd-accuracy-vllm-releases"
RELEASE_AXIS_PROFILE = "smoke"
RELEASE_AXIS_MINUTES = 12        # per release: a smoke run took 7-9 min on the 2-core host


def release_axis_step(releases: Sequence[str], results_dir: str, queue: str,
                      retry_limit: int = DEFAULT_RETRY_LIMIT, run_args: Sequence[str] = ()) -> Any:
    """The CPU step that runs the smoke cells once per vLLM release, each in its own cached
    environment (harness.run.releases; uv makes them); `run_args` as every step's run."""
    from buildkite_sdk import AutomaticRetry, CommandStep, CommandStepRetry

    out = f"{results_dir}/vllm-releases"
    return CommandStep(
        label=f"P/D accuracy: {RELEASE_AXIS_PROFILE} per vLLM release ({', '.join(releases)})",
        key=RELEASE_AXIS_KEY,
        commands=["python3 -m pip install -q uv",
                  shlex.join([RUN_COMMAND, "run", "--profile", RELEASE_AXIS_PROFILE, "--vllm",
                              ",".join(releases), "--results-dir", out, *run_args])],
        agents={"queue": queue},
        env={"PD_ACCURACY_RESULTS_DIR": out, "PYTHONUNBUFFERED": "1"},
        timeout_in_minutes=RELEASE_AXIS_MINUTES * len(releases) + 15,
        artifact_paths=[f"{out}/**/*.json", f"{out}/**/*.jsonl", f"{out}/**/*.log"],
        retry=CommandStepRetry(automatic=[AutomaticRetry(exit_status=EXIT_ERROR,
                                                         limit=retry_limit)]),
    )


@dataclass(frozen=True)
class StepSettings:
    """What every command step of one pipeline shares."""

    profile: str
    results_dir: str
    junit_dir: str
    matrix_path: str | None
    run_args: tuple[str, ...]
    timeout_minutes: int
    retry_limit: int

    def command_step(self, batch: Batch) -> Any:
        """The buildkite-sdk CommandStep that runs `batch`."""
        from buildkite_sdk import AutomaticRetry, CommandStep, CommandStepRetry, SoftFailObject

        results_dir = self.results_dir
        return CommandStep(
            label=batch.label,
            key=batch.key,
            commands=[run_command(batch, profile=self.profile, results_dir=results_dir,
                                  junit_dir=self.junit_dir, matrix_path=self.matrix_path,
                                  extra_args=self.run_args)],
            agents={"queue": batch.queue},
            env={"PD_ACCURACY_RESULTS_DIR": results_dir, "PD_ACCURACY_PROFILE": self.profile,
                 "PD_ACCURACY_GPUS": str(batch.gpus), "PYTHONUNBUFFERED": "1"},
            timeout_in_minutes=step_timeout(batch, self.timeout_minutes),
            artifact_paths=[
                f"{results_dir}/**/*.json",     # result records
                f"{results_dir}/**/*.jsonl",    # per-question samples, proxy records
                f"{results_dir}/**/*.log",      # server and proxy logs
                f"{self.junit_dir}/{batch.key}*.xml",
            ],
            retry=CommandStepRetry(automatic=[AutomaticRetry(exit_status=EXIT_ERROR,
                                                             limit=self.retry_limit)]),
            soft_fail=[SoftFailObject(exit_status=EXIT_FAIL)] if batch.expected_failure else None,
            parallelism=batch.parallelism if batch.parallelism > 1 else None,
        )


def pack_groups(batches: Sequence[Batch], steps: StepSettings,
                max_steps: int) -> tuple[list[list[Any]], list[str]]:
    """The group steps of each upload, and every group's key. Consecutive batches are grouped
    by group key (first-seen order); each upload keeps one slot free for the annotate step, and
    a group that does not fit is split into parts with their own keys."""
    from buildkite_sdk import GroupStep

    grouped: OrderedDict[str, tuple[str, list[Batch]]] = OrderedDict()
    for batch in batches:
        grouped.setdefault(batch.group_key, (batch.group_label, []))[1].append(batch)
    room_per_doc = max_steps - 1
    docs: list[list[Any]] = [[]]
    used = 0
    group_keys: list[str] = []
    for group_key, (group_label, members) in grouped.items():
        part = 1
        while members:
            free = room_per_doc - used - 1   # the group step itself counts
            if free < 1:
                docs.append([])
                used = 0
                continue
            taken, members = members[:free], members[free:]
            key = group_key if part == 1 else f"{group_key}-part{part}"
            label = group_label if part == 1 and not members else f"{group_label} ({part})"
            docs[-1].append(GroupStep(group=label, key=key,
                                      steps=[steps.command_step(b) for b in taken]))
            group_keys.append(key)
            used += 1 + len(taken)
            part += 1
    return docs, group_keys


_LEADING_FIELDS = ("group", "label", "key", "depends_on", "allow_dependency_failure", "agents",
                   "parallelism", "timeout_in_minutes")


def _readable(value: Any) -> Any:
    """The SDK dumps fields alphabetically; put the ones a reader looks for first."""
    if isinstance(value, list):
        return [_readable(v) for v in value]
    if isinstance(value, dict):
        head = [k for k in _LEADING_FIELDS if k in value]
        return {k: _readable(value[k]) for k in head + [k for k in value if k not in head]}
    return value


def pipeline_yaml(doc: Mapping[str, Any]) -> str:
    """One pipeline document as YAML (key order kept, long commands unwrapped)."""
    import yaml

    return yaml.safe_dump(dict(doc), sort_keys=False, width=100_000, default_flow_style=False)


__all__ = [
    "ANNOTATE_KEY", "Batch", "DEFAULT_QUEUES", "annotate_commands", "generate_pipeline",
    "normalize_queues", "pipeline_yaml", "plan_batches", "queue_for",
    "run_command", "slug", "step_timeout",
]
