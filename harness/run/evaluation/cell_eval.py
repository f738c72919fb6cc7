"""One cell on its running pair: the P/D evaluation behind the harness's proxy, look after look,
until the judge decides (harness.judge.sequential), then its record.

Each look asks the next stage's questions of the P/D pair and, at the same time, when this cell
is the first of its group to need them, of the baseline (its server is still up); the transfer evidence is
cumulative: one proxy, one records file and one /metrics delta over all looks.
"""
from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from harness.core.cell import Cell
from harness.core.outcomes import CONTINUE
from harness.eval.lmeval import EvalRun
from harness.eval.metrics import TransferCounters
from harness.judge.compare import Comparison, TransferProof, compare
from harness.judge.sequential import SequentialPlan
from harness.judge.verdict import Policy, Verdict, decide, error, fail
from harness.run.evaluation.aa_rerun import BaselineFailed
from harness.run.evidence.effective_config_evidence import record_judged
from harness.run.plan.group_plan import GroupPlan
from harness.run.record import CellResult, Recorder
from harness.run.evaluation.stages import BaselineRound, EndpointAsker, QuestionOrder, StagedRun
from harness.run.evidence.transfer_evidence import (ByteGeometry, DigestFiles,
                                                    decode_instance_counters, instance_counts,
                                                    link_evidence, link_start, pair_counters,
                                                    pair_instances, read_proxy_records,
                                                    transfer_proof)
from harness.connectors import connector_for
from harness.serve.deploy import DeployContext, Deployment, Endpoint, ProxyDeployment
from harness.serve.launch.server_spec import draft_model_path
from harness.serve.launch.vllm_features import hooks_not_available
from harness.protocol.faults import request_tag_for
from harness.serve.supervision.process import most_decisive_line
from harness.serve.proxy.hops import PROXY_FAULTS
from harness.weathers import DEFAULT_WEATHER
from harness.judge.weather import WeatherJudgement
from harness.run.weather_eval import WeatherWitness, answered_only, weather_plan

Progress = Callable[[str], None]


def decisive_pair_lines(pair: Deployment) -> list[str]:
    """The error line of every pair server that logged one (an engine core can die while its
    API server keeps answering 500)."""
    lines = []
    for name, proc in pair.processes.items():
        decisive = [line for line in proc.decisive_lines() if "Error" in line or "error" in line]
        if decisive:
            state = "running" if proc.is_running() else "died"
            lines.append(f"{name} ({state}): {most_decisive_line(decisive)}")
    return lines


def evaluation_salt(run_id: str, cell_id: str) -> str:
    """The cache_salt of one cell's P/D evaluation: its own prefix-cache space on shared servers."""
    return hashlib.sha256(f"{run_id}/{cell_id}".encode()).hexdigest()[:16]


def round_policy(policy: Policy, order: QuestionOrder) -> tuple[SequentialPlan, Policy]:
    """(plan, policy) of one baseline round: the run's sequential plan cut to the questions
    the round's order holds, and the policy that looks at those stages."""
    plan = policy.plan.limited_to(order.capped(policy.plan.budget))
    return plan, replace(policy, stages=plan.stages)


