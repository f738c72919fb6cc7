"""A deployment the harness did not start (harness.run.deployment_file), judged as one cell.

The flow is the normal one (harness.run.runner, harness.run.evaluation.cell_eval) with the
start-up left out: the baseline endpoint is evaluated (and re-evaluated at concurrency 1 for the
A/A noise floor), the P/D endpoint is asked the same questions look after look
(harness.judge.sequential), the decode (and prefill) /metrics are read before and after the P/D
evaluation for the transfer evidence, and the same Policy decides; the record goes to the usual
results directory.

* ``router: harness-proxy``: the harness starts its own proxy (harness.serve.proxy.app, through
  harness.serve.deploy.ProxyDeployment) in front of the user's prefill and decode servers, so
  every transfer check runs on its per-request records.
* a user router: the checks that read those records are not available; the verdict and the
  record list them as such (neither passed nor failed), and the request count the recompute
  allowance needs comes from the decode servers' ``vllm:request_success_total``.

Tokens: each endpoint's ``auth_env`` is read when a request is made and sent as its
Authorization header; no record, log line or reason holds its value.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.core import exact_headers
from harness.connectors import DEFAULT_KV_CONNECTOR, connector_for
from harness.core.outcomes import CONTINUE
from harness.core.redact import redact, register_secret
from harness.core.reference import ReferenceAccuracy
from harness.eval.lmeval import (DatasetNotFound, EvalRun, evaluate_endpoint, materialize_task,
                                 split_size)
from harness.eval.metrics import TransferCounters, parse_transfer_counters
from harness.eval.task_choice import default_data_dir, default_task
from harness.judge.compare import TransferProof, compare
from harness.judge.verdict import Verdict, decide, error, fail
from harness.run.deployment_file import (AUTO_TASK, Endpoint, ExternalDeployment,
                                         not_available_checks, to_record)
from harness.run.evaluation.cell_eval import evaluation_salt, round_policy
from harness.run.evaluation.aa_rerun import finished
from harness.run.runner import BaselineRound, CellResult, Runner
from harness.run.evaluation.stages import QuestionOrder, StagedRun
from harness.run.evidence.transfer_evidence import read_proxy_records, transfer_proof
from harness.serve.deploy import ProxyDeployment

EXTERNAL_PREFIX = "external-"
DEVICE = "external"          # the record's cell.device / hardware.platform: not this machine's
FALLBACK_TASK = "gsm8k_local"
Evaluate = Callable[..., EvalRun]   # harness.eval.lmeval.evaluate_endpoint's keyword shape


def cell_id_for(name: str) -> str:
    """``external-<name>``, the name reduced to what a file name and a cell id may hold."""
    return EXTERNAL_PREFIX + (re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-.") or "deployment")


@dataclass(frozen=True)
class ExternalCell:
    """What a record, the verdict table, JUnit and the report key on, for a deployment the
    harness did not start: the parts of harness.core.cell.Cell they read (a Cell describes
    servers the harness starts, so this is not one). Nothing is declared about it: no fault,
    no expected failure."""

    name: str
    model: str
    deployment: dict = field(default_factory=dict, compare=False, hash=False)  # to_record(dep)
    device: str = DEVICE
    kv_connector: str = DEFAULT_KV_CONNECTOR     # what its servers use, as the file says
    fault: None = None
    fault_env: tuple = ()
    expected_failure: None = None
    expected_failure_match: None = None

    @classmethod
    def of(cls, dep: ExternalDeployment) -> "ExternalCell":
        return cls(name=dep.name, model=dep.model, kv_connector=dep.kv_connector,
                   deployment=to_record(dep))

    @property
    def cell_id(self) -> str:
        return cell_id_for(self.name)

    @property
    def model_short(self) -> str:
        return self.model.rstrip("/").split("/")[-1]

    @property
    def is_canary(self) -> bool:
        return False

    def to_dict(self) -> dict[str, Any]:
        """The record's "cell": Cell's keys the readers use (server settings unknown: None),
        plus the deployment as the file described it."""
        return {"id": self.cell_id, "model": self.model, "model_tag": None, "device": self.device,
                "runner": None, "backend": None, "prefill_block_size": None,
                "decode_block_size": None, "prefill_tp": None, "decode_tp": None,
                "fault": None, "expected_failure": None, "expected_failure_match": None,
                "extra_args": [], "extra_env": {}, "external": True,
                "deployment": self.deployment}


@dataclass(frozen=True)
class ModelFacts:
    """What the judge needs to know about the served model, when the harness knows it."""

    task: str
    data_dir: str | None
    hybrid: bool                       # recompute allowance: 1 prompt token per request
    reference: ReferenceAccuracy | None   # the zoo card's accuracy (baseline health)


def model_facts(dep: ExternalDeployment, dataset_dir: str | None = None) -> ModelFacts:
    """A zoo model served under its zoo name gets its task, card and kind; a model of the
    default matrix its kind; anything else is dense, on GSM8K, with no reference."""
    from harness.matrix import load_matrix
    from harness.serve.launch.models import reference_accuracy, resolve
    from harness.zoo import registry

    model = resolve(dep.model) if dep.model in registry.zoo_names() else None
    if dep.task != AUTO_TASK:
        task = dep.task
    else:
        task = default_task(model) if model is not None else FALLBACK_TASK
    hybrid = bool(model and model.hybrid) or load_matrix().models.get(dep.model).is_hybrid
    return ModelFacts(task=task, data_dir=dataset_dir or default_data_dir(task), hybrid=hybrid,
                      reference=reference_accuracy(model, task) if model is not None else None)


def task_problem(facts: ModelFacts) -> str | None:
    """One line when the task's documents are not on this machine (before any question)."""
    with tempfile.TemporaryDirectory(prefix="pd-accuracy-task-") as tmp:
        try:
            materialize_task(facts.task, facts.data_dir, Path(tmp))
        except DatasetNotFound as exc:
            return str(exc)
    return None


