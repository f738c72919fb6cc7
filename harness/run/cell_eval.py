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
from dataclasses import replace
from typing import Any, Callable, Sequence

from harness.core.cell import Cell
from harness.core.outcomes import CONTINUE
from harness.eval.lmeval import EvalRun
from harness.eval.metrics import scrape_all
from harness.judge.compare import compare
from harness.judge.verdict import ReferenceAccuracy, decide, error, fail
from harness.run.aa_rerun import BaselineFailed
from harness.run.stages import StagedRun
from harness.run.transfer_evidence import (ByteGeometry, DigestFiles, link_evidence, link_start,
                                           read_proxy_records, transfer_proof)
from harness.serve.deploy import Deployment, ProxyDeployment
from harness.serve.plugins.faults.spec import request_tag_for
from harness.serve.supervision.process import most_decisive_line
from harness.serve.proxy.hops import PROXY_FAULTS


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


def round_policy(runner: Any, rnd: Any) -> tuple[Any, Any]:
    """(plan, policy) of one baseline round: the runner's sequential plan cut to the questions
    the round's order holds, and the policy that looks at those stages."""
    plan = runner.policy.plan.limited_to(rnd.order.capped(runner.policy.plan.budget))
    return plan, replace(runner.policy, stages=plan.stages)


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
    pass needs them; a canary or an expected failure is decided at its first look
    (calibration, 2026-12-02: asked ahead, the P64->D128 XFAIL cell answered 150 questions it
    was never judged on, round after round)."""
    return next_stages if cell.fault is None and cell.expected_failure is None else ()


def noise_floor_for_look(runner: Any, rnd: Any, ask_pd: Callable[[int], None],
                         next_stages: Sequence[int]) -> EvalRun | None:
    """The round's A/A re-run, which a look's judge needs. While it is still running on the
    baseline (harness.run.aa_rerun), the P/D pair is asked the next looks' questions
    (`ask_pd(n)`, at most LOOKS_AHEAD looks): the pair would idle, and an undecided cell needs
    them next. `ask_pd` takes each of those looks' transfer proof when its questions are in."""
    for n in list(next_stages)[:LOOKS_AHEAD]:
        if not rnd.aa_pending():
            break
        runner.progress(f"asking P/D the next look's questions ({n}) while the baseline's "
                        f"A/A re-run finishes")
        ask_pd(n)
    waited = time.monotonic()
    aa = rnd.aa
    if aa is not None and time.monotonic() - waited > 1.0:
        runner.progress(f"waited {time.monotonic() - waited:.0f} s for the A/A re-run")
    return aa


