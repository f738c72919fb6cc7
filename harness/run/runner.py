"""Run a list of cells: the only module that walks the whole flow
Cell → Deployment → Endpoint → EvalRun → Comparison → Verdict → Record.

Servers are shared: one baseline per `baseline_key` (its EvalRun is reused by every cell of the
group), one P/D pair per `pair_key` (cells that differ only in a proxy-side fault reuse it), and
the next pair of a group is launched while the current one is being evaluated.
"""
from __future__ import annotations

import hashlib
import logging
import os
import random
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.eval.lmeval import EvalRun, evaluate_endpoint, split_size
from harness.eval.task_choice import default_data_dir, default_task
from harness.eval.metrics import scrape_all
from harness.judge.compare import compare
from harness.judge.verdict import Policy, ReferenceAccuracy, Verdict, decide, error, fail
from harness.run.provenance import hardware, versions
from harness.run.record import SCHEMA_VERSION, write_record
from harness.run.transfer_evidence import read_proxy_records, transfer_proof
from harness.serve.deploy import (Deployment, Endpoint, Placement, ProxyDeployment, pair_key,
                                  plan_baseline, plan_pair)
from harness.serve.models import ResolvedModel, reference_accuracy, resolve
from harness.serve.ports import PortAllocator
from harness.serve.process import ManagedProcessError, most_decisive_line
from harness.serve.plugins.fault_spec import request_tag_for
from harness.serve.server_spec import SERVER_FAULTS, Features
from harness.serve.start_slots import StartSlots

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class _BaselineRound:
    """One evaluation of the baseline (and its A/A re-run) on one question sample."""

    run_id: str
    sample: list[int] | None
    run: EvalRun
    aa: EvalRun | None
    samples_path: Path


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
    waited: dict[str, float] = field(default_factory=dict)   # start-up the flow blocked on, once

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

    # -- records ------------------------------------------------------------------------------
    def _record(self, cell: Cell, verdict: Verdict, *, metrics: dict | None = None,
                timings: dict | None = None, artifacts: dict | None = None,
                run_id: str | None = None) -> CellResult:
        verdict = replace(verdict, canary=cell.fault)   # a canary's outcome is CAUGHT or MISSED
        record = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id or self.run_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cell": cell.to_dict(),
            "versions": versions(),
            "hardware": hardware(cell.device),
            "options": {**self.options.to_dict(), "policy": asdict(self.policy)},
            "metrics": metrics or {},
            "verdict": verdict.to_dict(),
            "timings": timings or {},
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
    def _sample(self, task: str, data_dir: str | None, repeat: int) -> list[int] | None:
        """Question subset of one repeat: the first `limit` docs, or a seeded random subset."""
        seed = self.options.sample_seed
        if seed is None and repeat == 0:
            return None
        size = split_size(task, data_dir)
        if size is None:
            return None
        rng = random.Random(f"{seed or 0}:{repeat}")
        return sorted(rng.sample(range(size), min(self.options.limit, size)))

    def _evaluate(self, endpoint: Endpoint, role: str, task: str, data_dir: str | None,
                  concurrency: int | None = None, sample: list[int] | None = None) -> EvalRun:
        o = self.options
        return evaluate_endpoint(sample_indices=sample,
            role=role, base_url=endpoint.base_url, served_model_name=endpoint.served_model_name,
            task=task, data_dir=data_dir, limit=o.limit, num_fewshot=o.num_fewshot,
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
        proxy_fault = cell.fault if cell.fault in ("drop-transfer", "foreign-params") else None
        records = self.run_dir / cell.cell_id / "proxy-records.jsonl"
        with plan_pair(cell, **group.deploy_args) as pair:
            port = self.allocator.reserve(1, owner=f"proxy:{cell.cell_id}")[0]
            with ProxyDeployment(pair, port=port, log_dir=self.log_dir, fault=proxy_fault,
                                 records_path=records, allocator=self.allocator) as proxy:
                yield proxy.endpoint()

    def run(self, cells: Sequence[Cell]) -> list[CellResult]:
        """Run every cell; never raises for a cell's failure (it becomes its verdict)."""
        groups: dict[str, list[Cell]] = {}
        for cell in cells:
            groups.setdefault(cell.baseline_key, []).append(cell)
        results: list[CellResult] = []
        for group in groups.values():
            results += self._run_group(group)
        return results

    def _run_group(self, cells: list[Cell]) -> list[CellResult]:
        group = self._plan_group(cells)
        baseline = plan_baseline(group.first, **group.deploy_args)
        launched: list[Deployment] = []
        try:
            first_pair = self._start_baseline_and_first_pair(group, baseline, launched)
            rounds = self._evaluate_baseline(group, baseline)
            results = self._run_pairs(group, baseline, rounds, first_pair, launched)
        except _GroupAborted as aborted:
            return aborted.results
        finally:
            for d in launched:
                d.stop()
        group_total = time.monotonic() - group.started
        for r in results:   # known once the group is done: the records are written again
            r.record["timings"]["group_total_s"] = group_total
            write_record(self.results_root, r.record)
        return results

    def _plan_group(self, cells: list[Cell]) -> _Group:
        first = cells[0]
        model = resolve(first.model)
        hybrid = model.hybrid or first.model in self.hybrid_models
        task = self.options.task if self.options.task != "auto" else default_task(model)
        data_dir = self.options.dataset_dir or default_data_dir(task)
        reference = reference_accuracy(model, task)
        deploy_args = dict(model_path=model.path, hybrid=hybrid, allocator=self.allocator,
                           placement=self.placement, log_dir=self.log_dir, features=self.features,
                           startup_timeout_s=self.options.startup_timeout_s,
                           kv_cache_bytes=self.options.kv_cache_bytes,
                           start_slots=self.start_slots)
        pairs: dict[tuple, list[Cell]] = {}
        for cell in cells:
            pairs.setdefault(pair_key(cell), []).append(cell)
        for members in pairs.values():   # clean cells first: they meet the pair fresh
            members.sort(key=lambda c: c.fault is not None)
        return _Group(cells=cells, pairs=list(pairs.values()), task=task, data_dir=data_dir,
                      hybrid=hybrid, reference=reference, deploy_args=deploy_args,
                      started=time.monotonic())

    def _start_baseline_and_first_pair(self, group: _Group, baseline: Deployment,
                                       launched: list[Deployment]) -> Deployment:
        """Launch the baseline and the first pair together (start-up is the long pole on CPU)
        and wait for the baseline; returns the first pair, still starting."""
        first = group.first
        self.progress(f"starting baseline for {first.model} (block {first.baseline_block_size}) "
                      f"and the first P/D pair")
        first_pair = self._plan_pair(group, 0)
        launched += [baseline, first_pair]
        baseline.launch()
        first_pair.launch()
        waiting = time.monotonic()
        try:
            baseline.wait()
        except ManagedProcessError as exc:
            reason = f"baseline failed to start: {exc}"
            waited = {"startup_s": time.monotonic() - group.started}  # what the attempt cost
            raise _GroupAborted([self._record(c, error(reason, c.expected_failure), timings=waited,
                                              artifacts={"logs": baseline.logs()})
                                 for c in group.cells]) from exc
        group.waited["baseline"] = time.monotonic() - waiting
        return first_pair

    def _evaluate_baseline(self, group: _Group, baseline: Deployment) -> list[_BaselineRound]:
        """Every repeat's baseline evaluation (and A/A re-run), its samples written to disk."""
        base_ep = baseline.baseline_endpoint()
        task, data_dir, key = group.task, group.data_dir, group.first.baseline_key
        repeats = self.options.repeats
        rounds: list[_BaselineRound] = []
        try:
            for r in range(repeats):
                sample = self._sample(task, data_dir, r)
                tag = f" (repeat {r + 1}/{repeats})" if repeats > 1 else ""
                self.progress(f"evaluating baseline ({task}, {self.options.limit} questions){tag}")
                base_run = self._evaluate(base_ep, "baseline", task, data_dir, sample=sample)
                base_aa = None
                if self.options.noise_floor:
                    self.progress("evaluating baseline again at concurrency 1 (A/A noise floor)")
                    base_aa = self._evaluate(base_ep, "baseline-aa", task, data_dir,
                                             concurrency=1, sample=sample)
                run_id = self.run_id if repeats == 1 else f"{self.run_id}-r{r:02d}"
                base_dir = self.results_root / run_id / "baselines"
                samples_path = base_run.write_jsonl(base_dir / f"{key}.jsonl")
                if base_aa is not None:
                    base_aa.write_jsonl(base_dir / f"{key}-aa.jsonl")
                rounds.append(_BaselineRound(run_id, sample, base_run, base_aa, samples_path))
        except Exception as exc:  # noqa: BLE001 - any failure of the baseline is environmental
            reason = f"baseline evaluation failed: {type(exc).__name__}: {exc}"
            raise _GroupAborted([self._record(c, error(reason, c.expected_failure),
                                              artifacts={"logs": baseline.logs()})
                                 for c in group.cells]) from exc
        return rounds

    @staticmethod
    def _plan_pair(group: _Group, index: int) -> Deployment:
        cells = group.pairs[index]
        arm = any(c.fault in SERVER_FAULTS for c in cells)
        return plan_pair(cells[0], **group.deploy_args, arm_faults=arm)

    def _launch_pair(self, group: _Group, index: int,
                     launched: list[Deployment]) -> Deployment | None:
        """Plan and launch the group's pair number `index`; None past the last pair."""
        if index >= len(group.pairs):
            return None
        pair = self._plan_pair(group, index)
        launched.append(pair)
        pair.launch()
        return pair

    def _run_pairs(self, group: _Group, baseline: Deployment, rounds: list[_BaselineRound],
                   first_pair: Deployment, launched: list[Deployment]) -> list[CellResult]:
        """Each pair in turn: wait for it, launch the next one, run its cells on every round."""
        base_samples = rounds[0].samples_path
        baseline_eval_s = sum(b.run.wall_s + (b.aa.wall_s if b.aa else 0.0)
                              for b in rounds) / self.options.repeats
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
                    results.append(self._record(
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
            for cell in cells_of_pair:
                for rnd in rounds:
                    results.append(self._run_cell(
                        cell, pair, rnd, group.task, group.data_dir, group.hybrid,
                        reference=group.reference,
                        timings={"startup_s": max(baseline.startup_s or 0, pair.startup_s or 0),
                                 "startup_wait_s": pair_wait, "baseline_eval_s": baseline_eval_s},
                        baseline_logs=baseline.logs()))
                    pair_wait = 0.0   # the wait is the first cell's; the others found servers up
            pair.stop()
            pair = following
        return results

    def _run_cell(self, cell: Cell, pair: Deployment, rnd: "_BaselineRound", task: str,
                  data_dir: str | None, hybrid: bool, *, timings: dict, reference=None,
                  baseline_logs: dict) -> CellResult:
        base_run, base_aa, base_samples = rnd.run, rnd.aa, rnd.samples_path
        cell_dir = self.results_root / rnd.run_id / cell.cell_id
        records_path = cell_dir / "proxy-records.jsonl"
        proxy_fault = cell.fault if cell.fault in ("drop-transfer", "foreign-params") else None
        port = self.allocator.reserve(1, owner=f"proxy:{cell.cell_id}")[0]
        decode_urls = pair.urls("decode")
        # every evaluation on a shared pair in its own prefix-cache space; a server-side canary's
        # requests name their fault for the decode's plugin (no other request is touched)
        salt = hashlib.sha256(f"{rnd.run_id}/{cell.cell_id}".encode()).hexdigest()[:16]
        artifacts = {"baseline_samples": str(base_samples), "logs": {**baseline_logs, **pair.logs()},
                     "proxy_records": str(records_path)}
        started = time.monotonic()
        try:
            with ProxyDeployment(pair, port=port, log_dir=self.log_dir, fault=proxy_fault,
                                 records_path=records_path, allocator=self.allocator,
                                 request_tag=request_tag_for(cell.fault, cell.fault_env), cache_salt=salt) as proxy:
                artifacts["logs"]["proxy"] = str(proxy.process.log_path)
                before = scrape_all(decode_urls)
                self.progress(f"evaluating P/D {cell.cell_id}")
                pd_run = self._evaluate(proxy.endpoint(), "pd", task, data_dir, sample=rnd.sample)
                after = scrape_all(decode_urls)
        except Exception as exc:  # noqa: BLE001 - the baseline worked, so a P/D failure is FAIL
            lines = []
            for name, proc in pair.processes.items():
                decisive = [l for l in proc.decisive_lines() if "Error" in l or "error" in l]
                if decisive:  # an engine core can die while its API server keeps answering 500
                    state = "running" if proc.is_running() else "died"
                    lines.append(f"{name} ({state}): {most_decisive_line(decisive)}")
            reason = f"P/D evaluation failed: {type(exc).__name__}: {str(exc)[:300]}"
            if lines:
                reason += "; " + "; ".join(lines)
            return self._record(cell, fail(reason, cell.expected_failure, check="pd-requests"),
                                timings={**timings, "pd_eval_s": time.monotonic() - started},
                                artifacts=artifacts, run_id=rnd.run_id)
        pd_samples = pd_run.write_jsonl(cell_dir / "pd-samples.jsonl")
        artifacts["pd_samples"] = str(pd_samples)
        proof = transfer_proof(read_proxy_records(str(records_path)), after.delta(before), hybrid,
                               [str(pair.processes[s.name].log_path) for s in pair.specs
                                if s.role == "decode"])
        cmp = compare(base_run, pd_run, proof, baseline_aa=base_aa, alpha=self.policy.alpha)
        verdict = decide(cmp, self.policy, cell.expected_failure, reference=reference)
        timings = {**timings, "pd_eval_s": pd_run.wall_s,
                   "total_s": timings.get("startup_s", 0) + timings.get("baseline_eval_s", 0) + pd_run.wall_s}
        return self._record(cell, verdict, metrics=cmp.metrics_dict(), timings=timings,
                            artifacts=artifacts, run_id=rnd.run_id)
