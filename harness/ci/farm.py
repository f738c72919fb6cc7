"""Local farm: run a generated Buildkite pipeline on this machine, step by step.

``pd-accuracy farm --profile smoke`` generates the same pipeline documents that CI
uploads (harness.ci.pipeline.generate_pipeline), reads them into steps (harness.ci.steps) and
executes those here, with the semantics Buildkite gives them:

* commands are interpolated the way ``buildkite-agent pipeline upload`` does
  (harness.ci.steps.interpolate), then run as one ``bash -e -c`` script, like the agent's
  default shell, in a process group of its own (harness.serve.supervision.process.ManagedProcess);
* ``depends_on`` (steps or whole groups) orders the jobs; a step whose dependency failed is not
  run unless it sets ``allow_dependency_failure``;
* ``parallelism: N`` gives N jobs with ``BUILDKITE_PARALLEL_JOB``/``..._COUNT`` set;
* ``retry.automatic`` reruns a job on the listed exit statuses up to ``limit`` times;
* ``soft_fail`` turns the listed exit statuses into a soft failure (does not fail the farm);
* ``timeout_in_minutes`` kills the job's process group.

When a job's script exits, whatever it left running in its process group is stopped too, so the
GPUs it held are free for the next job.

Resources: a job needing G GPUs (``PD_ACCURACY_GPUS`` in its env, else its queue) waits until G
GPUs are free and gets them as ``CUDA_VISIBLE_DEVICES`` (physical indices from
harness.core.platform.detect_gpus; the run command's own GPU leases then stay inside that set);
jobs needing none take one of `cpu_slots` (1 by default: a 2-core box runs one CPU cell at a
time). A job needing more GPUs than the machine has fails at once instead of waiting forever.

``buildkite-agent`` is replaced, on the jobs' PATH, by a small stand-in: ``artifact download``
and ``artifact upload`` succeed without copying (every job ran in this working tree), and
``annotate`` writes the annotation body under the farm's log directory.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.ci.steps import FarmStep, farm_steps, interpolate
from harness.core.outcomes import EXIT_ERROR, EXIT_FAIL, EXIT_OK
from harness.core.platform import detect_gpus
from harness.serve.supervision.process import ManagedProcess

KILL_GRACE_S = 10.0
EXIT_POLL_S = 0.05    # how often a running job is checked for having exited

PASSED = "passed"
SOFT_FAILED = "soft_failed"
FAILED = "failed"
TIMED_OUT = "timed_out"
NOT_RUN = "not_run"           # a dependency failed
HARD_FAILURES = (FAILED, TIMED_OUT)


@dataclass
class JobResult:
    """What one job (a step, or one parallel job of it) ended as."""

    step_key: str
    label: str
    index: int | None            # parallel job index, None without parallelism
    state: str                   # PASSED | SOFT_FAILED | FAILED | TIMED_OUT | NOT_RUN
    exit_status: int | None
    attempts: int
    duration_s: float
    log_path: Path | None
    reason: str = ""

    @property
    def name(self) -> str:
        return self.step_key if self.index is None else f"{self.step_key}#{self.index}"


@dataclass
class FarmResult:
    jobs: list[JobResult]

    @property
    def hard_failures(self) -> list[JobResult]:
        return [j for j in self.jobs if j.state in HARD_FAILURES]

    @property
    def exit_code(self) -> int:
        """0 when no job hard-failed; 3 when every hard failure was an ERROR (exit 3, the
        environment); 1 otherwise."""
        failures = self.hard_failures
        if not failures:
            return EXIT_OK
        if all(j.exit_status == EXIT_ERROR for j in failures):
            return EXIT_ERROR
        return EXIT_FAIL


@dataclass
class _Job:
    step: FarmStep
    index: int | None


_AGENT_SHIM = """#!/bin/sh
# pd-accuracy farm: local stand-in for buildkite-agent (see harness/ci/farm.py).
case "$1 $2" in
  "artifact download"|"artifact upload")
    echo "farm: artifacts stay in the working tree ($1 $2 skipped)"; exit 0 ;;
