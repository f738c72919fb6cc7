"""Run a list of cells: the only module that walks the whole flow
Cell → Deployment → Endpoint → EvalRun → Comparison → Verdict → Record.

Servers are shared: one baseline per `baseline_key` (its EvalRun is reused by every cell of the
group), one P/D pair per `pair_key` (cells that differ only in a proxy-side fault reuse it). The
next pair of a group is launched while the current one is being evaluated, and on CPU the next
group's baseline and first pair while the group's last pair is (harness.run.groups_ahead).
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.eval.lmeval import EvalRun, evaluate_endpoint, split_size
from harness.run.aa_rerun import AAReruns, BaselineGate
from harness.run.cell_eval import evaluate_cell
from harness.run.effective_config_evidence import with_effective_config
from harness.run.groups_ahead import (GroupsAhead, baseline_and_first_pair, first_group,
                                      start_ahead)
from harness.run.stages import QuestionOrder, StagedRun
from harness.eval.task_choice import default_data_dir, default_task
from harness.judge.verdict import Policy, ReferenceAccuracy, Verdict, error, fail
from harness.run.provenance import hardware, versions
from harness.run.record import SCHEMA_VERSION, write_record
from harness.serve.deploy import (Deployment, Endpoint, Placement, ProxyDeployment, pair_key,
                                  plan_baseline, plan_pair)
from harness.serve.launch.models import reference_accuracy, resolve
from harness.serve.host.ports import PortAllocator
from harness.serve.supervision.process import ManagedProcessError
from harness.serve.supervision.registry import raise_if_interrupted
from harness.serve.proxy.hops import PROXY_FAULTS
from harness.serve.launch.server_spec import SERVER_FAULTS, Features
from harness.serve.host.start_slots import StartSlots
from harness.serve.template.client import stop_templates

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class BaselineRound:
    """One repeat's baseline: its question order, its answers so far (extended when a cell
    needs more questions; the server stays up) and its A/A re-run on the first look's, which
    may still be running (harness.run.aa_rerun)."""

    run_id: str
    order: QuestionOrder
    staged: StagedRun
    aa_rerun: "Future[EvalRun] | None"
    samples_path: Path

    @property
    def run(self) -> EvalRun:
        assert self.staged.run is not None
        return self.staged.run

    @property
    def aa(self) -> EvalRun | None:
        """The A/A re-run, waited for; raises harness.run.aa_rerun.BaselineFailed."""
        return None if self.aa_rerun is None else self.aa_rerun.result()

    def aa_pending(self) -> bool:
        return self.aa_rerun is not None and not self.aa_rerun.done()


@dataclass(frozen=True)
class _Group:
    """What every cell of one baseline group shares: its model, task and how servers start."""

    cells: list[Cell]
    pairs: list[list[Cell]]          # the group's cells by P/D pair (`pair_key`), first-seen order
    task: str
    data_dir: str | None
    hybrid: bool
    reference: ReferenceAccuracy | None   # the model card's accuracy on `task`
    deploy_args: dict[str, Any]      # keyword arguments of plan_baseline / plan_pair
    started: float                   # time.monotonic() when its servers began to be planned
    # time.monotonic() when its turn came (the previous group done): its own wall time counts
    # from here, its servers may have been started ahead of it (`started`)
    began: float = field(default_factory=time.monotonic)
    waited: dict[str, float] = field(default_factory=dict)   # start-up the flow blocked on, once
    gate: BaselineGate = field(default_factory=BaselineGate)  # the baseline's requests, one at a time

    @property
    def first(self) -> Cell:
        return self.cells[0]


class _GroupAborted(Exception):
    """The group's baseline failed: `results` holds the ERROR record of every cell."""

    def __init__(self, results: list["CellResult"]) -> None:
        super().__init__(f"{len(results)} cell(s) aborted")
        self.results = results


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    verdict: Verdict
    record_path: Path | None
    record: dict


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