def both_up_to(pd: StagedRun, baseline: StagedRun, n: int) -> tuple[EvalRun, EvalRun]:
    """A look's answers: the P/D pair's and the baseline's first `n` questions, asked at the
    same time. They are different servers (on CPU the baseline shares the prefill's core, the
    decode has its own): asked one after the other, the decode's core idled while the baseline
    answered its next questions. Each server still gets the same requests, `concurrency` at a
    time, as before."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pd-look") as pool:
        pd_answers = pool.submit(pd.up_to, n)
        try:
            base_run = baseline.up_to(n)
        finally:
            pd_run = pd_answers.result()   # a P/D error is raised first: it is what the cell is about
    return pd_run, base_run


# looks the pair may answer ahead while the A/A re-run runs: a clean 100 %-vs-100 % cell passes
# at its third look (n = 200 at --limit 50), so two looks ahead are work it needs anyway; a third
# would ask 200 more questions that a passing cell never uses
LOOKS_AHEAD = 2


def looks_worth_asking_ahead(cell: Cell, next_stages: Sequence[int]) -> Sequence[int]:
    """The later looks a cell may be asked while the A/A re-run runs: only a cell expected to
    pass needs them; a canary or an expected failure is decided at its first look, and asked
    ahead it would answer questions it is never judged on (docs/startup.md)."""
    return (next_stages if cell.fault is None and cell.expected_failure is None
            and cell.weather == DEFAULT_WEATHER else ())


def noise_floor_for_look(progress: Progress, rnd: BaselineRound, ask_pd: Callable[[int], None],
                         next_stages: Sequence[int]) -> EvalRun | None:
    """The round's A/A re-run, which a look's judge needs. While it is still running on the
    baseline (harness.run.evaluation.aa_rerun), the P/D pair is asked the next looks' questions
    (`ask_pd(n)`, at most LOOKS_AHEAD looks): the pair would idle, and an undecided cell needs
    them next. `ask_pd` takes each of those looks' transfer proof when its questions are in."""
    for n in list(next_stages)[:LOOKS_AHEAD]:
        if not rnd.aa_pending():
            break
        progress(f"asking P/D the next look's questions ({n}) while the baseline's "
                        f"A/A re-run finishes")
        ask_pd(n)
    waited = time.monotonic()
    aa = rnd.aa
    if aa is not None and time.monotonic() - waited > 1.0:
        progress(f"waited {time.monotonic() - waited:.0f} s for the A/A re-run")
    return aa


class TransferWitness:
    """A pair's transfer evidence for one cell: where it is read from (gathered once), and its
    proof so far: the proxy's records and the decode's /metrics delta since `start()`."""

    def __init__(self, pair: Deployment, records_path: Path, hybrid: bool) -> None:
        self.pair, self.records_path, self.hybrid = pair, records_path, hybrid
        self.decode_logs = [str(pair.processes[s.name].log_path) for s in pair.specs
                            if s.role == "decode"]
        prefill = next(s for s in pair.specs if s.role == "prefill")
        # the decode reads the prefill's blocks: their dtype is the prefill's KV cache dtype
        self.geometry = ByteGeometry.of_pair(prefill.model_path, prefill.dtype,
                                             prefill.block_size, prefill.extra_args,
                                             prefill.kv_cache_dtype, draft_model_path(prefill))
        self.digests = DigestFiles.of_pair(pair)
        self.before: TransferCounters | None = None
        self.link_before: tuple[int, int] | None = None
        self.instances_before: dict[str, TransferCounters] = {}

    def start(self) -> "TransferWitness":
        """The counters the proof is a delta from: taken once the cell's proxy is up."""
        self.before, self.link_before = pair_counters(self.pair), link_start(self.pair)
        self.instances_before = decode_instance_counters(self.pair)
        return self

    def proof(self, records: list[dict] | None = None) -> TransferProof:
        """The proof over the proxy's records so far (or `records`: a weather cell's answered)."""
        assert self.before is not None, "start() first"
        if records is None:
            records = read_proxy_records(str(self.records_path))
        per_decode = {url: now.delta(self.instances_before[url])
                      for url, now in decode_instance_counters(self.pair).items()
                      if url in self.instances_before}
        return transfer_proof(records,
                              pair_counters(self.pair).delta(self.before), self.hybrid,
                              self.decode_logs, self.geometry,
                              link_evidence(self.pair, self.link_before), self.digests,
                              instance_counts(records, pair_instances(self.pair), per_decode))


@dataclass(frozen=True)
class Decided:
    """A cell's last look: the P/D answers, the comparison and verdict, every look's summary."""

    pd: StagedRun
    pd_run: EvalRun
    comparison: Comparison
    verdict: Verdict
    looks: list[dict]
    weather: WeatherJudgement | None = None