# ---- /metrics --------------------------------------------------------------------------------
def scrape(endpoints: Iterable[Endpoint], environ: Mapping[str, str], timeout_s: float,
           kv_connector: str = DEFAULT_KV_CONNECTOR, role: str = "decode") -> TransferCounters:
    """The transfer counters summed over `endpoints` (full /metrics URLs, with their auth), as
    servers of `role` of a pair of `kv_connector` expose them."""
    total = asdict(TransferCounters())
    for endpoint in endpoints:
        response = exact_headers.get(endpoint.url, headers=endpoint.headers(environ),
                                     timeout=timeout_s)
        response.raise_for_status()
        counters = parse_transfer_counters(response.text, connector_for(kv_connector).metrics, role)
        for key, value in asdict(counters).items():
            total[key] += value
    return TransferCounters(**total)


def scrape_both(dep: ExternalDeployment, environ: Mapping[str, str]) -> TransferCounters:
    """The pair's counters: the decode pages, plus the counters the connector puts on the
    prefill (a push connector's writes) from its pages, where the file names them."""
    decode = scrape(dep.decode_metrics, environ, dep.timeout_s, dep.kv_connector)
    if not connector_for(dep.kv_connector).metrics.counters_from("prefill"):
        return decode
    return decode.plus(scrape(dep.prefill_metrics, environ, dep.timeout_s, dep.kv_connector,
                              "prefill"))


def router_proof(delta: TransferCounters, hybrid: bool) -> TransferProof:
    """A user router's transfer evidence: the decode /metrics delta only. The request count (for
    the recompute allowance) is what the decode servers finished; the per-request fields stay 0
    and their checks are left out (not_available_checks)."""
    return TransferProof(requests=int(delta.requests_finished), requests_with_params=0,
                         requests_own_params=0, counters=delta,
                         recompute_allowance=1 if hybrid else 0, requests_sent_params=0,
                         byte_account_skipped="an external router: no per-request transfer "
                                              "params to count the expected bytes from")


PROXY_RECORD_FIELDS = ("requests_with_params", "requests_own_params", "requests_sent_params")