def evaluate_cell(runner: Any, cell: Cell, pair: Deployment, rnd: Any, task: str,
                  data_dir: str | None, hybrid: bool, *, timings: dict,
                  reference: ReferenceAccuracy | None = None, baseline_logs: dict) -> Any:
    """`cell`'s CellResult; `runner` is the harness.run.runner.Runner that started `pair`, `rnd`
    its BaselineRound (this module must not import the runner: the runner imports it)."""
    cell_dir = runner.results_root / rnd.run_id / cell.cell_id
    records_path = cell_dir / "proxy-records.jsonl"
    proxy_fault = cell.fault if cell.fault in PROXY_FAULTS else None
    port = runner.allocator.reserve(1, owner=f"proxy:{cell.cell_id}")[0]
    decode_urls = pair.urls("decode")
    decode_logs = [str(pair.processes[s.name].log_path) for s in pair.specs if s.role == "decode"]
    prefill = next(s for s in pair.specs if s.role == "prefill")
    # the decode reads the prefill's blocks: their dtype is the prefill's KV cache dtype
    geometry = ByteGeometry.of_pair(prefill.model_path, prefill.dtype, prefill.block_size,
                                    prefill.extra_args, prefill.kv_cache_dtype)
    digests = DigestFiles.of_pair(pair)
    artifacts = {"baseline_samples": str(rnd.samples_path),
                 "logs": {**baseline_logs, **pair.logs()}, "proxy_records": str(records_path)}
    # every evaluation on a shared pair in its own prefix-cache space; a server-side canary's
    # requests name their fault for the decode's plugin (no other request is touched)
    salt = evaluation_salt(rnd.run_id, cell.cell_id)
    plan, policy = round_policy(runner, rnd)
    baseline_asked_s = rnd.staged.wall_s
    started = time.monotonic()
    looks: list[dict] = []
    try:
        with ProxyDeployment(pair, port=port, log_dir=runner.log_dir, fault=proxy_fault,
                             records_path=records_path, allocator=runner.allocator,
                             request_tag=request_tag_for(cell.fault, cell.fault_env),
                             cache_salt=salt) as proxy:
            artifacts["logs"]["proxy"] = str(proxy.process.log_path)
            endpoint = proxy.endpoint()
            pd = StagedRun(lambda docs, n: runner.evaluate(endpoint, "pd", task, data_dir,
                                                           sample=docs, limit=n), rnd.order)
            before, link_before = scrape_all(decode_urls), link_start(pair)
            previous_n = None
            proofs: dict[int, Any] = {}   # a look's transfer proof, taken when its P/D answers were in

            def proof_now() -> Any:
                return transfer_proof(read_proxy_records(str(records_path)),
                                      scrape_all(decode_urls).delta(before), hybrid, decode_logs,
                                      geometry, link_evidence(pair, link_before), digests)

            def ask_ahead(n: int) -> None:
                if n not in proofs:
                    pd.up_to(n)
                    proofs[n] = proof_now()

            for i, n in enumerate(plan.stages):
                runner.progress(f"evaluating P/D {cell.cell_id} ({n} questions)")
                pd_run, base_run = both_up_to(pd, rnd.staged, n)
                proof = proofs.pop(n) if n in proofs else proof_now()
                aa = noise_floor_for_look(runner, rnd, ask_ahead,
                                          looks_worth_asking_ahead(cell, plan.stages[i + 1:]))
                cmp = compare(base_run, pd_run, proof, baseline_aa=aa,
                              alpha=runner.policy.alpha)
                verdict = decide(cmp, policy, cell.expected_failure, reference=reference,
                                 previous_n=previous_n)
                if verdict.look is not None:
                    looks.append(verdict.look)
                if verdict.status != CONTINUE:
                    break
                previous_n = cmp.n
    except BaselineFailed as exc:   # the baseline's A/A re-run: environmental, as at its start
        return runner.record(cell, error(str(exc), cell.expected_failure),
                             timings={**timings, "pd_eval_s": time.monotonic() - started},
                             artifacts=artifacts, run_id=rnd.run_id)
    except Exception as exc:  # noqa: BLE001 - the baseline worked, so a P/D failure is FAIL
        reason = f"P/D evaluation failed: {type(exc).__name__}: {str(exc)[:300]}"
        lines = decisive_pair_lines(pair)
        if lines:
            reason += "; " + "; ".join(lines)
        return runner.record(cell, fail(reason, cell.expected_failure, check="pd-requests"),
                             timings={**timings, "pd_eval_s": time.monotonic() - started},
                             artifacts=artifacts, run_id=rnd.run_id)
    artifacts["pd_samples"] = str(pd_run.write_jsonl(cell_dir / "pd-samples.jsonl"))
    rnd.run.write_jsonl(rnd.samples_path)   # the baseline's answers so far, this cell's included
    baseline_more_s = rnd.staged.wall_s - baseline_asked_s
    metrics = {**cmp.metrics_dict(),
               "sequential": {"plan": plan.to_dict(), "looks": looks, "questions": cmp.n}}
    if rnd.aa is not None:   # asked while the pair started and answered: not added to total_s
        timings = {**timings, "baseline_aa_s": rnd.aa.wall_s}
    timings = {**timings, "pd_eval_s": pd.wall_s, "baseline_more_questions_s": baseline_more_s,
               "total_s": (timings.get("startup_s", 0) + timings.get("baseline_eval_s", 0)
                           + baseline_more_s + pd.wall_s)}
    return runner.record(cell, verdict, metrics=metrics, timings=timings, artifacts=artifacts,
                         run_id=rnd.run_id)