@dataclass(frozen=True)
class CellEvaluator:
    """Evaluates one cell on its running pair, look after look, and records its verdict."""

    policy: Policy
    deploy: DeployContext
    results_root: Path
    ask: EndpointAsker
    recorder: Recorder
    progress: Progress

    def evaluate(self, cell: Cell, pair: Deployment, rnd: BaselineRound, group: GroupPlan, *,
                 timings: dict, baseline_logs: dict) -> CellResult:
        """`cell`'s CellResult on `pair`, judged against the baseline round `rnd`."""
        cell_dir = self.results_root / rnd.run_id / cell.cell_id
        records_path = cell_dir / "proxy-records.jsonl"
        artifacts = {"baseline_samples": str(rnd.samples_path),
                     "logs": {**baseline_logs, **pair.logs()}, "proxy_records": str(records_path)}
        plan, policy = round_policy(self.policy, rnd.order)
        baseline_asked_s = rnd.staged.wall_s
        witness = TransferWitness(pair, records_path, group.hybrid)
        weather = (None if cell.weather == DEFAULT_WEATHER else
                   WeatherWitness(cell, pair, records_path, witness.digests))
        if weather is not None:
            plan = weather_plan(plan, weather.workload.min_questions)
            policy = replace(policy, stages=plan.stages)
        started = time.monotonic()
        pair.empty_shared_dirs()     # a pair's earlier cell saved these prompts' KV already
        try:
            with self._proxy(cell, pair, rnd, records_path,
                             weather.workload.request_tag if weather is not None else None) as proxy:
                artifacts["logs"]["proxy"] = str(proxy.process.log_path)
                witness.start()
                if weather is not None:
                    weather.start(proxy.base_url)
                decided = self._looks(cell, proxy.endpoint(), rnd, group, witness, plan, policy,
                                      weather)
        except BaselineFailed as exc:   # the baseline's A/A re-run: environmental, as at its start
            verdict = error(str(exc), cell.expected_failure)
        except Exception as exc:  # noqa: BLE001 - the baseline worked, so a P/D failure is FAIL
            verdict = fail(pd_failure_reason(exc, pair), cell.expected_failure, check="pd-requests")
        else:
            return self._record_decided(cell, rnd, decided, plan, timings, artifacts,
                                        baseline_asked_s, cell_dir)
        return record_judged(self.recorder, cell, verdict, artifacts=artifacts, run_id=rnd.run_id,
                             timings={**timings, "pd_eval_s": time.monotonic() - started})

    def _proxy(self, cell: Cell, pair: Deployment, rnd: BaselineRound,
               records_path: Path, weather_tag: str | None = None) -> ProxyDeployment:
        """The cell's own proxy in front of `pair`. Every evaluation on a shared pair gets its
        own prefix-cache space; a server-side canary's requests name their fault for the
        decode's plugin (no other request is touched); else a weather's tag (`weather_tag`,
        Workload.request_tag) names the requests its server-side plugin acts on."""
        port = self.deploy.allocator.reserve(1, owner=f"proxy:{cell.cell_id}")[0]
        return ProxyDeployment(pair, port=port, log_dir=self.deploy.log_dir,
                               fault=cell.fault if cell.fault in PROXY_FAULTS else None,
                               records_path=records_path, allocator=self.deploy.allocator,
                               request_tag=(request_tag_for(cell.fault, cell.fault_env)
                                            or weather_tag or ""),
                               cache_salt=evaluation_salt(rnd.run_id, cell.cell_id),
                               kv_connector=cell.kv_connector)

    def _looks(self, cell: Cell, endpoint: Endpoint, rnd: BaselineRound, group: GroupPlan,
               witness: TransferWitness, plan: SequentialPlan, policy: Policy,
               weather: WeatherWitness | None = None) -> Decided:
        """Look after look until the judge decides (or the plan's last look)."""
        in_flight = weather.workload.in_flight if weather is not None else None
        pd = StagedRun(lambda docs, n: self.ask(endpoint, "pd", group.task, group.data_dir,
                                                sample=docs, limit=n, concurrency=in_flight,
                                                keep_failures=weather is not None), rnd.order)
        proofs: dict[int, TransferProof] = {}   # a look's proof, taken when its P/D answers were in

        def ask_ahead(n: int) -> None:
            if n not in proofs:
                pd.up_to(n)
                proofs[n] = witness.proof()

        previous_n = None
        # checks the cell's connector cannot be held to (no params, no counters): said, not passed
        not_available = {**hooks_not_available(),
                         **connector_for(cell.kv_connector).not_available_lines()}
        looks: list[dict] = []
        judgement = None
        random = group.load_format == "dummy"
        for i, n in enumerate(plan.stages):
            self.progress(f"evaluating P/D {cell.cell_id} ({n} questions)")
            pd_run, base_run = both_up_to(pd, rnd.staged, n)
            if weather is not None:   # judged per request; the aggregates on the 200s only
                asked = pd_run     # its samples keep the failed questions too
                judgement = weather.judge(pd_run, base_run)
                proof = witness.proof(weather.answered_records(pd_run))
                answered = {q.doc_id for q in pd_run.questions if q.error is None}
                pd_run, base_run = answered_only(pd_run, answered), answered_only(base_run, answered)
            else:
                proof = proofs.pop(n) if n in proofs else witness.proof()
            # a random-weight cell is decided at its first look: no questions asked ahead
            ahead = () if random else looks_worth_asking_ahead(cell, plan.stages[i + 1:])
            aa = noise_floor_for_look(self.progress, rnd, ask_ahead, ahead)
            cmp = compare(base_run, pd_run, proof, baseline_aa=aa, alpha=self.policy.alpha,
                          hybrid=group.hybrid)
            verdict = decide(cmp, policy, cell.expected_failure, reference=group.reference,
                             previous_n=previous_n, random_weights=random, weather=judgement,
                             not_available=not_available)
            if verdict.look is not None:
                looks.append(verdict.look)
            if verdict.status != CONTINUE:
                break
            previous_n = cmp.n
        return Decided(pd, pd_run if weather is None else asked, cmp, verdict, looks, judgement)

    def _record_decided(self, cell: Cell, rnd: BaselineRound, decided: Decided,
                        plan: SequentialPlan, timings: dict, artifacts: dict,
                        baseline_asked_s: float, cell_dir: Path) -> CellResult:
        """The decided cell's record: its samples, the baseline's so far, metrics and timings."""
        artifacts["pd_samples"] = str(decided.pd_run.write_jsonl(cell_dir / "pd-samples.jsonl"))
        rnd.run.write_jsonl(rnd.samples_path)   # the baseline's answers so far, this cell's included
        baseline_more_s = rnd.staged.wall_s - baseline_asked_s
        cmp, pd_s = decided.comparison, decided.pd.wall_s
        metrics = {**cmp.metrics_dict(),
                   "sequential": {"plan": plan.to_dict(), "looks": decided.looks,
                                  "questions": cmp.n}}
        if decided.weather is not None:   # every request's row: status, digest, answer, events
            metrics["weather"] = decided.weather.to_dict()
        if rnd.aa is not None:   # asked while the pair started and answered: not added to total_s
            timings = {**timings, "baseline_aa_s": rnd.aa.wall_s}
        timings = {**timings, "pd_eval_s": pd_s, "baseline_more_questions_s": baseline_more_s,
                   "total_s": (timings.get("startup_s", 0) + timings.get("baseline_eval_s", 0)
                               + baseline_more_s + pd_s)}
        return record_judged(self.recorder, cell, decided.verdict, metrics=metrics,
                             timings=timings, artifacts=artifacts, run_id=rnd.run_id)


def pd_failure_reason(exc: Exception, pair: Deployment) -> str:
    """A P/D evaluation's failure, with the decisive line of every pair server that logged one."""
    reason = f"P/D evaluation failed: {type(exc).__name__}: {str(exc)[:300]}"
    lines = decisive_pair_lines(pair)
    return reason + ("; " + "; ".join(lines) if lines else "")