# ---- the run ---------------------------------------------------------------------------------
class ExternalRun:
    """One deployment's evaluation rounds (one per --repeats), records written by `runner`."""

    def __init__(self, dep: ExternalDeployment, runner: Runner, *,
                 environ: Mapping[str, str] = os.environ, evaluate: Evaluate | None = None,
                 facts: ModelFacts | None = None) -> None:
        self.dep, self.runner, self.environ = dep, runner, environ
        self._evaluate = evaluate or evaluate_endpoint
        self.cell = ExternalCell.of(dep)
        self.facts = facts or model_facts(dep, runner.options.dataset_dir)
        self.not_available = not_available_checks(dep)
        for name in _auth_envs(dep):
            register_secret(environ.get(name))   # any length: harness.core.redact

    def run(self) -> list[CellResult]:
        repeats = self.runner.options.repeats
        size = split_size(self.facts.task, self.facts.data_dir)
        results = []
        for r in range(repeats):
            run_id = self.runner.run_id if repeats == 1 else f"{self.runner.run_id}-r{r:02d}"
            order = QuestionOrder.for_repeat(size, self.runner.options.sample_seed, r)
            tag = f" (repeat {r + 1}/{repeats})" if repeats > 1 else ""
            results.append(self.one_round(run_id, order, tag))
        return results

    @staticmethod
    def redact(text: str) -> str:
        return redact(text)

    def ask(self, endpoint: Endpoint | str, role: str, docs: list[int] | None, n: int,
            headers: Mapping[str, str], concurrency: int | None = None) -> EvalRun:
        o = self.runner.options
        return self._evaluate(
            role=role, base_url=endpoint if isinstance(endpoint, str) else endpoint.url,
            served_model_name=self.dep.model, task=self.facts.task, data_dir=self.facts.data_dir,
            limit=n, sample_indices=docs, num_fewshot=o.num_fewshot, seed=o.seed,
            concurrency=concurrency or o.concurrency, top_logprobs=o.top_logprobs,
            max_gen_toks=o.max_gen_toks, timeout_s=o.request_timeout_s, work_dir=None,
            headers=headers)

    def record(self, verdict: Verdict, run_id: str, **parts: Any) -> CellResult:
        verdict = replace(verdict, reason=self.redact(verdict.reason),
                          checks=tuple(replace(c, detail=self.redact(c.detail))
                                       for c in verdict.checks),
                          not_available=tuple(self.not_available.values()))
        return self.runner.record(self.cell, verdict, run_id=run_id, **parts)

    # -- the baseline ---------------------------------------------------------------------------
    def one_round(self, run_id: str, order: QuestionOrder, tag: str = "") -> CellResult:
        o, dep, progress = self.runner.options, self.dep, self.runner.progress
        base_dir = self.runner.results_root / run_id / "baselines"
        started = time.monotonic()
        try:
            headers = dep.baseline.headers(self.environ)
            staged = StagedRun(lambda docs, n: self.ask(dep.baseline, "baseline", docs, n, headers),
                               order)
            progress(f"evaluating baseline {dep.baseline.url} ({self.facts.task}, {o.limit} "
                     f"questions){tag}")
            base_run = staged.up_to(o.limit)
            aa = None
            if o.noise_floor:
                progress("evaluating baseline again at concurrency 1 (A/A noise floor)")
                aa = self.ask(dep.baseline, "baseline-aa", order.docs(0, o.limit), o.limit,
                              headers, concurrency=1)
                aa.write_jsonl(base_dir / f"{self.cell.cell_id}-aa.jsonl")
            samples = base_run.write_jsonl(base_dir / f"{self.cell.cell_id}.jsonl")
        except Exception as exc:  # noqa: BLE001 - the baseline failing is environmental
            return self.record(error(f"baseline evaluation failed: {type(exc).__name__}: "
                                     f"{str(exc)[:300]}"), run_id,
                               timings={"baseline_eval_s": time.monotonic() - started})
        rnd = BaselineRound(run_id, order, staged, finished(aa), samples)
        baseline_eval_s = base_run.wall_s + (aa.wall_s if aa else 0.0)
        return self.pd_looks(rnd, {"startup_s": 0.0, "baseline_eval_s": baseline_eval_s})

    # -- the P/D endpoint, look after look --------------------------------------------------------
    @contextlib.contextmanager
    def pd_url(self, records_path: Path, salt: str, artifacts: dict) -> Iterator[str]:
        """Where the P/D questions go: the user's router, or the harness proxy started here."""
        if self.dep.router is not None:
            yield self.dep.router.url
            return
        runner = self.runner
        port = runner.allocator.reserve(1, owner=f"proxy:{self.cell.cell_id}")[0]
        artifacts["proxy_records"] = str(records_path)
        # the proxy passes the incoming Authorization on only when the file named pd.auth_env
        with ProxyDeployment(_Upstreams(self.dep), port=port, log_dir=runner.log_dir, fault=None,
                             records_path=records_path, allocator=runner.allocator,
                             cache_salt=salt, kv_connector=self.dep.kv_connector,
                             forward_authorization=self.dep.pd_endpoint.auth_env is not None) as proxy:
            artifacts["logs"]["proxy"] = str(proxy.process.log_path)
            yield proxy.base_url

    def proof(self, records_path: Path, delta: TransferCounters) -> TransferProof:
        if self.dep.router is not None:
            return router_proof(delta, self.facts.hybrid)
        return transfer_proof(read_proxy_records(str(records_path)), delta, self.facts.hybrid, [])

    def pd_looks(self, rnd: BaselineRound, timings: dict) -> CellResult:
        runner, dep, cell = self.runner, self.dep, self.cell
        cell_dir = runner.results_root / rnd.run_id / cell.cell_id
        records_path = cell_dir / "proxy-records.jsonl"
        artifacts: dict[str, Any] = {"baseline_samples": str(rnd.samples_path), "logs": {}}
        salt = evaluation_salt(rnd.run_id, cell.cell_id)
        plan, policy = round_policy(runner.policy, rnd.order)
        baseline_asked_s = rnd.staged.wall_s
        started = time.monotonic()
        looks: list[dict] = []
        prefill_delta = None
        try:
            headers = dep.pd_endpoint.headers(self.environ)
            with self.pd_url(records_path, salt, artifacts) as url:
                pd = StagedRun(lambda docs, n: self.ask(url, "pd", docs, n, headers), rnd.order)
                before = scrape_both(dep, self.environ)
                prefill_before = scrape(dep.prefill_metrics, self.environ, dep.timeout_s)
                previous_n = None
                for n in plan.stages:
                    runner.progress(f"evaluating P/D {cell.cell_id} at {url} ({n} questions)")
                    pd_run, base_run = pd.up_to(n), rnd.staged.up_to(n)
                    delta = scrape_both(dep, self.environ).delta(before)
                    cmp = compare(base_run, pd_run, self.proof(records_path, delta),
                                  baseline_aa=rnd.aa, alpha=policy.alpha)
                    verdict = decide(cmp, policy, None, reference=self.facts.reference,
                                     previous_n=previous_n, not_available=self.not_available)
                    if verdict.look is not None:
                        looks.append(verdict.look)
                    if verdict.status != CONTINUE:
                        break
                    previous_n = cmp.n
                if dep.prefill_metrics:
                    prefill_delta = scrape(dep.prefill_metrics, self.environ,
                                           dep.timeout_s).delta(prefill_before)
        except Exception as exc:  # noqa: BLE001 - the baseline answered, so this is P/D's failure
            reason = f"P/D evaluation failed: {type(exc).__name__}: {str(exc)[:300]}"
            return self.record(fail(reason, check="pd-requests"), rnd.run_id,
                               timings={**timings, "pd_eval_s": time.monotonic() - started},
                               artifacts=artifacts)
        artifacts["pd_samples"] = str(pd_run.write_jsonl(cell_dir / "pd-samples.jsonl"))
        rnd.run.write_jsonl(rnd.samples_path)   # the baseline's answers so far, more looks included
        baseline_more_s = rnd.staged.wall_s - baseline_asked_s
        metrics = {**cmp.metrics_dict(),
                   "sequential": {"plan": plan.to_dict(), "looks": looks, "questions": cmp.n},
                   "prefill_transfer": prefill_delta.to_dict() if prefill_delta else None}
        if dep.router is not None:
            metrics["transfer"].update({k: None for k in PROXY_RECORD_FIELDS})
            metrics["transfer"]["requests_counted_by"] = "decode /metrics: vllm:request_success_total"
        timings = {**timings, "pd_eval_s": pd.wall_s, "baseline_more_questions_s": baseline_more_s,
                   "total_s": timings["baseline_eval_s"] + baseline_more_s + pd.wall_s}
        return self.record(verdict, rnd.run_id, metrics=metrics, timings=timings,
                           artifacts=artifacts)


