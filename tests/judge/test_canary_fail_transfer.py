"""The fail-transfer canary's verdict: a failed read FAILs for a named reason (the failed-transfer
counter, or vLLM's error answer), is CAUGHT only for those, and a clean cell on the same pair
whose window saw no failed transfer is not touched."""
from __future__ import annotations

import dataclasses

import pytest

from harness.core.outcomes import CAUGHT, ERROR, FAIL, MISSED, PASS
from harness.eval.lmeval import EvalRun, QuestionRecord, RequestsFailed, prompt_hash
from harness.eval.metrics import TransferCounters
from harness.judge.canaries import canary_outcome
from harness.judge.compare import TransferProof, compare
from harness.judge.verdict import decide, error, fail

N = 200   # a clean cell PASSes at this look


def run(role: str, wrong: int = 0) -> EvalRun:
    questions = tuple(
        QuestionRecord(doc_id=i, prompt_hash=prompt_hash(f"Q{i}"), target="#### 42",
                       generated=f"#### {7 if i < wrong else 42}",
                       answer_strict="7" if i < wrong else "42",
                       answer_flexible="7" if i < wrong else "42",
                       correct=i >= wrong, correct_flexible=i >= wrong) for i in range(N))
    return EvalRun(role=role, base_url="u", task="t", n=N, accuracy=(N - wrong) / N,
                   accuracy_flexible=0.0, wall_s=0.0, questions=questions)


def proof(n: int = N, requests_sent_params: int = N, **counters: float) -> TransferProof:
    base = dict(prompt_tokens_external=120.0 * n, kv_bytes=1e5 * n, kv_transfers=float(n))
    return TransferProof(requests=n, requests_with_params=n, requests_own_params=n,
                         counters=TransferCounters(**{**base, **counters}),
                         recompute_allowance=0, requests_sent_params=requests_sent_params)


def comparison(n: int = N, *, pd_wrong: int = 0, transfer: TransferProof | None = None):
    return compare(run("baseline"), run("pd", pd_wrong), transfer or proof(n))


def failed_read_proof(failed: int, recomputed_tokens: float) -> TransferProof:
    """/metrics after `failed` reads failed under kv_load_failure_policy "recompute": counted
    by NIXL, the prompts computed by the decode itself, every answer correct."""
    return proof(N, failed_transfers=float(failed), prompt_tokens_local=recomputed_tokens)


def test_recomputed_failed_reads_fail_for_the_failed_transfers_not_the_recompute():
    v = decide(comparison(N, transfer=failed_read_proof(30, 30 * 120.0)))
    assert v.status == FAIL
    assert v.reason.startswith("transfer proof failed [no-failed-transfers]: failed transfers=30")
    assert dataclasses.replace(v, canary="fail-transfer").outcome == CAUGHT
    # the same verdict is not what dropping the params looks like, nor a broken block
    assert dataclasses.replace(v, canary="drop-transfer").outcome == MISSED
    assert dataclasses.replace(v, canary="corrupt-block").outcome == MISSED


def test_drop_transfer_still_fails_as_a_recompute():
    v = decide(comparison(N, transfer=proof(N, requests_sent_params=0, prompt_tokens_external=0.0,
                                            kv_bytes=0.0, prompt_tokens_local=120.0 * N)))
    assert v.reason.startswith("decode recomputed the prompt")
    assert dataclasses.replace(v, canary="drop-transfer").outcome == CAUGHT
    assert dataclasses.replace(v, canary="fail-transfer").outcome == MISSED


def test_the_clean_cell_sharing_the_pair_is_unaffected():
    v = decide(comparison(N))                    # its window: 0 failed transfers
    assert v.status == PASS
    assert next(c for c in v.checks if c.name == "no-failed-transfers").passed


def pd_requests_failed(failures: list[str], questions: int = 50) -> str:
    """The reason harness.run.evaluation.cell_eval gives when the P/D evaluation raised."""
    exc = RequestsFailed(failures, questions)
    return f"P/D evaluation failed: {type(exc).__name__}: {str(exc)[:300]}"


@pytest.mark.parametrize("failures,outcome", [
    (["HTTP 500 Internal Server Error"] * 7, CAUGHT),     # policy "fail": vLLM 0.32's answer
    (['finish_reason "error"'], CAUGHT),                  # an error answered with HTTP 200
    (["HTTP 502 Bad Gateway"] * 7, MISSED),               # the decode died: not this fault
])
def test_error_answers_are_caught_only_when_vllm_gave_them(failures, outcome):
    verdict = fail(pd_requests_failed(failures), check="pd-requests")
    assert verdict.status == FAIL
    assert dataclasses.replace(verdict, canary="fail-transfer").outcome == outcome


def test_anything_else_is_missed_and_a_broken_baseline_is_error():
    lower = decide(comparison(N, pd_wrong=40))
    assert lower.status == FAIL and lower.reason.startswith("P/D accuracy is lower")
    assert canary_outcome("fail-transfer", lower.status, lower.reason) == MISSED
    assert canary_outcome("fail-transfer", PASS, "upper bound 1.0 pts <= 5 pts") == MISSED
    broken = error("baseline evaluation failed: RequestsFailed: requests failed on 50 of 50 "
                   "questions: HTTP 500 Internal Server Error x50")
    assert dataclasses.replace(broken, canary="fail-transfer").outcome == ERROR