esac
if [ "$1" = "annotate" ]; then
  context=default
  while [ $# -gt 0 ]; do
    if [ "$1" = "--context" ]; then context="$2"; fi
    shift
  done
  cat > "$PD_ACCURACY_FARM_LOG_DIR/annotation-$context.md"
  echo "farm: annotation written to $PD_ACCURACY_FARM_LOG_DIR/annotation-$context.md"
  exit 0
fi
echo "farm: buildkite-agent $* is not available locally" >&2
exit 1
"""


def _write_agent_shim(folder: Path) -> None:
    """A `buildkite-agent` on the jobs' PATH that answers the meta-data calls steps make."""
    shim = folder / "buildkite-agent"
    shim.write_text(_AGENT_SHIM)
    shim.chmod(0o755)


class Farm:
    """Runs FarmSteps as subprocesses in `workdir`; see the module docstring."""

    def __init__(self, *, gpus: int | str | Sequence[str] = "auto", cpu_slots: int = 1,
                 workdir: str | os.PathLike[str] = ".",
                 log_dir: str | os.PathLike[str] = "results/farm",
                 env: Mapping[str, str] | None = None, console: Any = None,
                 step_peak_bytes: Mapping[str, int] | None = None,
                 gpu_bytes: Sequence[int] | None = None, max_gpu_jobs: int | None = None):
        """`step_peak_bytes`: the GPU memory a one-group step's job holds at its peak
        (harness.run.plan.packing); such jobs share GPUs by memory (`gpu_bytes`: each GPU's free
        bytes, in `gpus` order), at most `max_gpu_jobs` at once. Other GPU jobs (a shard that
        packs its own groups) get their GPUs to themselves."""
        if gpus == "auto":
            self.gpu_ids = [str(gpu.index) for gpu in detect_gpus()]
        elif isinstance(gpus, (list, tuple)):
            self.gpu_ids = [str(g) for g in gpus]
        else:
            if int(gpus) < 0:
                raise ValueError("gpus must be >= 0")
            self.gpu_ids = [str(i) for i in range(int(gpus))]
        self.total_gpus = len(self.gpu_ids)
        if cpu_slots < 1:
            raise ValueError("cpu_slots must be >= 1")
        self.cpu_slots = cpu_slots
        self.workdir = Path(workdir).resolve()
        self.log_dir = (self.workdir / log_dir).resolve()
        self.base_env = dict(os.environ if env is None else env)
        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.console = console
        self.step_peak_bytes = dict(step_peak_bytes or {})
        self.packer = self._packer(gpu_bytes, max_gpu_jobs)
        self._procs: dict[int, ManagedProcess] = {}
        self._lock = threading.Lock()

    def _packer(self, gpu_bytes: Sequence[int] | None, max_gpu_jobs: int | None):
        """The GPU packer of harness.run.plan.packing over this farm's GPUs."""
        from harness.run.plan.packing import GpuRoom, Packer, max_parallel_groups

        sizes = list(gpu_bytes or [])
        if len(sizes) != self.total_gpus or not self.step_peak_bytes:
            sizes = [1] * self.total_gpus     # no memory known: every GPU job alone on its GPUs
        rooms = [GpuRoom(i, size, size) for i, size in enumerate(sizes)]
        cap = max_gpu_jobs or max_parallel_groups(os.cpu_count() or 1, self.total_gpus)
        return Packer(rooms, max(cap, self.total_gpus))

    def _gpu_job(self, job: _Job) -> Any:
        """`job` as the packer sees it: its peak bytes when it is one group, else all of each
        GPU it asks for."""
        from harness.run.plan.packing import GroupJob

        peak = self.step_peak_bytes.get(job.step.key) if job.step.parallelism == 1 else None
        if peak is None:
            peak = max((r.usable_bytes for r in self.packer.rooms), default=0) or 1 << 62
        return GroupJob(index=id(job), baseline_key=job.step.key, cell_ids=(), gpus=job.step.gpus,
                        peak_bytes=peak, servers_at_peak=0, warm_key=(), start_weight=0.0)

    # -- public ---------------------------------------------------------------------------------
    def run(self, steps: Sequence[FarmStep]) -> FarmResult:
        """Run every job of `steps`, honouring dependencies; returns what each ended as."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        jobs = [_Job(s, i if s.parallelism > 1 else None)
                for s in steps for i in range(max(1, s.parallelism))]
        members: dict[str, list[_Job]] = {}
        for job in jobs:
            members.setdefault(job.step.key, []).append(job)
            if job.step.group_key:
                members.setdefault(job.step.group_key, []).append(job)
        results: dict[int, JobResult] = {}
        pending = list(jobs)
        running: dict[Future, tuple[_Job, list[str]]] = {}
        free_cpu = self.cpu_slots
        placed: dict[int, Any] = {}   # id(job) -> its GroupJob in the packer
        self.console.log(f"farm: {len(jobs)} jobs from {len(steps)} steps; "
                         f"{self.total_gpus} GPUs, {self.cpu_slots} CPU slot(s)")

        def dependency_state(key: str) -> str | None:
            states = [results[id(j)].state if id(j) in results else None for j in members[key]]
            if None in states:
                return None
            return FAILED if any(s in HARD_FAILURES + (NOT_RUN,) for s in states) else PASSED

        with tempfile.TemporaryDirectory(prefix="pd-farm-bin-") as shim_dir, \
                ThreadPoolExecutor(max_workers=max(1, self.packer.max_groups
                                                   + self.cpu_slots)) as pool:
            _write_agent_shim(Path(shim_dir))
            try:
                while pending or running:
                    for job in list(pending):
                        states = [dependency_state(d) for d in job.step.depends_on]
                        if None in states:
                            continue
                        if FAILED in states and not job.step.allow_dependency_failure:
                            pending.remove(job)
                            results[id(job)] = self._not_run(job, "a dependency failed")
                            continue
                        if job.step.gpus > self.total_gpus:
                            pending.remove(job)
                            results[id(job)] = self._not_run(
                                job, f"needs {job.step.gpus} GPUs, this machine has "
                                     f"{self.total_gpus}", state=FAILED)
                            continue
                        if job.step.gpus == 0:
                            if free_cpu < 1:
                                continue
                            free_cpu -= 1
                            held: list[str] = []
                        else:
                            gpu_job = self._gpu_job(job)
                            where = self.packer.place(gpu_job)
                            if where is None:
                                continue
                            placed[id(job)] = gpu_job
                            held = [self.gpu_ids[i] for i in where]
                        pending.remove(job)
                        running[pool.submit(self._run_job, job, held, shim_dir)] = (job, held)
                    if not running:
                        if pending:   # nothing can start and nothing will finish: a cycle
                            for job in pending:
                                results[id(job)] = self._not_run(
                                    job, "dependencies can never finish", state=FAILED)
                            pending.clear()
                        break
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for future in done:
                        job, held = running.pop(future)
                        results[id(job)] = future.result()
                        if held:
                            self.packer.release(placed.pop(id(job)))
                        else:
                            free_cpu += 1
            except BaseException:
                self.kill_all()
                raise
        ordered = [results[id(j)] for j in jobs]
        self._summary(ordered)
        return FarmResult(ordered)

    def kill_all(self) -> None:
        """Stop every job still running (its whole process group)."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            proc.stop(term_timeout_s=KILL_GRACE_S)

    # -- internals ------------------------------------------------------------------------------
    def _not_run(self, job: _Job, reason: str, state: str = NOT_RUN) -> JobResult:
        result = JobResult(job.step.key, job.step.label, job.index, state, None, 0, 0.0, None,
                           reason)
        self.console.log(f"[{'red' if state == FAILED else 'yellow'}]{state}[/] "
                         f"{result.name}: {reason}")
        return result

    def _job_env(self, job: _Job, gpu_ids: list[str], shim_dir: str, attempt: int) -> dict:
        env = dict(self.base_env)
        upload_env = dict(self.base_env)
        env.update({k: interpolate(v, upload_env) for k, v in job.step.env.items()})
        path = [shim_dir] + [p for p in env.get("PATH", "").split(os.pathsep) if p]
        python_bin = os.path.dirname(sys.executable)
        if python_bin not in path:
            path.append(python_bin)   # `pd-accuracy` resolves even without an activated venv
        env["PATH"] = os.pathsep.join(path)
        env.update({
            "PD_ACCURACY_FARM": "1",
            "PD_ACCURACY_FARM_LOG_DIR": str(self.log_dir),
            "BUILDKITE_STEP_KEY": job.step.key,
            "BUILDKITE_LABEL": job.step.label,
            "BUILDKITE_RETRY_COUNT": str(attempt - 1),
        })
        env.pop("BUILDKITE", None)   # jobs must not talk to a real agent from here
        if job.index is not None:
            env["BUILDKITE_PARALLEL_JOB"] = str(job.index)
            env["BUILDKITE_PARALLEL_JOB_COUNT"] = str(job.step.parallelism)
        if job.step.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        elif self.total_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""   # a CPU job must not touch the GPUs
        return env

    def _run_job(self, job: _Job, gpu_ids: list[str], shim_dir: str) -> JobResult:
        step = job.step
        name = step.key if job.index is None else f"{step.key}#{job.index}"
        log_path = self.log_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".log")
        script = "\n".join(interpolate(c, self.base_env) for c in step.commands)
        started = time.monotonic()
        attempt = 0
        retries_used = 0
        while True:
            attempt += 1
            self.console.log(f"[cyan]start[/] {name} (attempt {attempt})"
                             + (f" on GPUs {','.join(gpu_ids)}" if gpu_ids else ""))
            status = self._spawn(name, script, self._job_env(job, gpu_ids, shim_dir, attempt),
                                 log_path, step.timeout_s, attempt)
            if status is None:
                state, status_shown = TIMED_OUT, -1
            elif status == 0:
                state, status_shown = PASSED, 0
            else:
                status_shown = status
                if retries_used < step.retry_limit(status):
                    retries_used += 1
                    self.console.log(f"[yellow]retry[/] {name}: exit {status}, automatic retry "
                                     f"{retries_used}/{step.retry_limit(status)}")
                    continue
                state = SOFT_FAILED if step.is_soft(status) else FAILED
            break
        duration = time.monotonic() - started
        colour = {PASSED: "green", SOFT_FAILED: "yellow"}.get(state, "red")
        self.console.log(f"[{colour}]{state}[/] {name}: exit {status_shown} after "
                         f"{attempt} attempt(s), {duration:.1f}s, log {log_path}")
        if state in HARD_FAILURES:
            self._show_tail(log_path)
        return JobResult(step.key, step.label, job.index, state, status_shown, attempt, duration,
                         log_path)

    def _spawn(self, name: str, script: str, env: dict, log_path: Path,
               timeout_s: float | None, attempt: int) -> int | None:
        """Run `script` once; its exit status, or None when it timed out."""
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"--- farm: attempt {attempt}\n{script}\n---\n")
        # `env` is the job's whole environment; ManagedProcess would add PYTHONUNBUFFERED to it
        exact_env: dict[str, str | None] = {"PYTHONUNBUFFERED": None, **env}
        proc = ManagedProcess(f"farm job {name}", ["bash", "-e", "-c", script], log_path,
                              env=exact_env, cwd=self.workdir, inherit_env=False)
        proc.start()
        with self._lock:
            self._procs[id(proc)] = proc
        try:
            status = _wait_for_exit(proc, timeout_s)
            if status is None:
                with open(log_path, "a", encoding="utf-8") as log:
                    log.write(f"--- farm: timed out after {timeout_s:.0f}s, killing\n")
            # after a normal exit too: what the script left in its group must not keep the GPUs
            proc.stop(term_timeout_s=KILL_GRACE_S)
            return status
        finally:
            with self._lock:
                self._procs.pop(id(proc), None)

    def _show_tail(self, log_path: Path, lines: int = 20) -> None:
        try:
            tail = log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return
        for line in tail:
            self.console.print(f"    {line}", markup=False, highlight=False)

    def _summary(self, results: Sequence[JobResult]) -> None:
        from rich.table import Table

        table = Table(title="farm summary")
        for column in ("job", "state", "exit", "attempts", "seconds", "log / reason"):
            table.add_column(column)
        for r in results:
            table.add_row(r.name, r.state, "" if r.exit_status is None else str(r.exit_status),
                          str(r.attempts), f"{r.duration_s:.1f}",
                          r.reason or (str(r.log_path) if r.log_path else ""))
        self.console.print(table)