class _Upstreams:
    """What ProxyDeployment reads of a pair: the prefill and decode URLs it routes between."""

    def __init__(self, dep: ExternalDeployment) -> None:
        self._urls = {"prefill": [e.url for e in dep.prefill], "decode": [e.url for e in dep.decode]}

    def urls(self, role: str) -> list[str]:
        return list(self._urls[role])


def _auth_envs(dep: ExternalDeployment) -> set[str]:
    endpoints = [dep.baseline, *([dep.router] if dep.router else []), *dep.prefill, *dep.decode,
                 *dep.decode_metrics, *dep.prefill_metrics]
    return {e.auth_env for e in endpoints if e.auth_env}


def run_external(dep: ExternalDeployment, runner: Runner, *,
                 environ: Mapping[str, str] = os.environ,
                 facts: ModelFacts | None = None) -> list[CellResult]:
    """Judge `dep` (already pre-flighted: harness.run.deployment_file.check_endpoints) as one
    cell; one CellResult per repeat."""
    return ExternalRun(dep, runner, environ=environ, facts=facts).run()


__all__ = ["EXTERNAL_PREFIX", "ExternalCell", "ExternalRun", "ModelFacts", "cell_id_for",
           "model_facts", "router_proof", "run_external", "scrape", "task_problem"]