# ---- the run --------------------------------------------------------------------------------
class Runner:
    def __init__(self, options: RunOptions, policy: Policy, *, features: Features | None = None,
                 placement: Placement | None = None, run_id: str | None = None,
                 progress: Progress | None = None, hybrid_models: Sequence[str] = ()) -> None:
        self.options = options
        self.policy = policy
        self.features = features or Features()
        self.placement = placement or Placement.detect(options.gpu_layout)
        self.run_id = run_id or new_run_id()
        self.progress = progress or (lambda msg: log.info(msg))
        self.allocator = PortAllocator()
        self.start_slots = StartSlots.from_limit(options.max_starting)
        self.hybrid_models = set(hybrid_models)
        self.results_root = Path(options.results_dir)
        self.run_dir = self.results_root / self.run_id
        self.log_dir = self.run_dir / "logs"
        self.peak_rss_bytes = 0
        self.ahead = GroupsAhead()   # the next group's servers, started during this one's last pair

    # -- records ------------------------------------------------------------------------------
    def record(self, cell: Cell, verdict: Verdict, *, metrics: dict | None = None,
                timings: dict | None = None, artifacts: dict | None = None,
                run_id: str | None = None) -> CellResult:
        # no verdict after a stop signal: what failed then is the interruption, not the cell
        raise_if_interrupted()
        # what the cell declares decides the outcome (canary CAUGHT/MISSED, XFAIL only as declared)
        verdict = replace(verdict, canary=cell.fault, expected_failure=cell.expected_failure,
                          expected_failure_match=cell.expected_failure_match)
        verdict, effective_config = with_effective_config(cell, verdict, artifacts)
        record = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id or self.run_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cell": cell.to_dict(),
            "versions": versions(), "hardware": hardware(cell.device),
            "options": {**self.options.to_dict(), "policy": asdict(self.policy)},
            "metrics": metrics or {},
            "verdict": verdict.to_dict(),
            "timings": timings or {}, "effective_config": effective_config,
            "artifacts": self._relative(artifacts or {}, self.results_root / (run_id or self.run_id)),
        }
        path = write_record(self.results_root, record)
        self.progress(f"{verdict.outcome:<12} {cell.cell_id}: {verdict.reason}")
        return CellResult(cell, verdict, path, record)

    @staticmethod
    def _relative(artifacts: dict, run_dir: Path) -> dict:
        def rel(v):
            if isinstance(v, dict):
                return {k: rel(x) for k, x in v.items()}
            if isinstance(v, str) and os.path.isabs(v):
                return os.path.relpath(v, run_dir)
            return v
        return rel(artifacts)

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self, endpoint: Endpoint, role: str, task: str, data_dir: str | None,
                 concurrency: int | None = None, sample: list[int] | None = None,
                 limit: int | None = None) -> EvalRun:
        """lm-eval on `endpoint`: the documents `sample`, or the first `limit` (default the
        first look's)."""
        o = self.options
        return evaluate_endpoint(sample_indices=sample,
            role=role, base_url=endpoint.base_url, served_model_name=endpoint.served_model_name,
            task=task, data_dir=data_dir, limit=limit or o.limit, num_fewshot=o.num_fewshot,
            seed=o.seed, concurrency=concurrency or o.concurrency,
            top_logprobs=o.top_logprobs, max_gen_toks=o.max_gen_toks,
            timeout_s=o.request_timeout_s, work_dir=None)

    # -- running servers for a caller's own requests (the pytest plugin's fixtures) --------------
    @contextmanager
    def running_baseline(self, cell: Cell) -> Iterator[Endpoint]:
        """`cell`'s non-disaggregated server, healthy; stopped on exit."""
        with plan_baseline(cell, **self._plan_group([cell]).deploy_args) as baseline:
            yield baseline.baseline_endpoint()

    @contextmanager
    def running_pair(self, cell: Cell) -> Iterator[Endpoint]:
        """`cell`'s P/D pair behind the harness's proxy (its proxy-side fault applied):
        `.base_url` is the proxy, `.metrics_urls` the decode servers', `.proxy_records` the
        per-request transfer records. Everything is stopped on exit."""
        group = self._plan_group([cell])
        proxy_fault = cell.fault if cell.fault in PROXY_FAULTS else None
        records = self.run_dir / cell.cell_id / "proxy-records.jsonl"
        with plan_pair(cell, **group.deploy_args, kv_digest=self.options.kv_digest) as pair:
            port = self.allocator.reserve(1, owner=f"proxy:{cell.cell_id}")[0]
            with ProxyDeployment(pair, port=port, log_dir=self.log_dir, fault=proxy_fault,
                                 records_path=records, allocator=self.allocator) as proxy:
                yield proxy.endpoint()

    def run(self, cells: Sequence[Cell], *, then: Sequence[Cell] = ()) -> list[CellResult]:
        """Run every cell; never raises for a cell's failure (it becomes its verdict). `then`:
        the cells the caller will run next (a hint): on CPU their group's servers start during
        this run's last pair, and the next run() takes them (close() stops what is not taken)."""
        groups: dict[str, list[Cell]] = {}
        for cell in cells:
            groups.setdefault(cell.baseline_key, []).append(cell)
        # each group's successor: the next one here, after the last the caller's next group
        upcoming = [*groups.values(), first_group([c for c in then if c.baseline_key not in groups])]
        results: list[CellResult] = []
        try:
            for i, group in enumerate(groups.values()):
                results += self._run_group(group, upcoming[i + 1])
        except BaseException:
            self.ahead.close()
            raise
        return results

    def close(self) -> None:
        """Stop the servers of a group started ahead that no run() took, and the server
        templates this run's servers forked from (harness.serve.template.client)."""
        self.ahead.close()
        stop_templates(self.log_dir)

    def _run_group(self, cells: list[Cell], next_cells: Sequence[Cell] = ()) -> list[CellResult]:
        group = self._plan_group(cells)
        started_ahead = self.ahead.take(group.first.baseline_key)
        if started_ahead is not None:   # its start-up counts from the launch
            group = replace(group, started=started_ahead.launched_at)
        launched: list[Deployment] = []
        aa_reruns = AAReruns(group.gate)
        try:
            baseline, first_pair = baseline_and_first_pair(self, group, started_ahead, launched)
            self._wait_for_baseline(group, baseline)
            rounds = self._evaluate_baseline(group, baseline, aa_reruns)
            results = self._run_pairs(group, baseline, rounds, first_pair, launched, next_cells)
        except _GroupAborted as aborted:
            return aborted.results
        finally:
            for d in launched:
                d.stop()
            aa_reruns.close()   # after the baseline stopped: a re-run still asking it ends
        group_total = time.monotonic() - group.began
        for r in results:   # known once the group is done: the records are written again
            r.record["timings"]["group_total_s"] = group_total
            write_record(self.results_root, r.record)
        return results

    def _plan_group(self, cells: list[Cell]) -> _Group:
        first = cells[0]
        model = resolve(first.model)
        hybrid = model.hybrid or first.model in self.hybrid_models
        # prefix_reuse is in the baseline key: the whole group asks the shared-prefix variant
        task = (self.options.task if self.options.task != "auto"
                else default_task(model, prefix_reuse=first.prefix_reuse))
        data_dir = self.options.dataset_dir or default_data_dir(task)
        reference = reference_accuracy(model, task)
        deploy_args = dict(model_path=model.path, hybrid=hybrid, allocator=self.allocator,
                           placement=self.placement, log_dir=self.log_dir, features=self.features,
                           startup_timeout_s=self.options.startup_timeout_s,
                           kv_cache_bytes=self.options.kv_cache_bytes,
                           start_slots=self.start_slots,
                           server_start=self.options.server_start)
        pairs: dict[tuple, list[Cell]] = {}
        for cell in cells:
            pairs.setdefault(pair_key(cell), []).append(cell)
        for members in pairs.values():   # clean cells first: they meet the pair fresh
            members.sort(key=lambda c: c.fault is not None)
        return _Group(cells=cells, pairs=list(pairs.values()), task=task, data_dir=data_dir,
                      hybrid=hybrid, reference=reference, deploy_args=deploy_args,
                      started=time.monotonic())

    def _plan_baseline(self, group: _Group) -> Deployment:
        return plan_baseline(group.first, **group.deploy_args)

    def _wait_for_baseline(self, group: _Group, baseline: Deployment) -> None:
        """Wait for the baseline; a baseline that cannot start is every cell's ERROR."""
        waiting = time.monotonic()
        try:
            baseline.wait()
        except ManagedProcessError as exc:
            reason = f"baseline failed to start: {exc}"
            waited = {"startup_s": time.monotonic() - group.started}  # what the attempt cost
            raise _GroupAborted([self.record(c, error(reason, c.expected_failure), timings=waited,
                                              artifacts={"logs": baseline.logs()})
                                 for c in group.cells]) from exc
        group.waited["baseline"] = time.monotonic() - waiting

    def _evaluate_baseline(self, group: _Group, baseline: Deployment,
                           aa_reruns: AAReruns) -> list[BaselineRound]:
        """Every repeat's baseline evaluation, its samples written to disk, and its A/A re-run
        handed to `aa_reruns` (it runs while the pairs start and answer; harness.run.aa_rerun)."""
        base_ep = baseline.baseline_endpoint()
        task, data_dir, key = group.task, group.data_dir, group.first.baseline_key
        repeats = self.options.repeats
        rounds: list[BaselineRound] = []
        size = split_size(task, data_dir)
        limit = self.options.limit
        try:
            for r in range(repeats):
                order = QuestionOrder.for_repeat(size, self.options.sample_seed, r)
                staged = StagedRun(lambda docs, n: group.gate(lambda: self.evaluate(
                    base_ep, "baseline", task, data_dir, sample=docs, limit=n)), order)
                tag = f" (repeat {r + 1}/{repeats})" if repeats > 1 else ""
                self.progress(f"evaluating baseline ({task}, {limit} questions){tag}")
                base_run = staged.up_to(limit)
                run_id = self.run_id if repeats == 1 else f"{self.run_id}-r{r:02d}"
                base_dir = self.results_root / run_id / "baselines"
                samples_path = base_run.write_jsonl(base_dir / f"{key}.jsonl")
                aa_rerun = None
                if self.options.noise_floor:
                    self.progress("evaluating baseline again at concurrency 1 (A/A noise floor), "
                                  "in the background")
                    aa_rerun = aa_reruns.submit(self._aa_job(
                        base_ep, task, data_dir, order.docs(0, limit), limit,
                        base_dir / f"{key}-aa.jsonl"))
                rounds.append(BaselineRound(run_id, order, staged, aa_rerun, samples_path))
        except Exception as exc:  # noqa: BLE001 - any failure of the baseline is environmental
            reason = f"baseline evaluation failed: {type(exc).__name__}: {exc}"
            raise _GroupAborted([self.record(c, error(reason, c.expected_failure),
                                              artifacts={"logs": baseline.logs()})
                                 for c in group.cells]) from exc
        return rounds

    def _aa_job(self, base_ep: Endpoint, task: str, data_dir: str | None,
                sample: list[int] | None, limit: int, samples_path: Path) -> Callable[[], EvalRun]:
        def job() -> EvalRun:
            aa = self.evaluate(base_ep, "baseline-aa", task, data_dir, concurrency=1,
                               sample=sample, limit=limit)
            aa.write_jsonl(samples_path)
            return aa
        return job

    def _plan_pair(self, group: _Group, index: int) -> Deployment:
        cells = group.pairs[index]
        arm = any(c.fault in SERVER_FAULTS for c in cells)
        return plan_pair(cells[0], **group.deploy_args, arm_faults=arm,
                         kv_digest=self.options.kv_digest)

    def _launch_pair(self, group: _Group, index: int,
                     launched: list[Deployment]) -> Deployment | None:
        """Plan and launch the group's pair number `index`; None past the last pair."""
        if index >= len(group.pairs):
            return None
        pair = self._plan_pair(group, index)
        launched.append(pair)
        pair.launch()
        return pair

    def _run_pairs(self, group: _Group, baseline: Deployment, rounds: list[BaselineRound],
                   first_pair: Deployment, launched: list[Deployment],
                   next_cells: Sequence[Cell] = ()) -> list[CellResult]:
        """Each pair in turn: wait for it, launch the next one (after the last: the next
        group's servers), run its cells on every round."""
        base_samples = rounds[0].samples_path
        # the first run's: each A/A re-run's time is in its cell's timings (it overlaps the pair)
        baseline_eval_s = sum(b.run.wall_s for b in rounds) / self.options.repeats
        results: list[CellResult] = []
        pair: Deployment | None = first_pair
        for i, cells_of_pair in enumerate(group.pairs):
            assert pair is not None   # _launch_pair gave one for every index below len(pairs)
            waiting = time.monotonic()
            try:
                pair.wait()
            except ManagedProcessError as exc:
                pair.stop()
                for c in cells_of_pair:
                    results.append(self.record(
                        c, fail(f"P/D pair failed to start while the baseline ran: {exc}",
                                c.expected_failure, check="pd-startup"),
                        timings={"startup_s": time.monotonic() - group.started},
                        artifacts={"logs": pair.logs(), "baseline_samples": str(base_samples)}))
                pair = self._launch_pair(group, i + 1, launched)
                continue
            # blocked on servers: the baseline's start-up (the first pair's cells) + this pair's
            pair_wait = time.monotonic() - waiting + (group.waited.pop("baseline", 0.0))
            self.peak_rss_bytes = max(self.peak_rss_bytes, baseline.rss_bytes() + pair.rss_bytes())
            following = self._launch_pair(group, i + 1, launched)  # starts while this one is evaluated
            if following is None:
                start_ahead(self, next_cells, baseline.rss_bytes() + pair.rss_bytes())
            for cell in cells_of_pair:
                for rnd in rounds:
                    results.append(evaluate_cell(self, 
                        cell, pair, rnd, group.task, group.data_dir, group.hybrid,
                        reference=group.reference,
                        timings={"startup_s": max(baseline.startup_s or 0, pair.startup_s or 0),
                                 "startup_wait_s": pair_wait, "baseline_eval_s": baseline_eval_s},
                        baseline_logs=baseline.logs()))
                    pair_wait = 0.0   # the wait is the first cell's; the others found servers up
            pair.stop()
            pair = following
        return results