def _wait_for_exit(proc: ManagedProcess, timeout_s: float | None) -> int | None:
    """`proc`'s exit status once it has exited, or None when `timeout_s` passed first."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (status := proc.returncode) is None:
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(EXIT_POLL_S)
    return status


def run_farm(profile: str, *, matrix_path: str | None = None, parallelism: int = 1,
             gpus: int | str = "auto", cpu_slots: int = 1,
             queues: Mapping[int, str] | None = None, results_dir: str | None = None,
             run_args: Sequence[str] = (), workdir: str | os.PathLike[str] = ".",
             log_dir: str = "results/farm", dry_run: bool = False, console: Any = None,
             only: Sequence[str] | None = None, annotation_path: str | None = None,
             report_dir: str | None = None) -> int:
    """Expand `profile` for this machine, generate its pipeline and run it here. Returns the
    farm's exit code (FarmResult.exit_code); raises ValueError (harness.matrix.MatrixError)
    when the profile cannot be expanded or holds no cell runnable here."""
    from harness import matrix
    from harness.ci.pipeline import DEFAULT_RESULTS_DIR, generate_pipeline, pipeline_yaml
    from harness.core.platform import PlatformInfo

    spec = matrix.load_matrix(matrix_path)
    cells = list(matrix.expand(spec, profile, PlatformInfo.detect()).cells)
    if only is not None:   # [] selects nothing: never "the whole profile"
        cells = matrix.select(cells, list(only))
    if not cells:
        raise ValueError(f"profile {profile!r}: no cell selected that this machine can run")
    docs = generate_pipeline(cells, profile=profile, queues=queues,
                             results_dir=results_dir or DEFAULT_RESULTS_DIR,
                             parallelism=parallelism, matrix_path=matrix_path, run_args=run_args,
                             report_dir=report_dir,
                             **({"annotation_path": annotation_path} if annotation_path else {}))
    if dry_run:
        for doc in docs:
            print(pipeline_yaml(doc))
        return EXIT_OK
    steps = farm_steps(docs, queues)
    peaks, gpu_bytes = _gpu_packing(cells, queues, parallelism, run_args, gpus)
    farm = Farm(gpus=gpus, cpu_slots=cpu_slots, workdir=workdir, log_dir=log_dir, console=console,
                step_peak_bytes=peaks, gpu_bytes=gpu_bytes)
    return farm.run(steps).exit_code


def _gpu_packing(cells: Sequence[Any], queues: Mapping[int, str] | None, parallelism: int,
                 run_args: Sequence[str], gpus: int | str | Sequence[str]
                 ) -> tuple[dict[str, int], list[int] | None]:
    """Each one-group GPU step's peak memory (harness.run.plan.packing, as `run` plans it) and the
    free bytes of the GPUs the farm uses: one-group steps then share GPUs by memory."""
    from harness.ci.pipeline import DEFAULT_QUEUES, layout_of, normalize_queues, plan_batches
    from harness.run.plan.packed import kv_cache_bytes, weight_bytes
    from harness.core.options import RunOptions
    from harness.core.platform import query_gpu_used_bytes
    from harness.run.plan.packing import group_jobs, read_gpu_rooms

    layout = layout_of(run_args)
    options = RunOptions()
    peaks = {}
    for batch in plan_batches(cells, normalize_queues(queues or DEFAULT_QUEUES), parallelism,
                              layout):
        if batch.gpus and batch.parallelism == 1 and batch.baseline_groups == 1:
            (job,) = group_jobs(batch.cells, kv_cache_bytes=lambda c: kv_cache_bytes(c, options),
                                weight_bytes=weight_bytes, layout=layout)
            peaks[batch.key] = job.peak_bytes
    devices = detect_gpus()
    if gpus != "auto" and not isinstance(gpus, (list, tuple)):
        devices = devices[:int(gpus)]
    rooms = read_gpu_rooms(devices, query_gpu_used_bytes())
    return peaks, [r.free_bytes for r in rooms] or None


__all__ = ["Farm", "FarmResult", "JobResult", "run_farm"]
