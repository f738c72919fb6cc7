"""Comparison: pairing baseline and P/D answers, and every number the verdict reads."""
from __future__ import annotations

import json
import math

import pytest

from harness.judge.compare import TransferProof, compare, divergences, noise_floor, pair_runs
from harness.eval.lmeval import EvalRun, QuestionRecord, prompt_hash
from harness.eval.metrics import TransferCounters


def logprobs(tokens: list[str], values: list[float]) -> dict:
    """An OpenAI /v1/completions choice's `logprobs` object, top-2 per position."""
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": [{t: v, "<alt>": v - 3.0} for t, v in zip(tokens, values)],
        "text_offset": list(range(len(tokens))),
    }


def question(doc_id: int, correct: bool = True, generated: str | None = None,
             lp: dict | None = None, prompt: str | None = None) -> QuestionRecord:
    answer = "42" if correct else "7"
    return QuestionRecord(
        doc_id=doc_id, prompt_hash=prompt_hash(prompt or f"Question {doc_id}?\nAnswer:"),
        target=f"work...\n#### 42", generated=generated or f"so #### {answer}",
        answer_strict=answer, answer_flexible=answer, correct=correct,
        correct_flexible=correct, finish_reason="stop", logprobs=lp)


def run(questions: list[QuestionRecord], role: str = "baseline") -> EvalRun:
    n = len(questions)
    acc = sum(q.correct for q in questions) / n if n else 0.0
    return EvalRun(role=role, base_url="http://127.0.0.1:1", task="gsm8k_local", n=n,
                   accuracy=acc, accuracy_flexible=acc, wall_s=1.0, questions=tuple(questions))


def good_proof(n: int) -> TransferProof:
    return TransferProof(requests=n, requests_with_params=n, requests_own_params=n,
                         counters=TransferCounters(prompt_tokens_external=100.0 * n,
                                                   kv_bytes=1e5 * n, kv_transfers=n),
                         recompute_allowance=0, requests_sent_params=n)


# ---- pairing --------------------------------------------------------------------------------
def test_pair_runs_pairs_by_doc_in_order():
    a = run([question(2), question(0), question(1)])
    b = run([question(1), question(2), question(0)], "pd")
    pairs, unpaired = pair_runs(a, b)
    assert [qa.doc_id for qa, _ in pairs] == [0, 1, 2]
    assert all(qa.doc_id == qb.doc_id for qa, qb in pairs)
    assert unpaired == 0


def test_pair_runs_counts_mismatched_prompts_and_missing_docs_as_unpaired():
    a = run([question(0), question(1), question(2), question(3)])
    b = run([question(0), question(1, prompt="a different few-shot prompt"), question(2),
             question(9)], "pd")
    pairs, unpaired = pair_runs(a, b)
    assert [qa.doc_id for qa, _ in pairs] == [0, 2]
    assert unpaired == 3          # doc 1 (prompt differs), doc 3 (baseline only), doc 9 (P/D only)


def test_compare_refuses_runs_without_common_questions():
    with pytest.raises(ValueError, match="share no question"):
        compare(run([question(0)]), run([question(1)], "pd"), good_proof(1))


# ---- accuracy numbers -----------------------------------------------------------------------
def test_identical_runs_agree_completely():
    qs = [question(i, correct=i % 4 != 0) for i in range(40)]
    cmp = compare(run(qs), run(qs, "pd"), good_proof(40))
    assert cmp.n == 40 and cmp.unpaired == 0
    assert cmp.baseline_accuracy == cmp.pd_accuracy == 0.75
    assert cmp.accuracy_delta == 0.0
    assert cmp.mcnemar.baseline_only == cmp.mcnemar.pd_only == 0
    assert cmp.mcnemar.p_value == 1.0
    assert cmp.agreement == 1.0 and cmp.generations_differing == 0
    assert cmp.examples == ()
    assert cmp.floor is None and cmp.logprob is None     # no A/A run, no logprobs


def test_discordant_pairs_and_delta():
    base = [question(i, correct=True) for i in range(30)]
    pd = [question(i, correct=i >= 6) for i in range(28)] + [question(28), question(29)]
    cmp = compare(run(base), run(pd, "pd"), good_proof(30))
    assert cmp.mcnemar.baseline_only == 6 and cmp.mcnemar.pd_only == 0
    assert cmp.accuracy_delta == pytest.approx(-0.2)
    assert cmp.mcnemar.p_value == pytest.approx(0.5 ** 6)
    assert cmp.delta_ci.low < -0.2 < cmp.delta_ci.high < 0.0
    assert cmp.generations_differing == 6
    ex = cmp.examples[0]
    assert (ex["doc_id"], ex["baseline_answer"], ex["pd_answer"], ex["target"]) == (0, "42", "7", "42")
    assert len(cmp.examples) == 5                       # capped at max_examples


def test_mde_shrinks_with_n_and_grows_with_aa_discordance():
    small = compare(run([question(i) for i in range(20)]), run([question(i) for i in range(20)]),
                    good_proof(20))
    large = compare(run([question(i) for i in range(200)]), run([question(i) for i in range(200)]),
                    good_proof(200))
    assert large.mde < small.mde
    base = [question(i) for i in range(200)]
    aa = [question(i, correct=i % 10 != 0) for i in range(200)]    # 10% chance discordance
    noisy = compare(run(base), run(base, "pd"), good_proof(200), baseline_aa=run(aa, "baseline-aa"))
    assert noisy.base_discordance == pytest.approx(0.1)
    assert noisy.mde > large.mde


# ---- noise floor ----------------------------------------------------------------------------
def test_noise_floor_counts_aa_differences():
    base = run([question(i) for i in range(10)])
    aa = run([question(i, generated="other words #### 42" if i < 3 else None) for i in range(10)])
    differing, n, discordance, lp = noise_floor(base, aa)
    assert (differing, n, discordance, lp) == (3, 10, 0.0, None)
    assert noise_floor(base, None) == (0, 0, 0.0, None)


def test_floor_test_uses_aa_run():
    base = [question(i) for i in range(50)]
    pd = [question(i, generated=f"changed {i} #### 42") for i in range(50)]   # all differ
    cmp = compare(run(base), run(pd, "pd"), good_proof(50), baseline_aa=run(base, "baseline-aa"))
    assert cmp.floor is not None and cmp.floor.exceeds
    assert (cmp.floor.pd_differing, cmp.floor.aa_differing) == (50, 0)
    assert cmp.agreement == 0.0


# ---- logprobs -------------------------------------------------------------------------------
def test_logprob_divergence_summary_and_example_token():
    toks = ["The", " answer", " is", " 42"]
    base = [question(i, lp=logprobs(toks, [-0.1, -0.2, -0.3, -0.4])) for i in range(5)]
    pd = [question(0, generated="The answer was 7", correct=False,
                   lp=logprobs(["The", " answer", " was", " 7"], [-0.1, -0.25, -2.0, -0.5]))]
    pd += [question(i, lp=logprobs(toks, [-0.1, -0.2, -0.3, -0.4])) for i in range(1, 5)]
    pairs, _ = pair_runs(run(base), run(pd, "pd"))
    divs = divergences(pairs)
    assert set(divs) == {0, 1, 2, 3, 4}
    assert divs[0].first_divergent_index == 2 and divs[1].first_divergent_index is None
    cmp = compare(run(base), run(pd, "pd"), good_proof(5))
    assert cmp.logprob["n_questions"] == 5 and cmp.logprob["n_diverging"] == 1
    assert cmp.logprob["n_aligned_tokens"] == 2 + 4 * 4
    assert cmp.logprob["abs_delta_max"] == pytest.approx(0.05)
    ex = cmp.examples[0]
    assert (ex["first_divergent_token"], ex["baseline_token"], ex["pd_token"]) == (2, " is", " was")
    assert ex["pd_logprob"] == pytest.approx(-2.0)


def test_questions_without_logprobs_are_left_out_of_the_divergence():
    toks = ["a", "b"]
    base = [question(0, lp=logprobs(toks, [-0.1, -0.1])), question(1),
            question(2, lp={"tokens": ["a"], "token_logprobs": [], "top_logprobs": None})]
    pd = [question(0, lp=logprobs(toks, [-0.1, -0.1])), question(1, lp=logprobs(toks, [-1, -1])),
          question(2, lp=logprobs(["a"], [-0.1]))]
    pairs, _ = pair_runs(run(base), run(pd, "pd"))
    assert set(divergences(pairs)) == {0}      # doc 1: baseline has none; doc 2: malformed


def test_metrics_dict_is_json_and_has_record_keys():
    base = [question(i, correct=i % 2 == 0, lp=logprobs(["x"], [-0.5])) for i in range(12)]
    pd = [question(i, correct=i % 2 == 0, lp=logprobs(["x"], [-0.5])) for i in range(12)]
    cmp = compare(run(base), run(pd, "pd"), good_proof(12), baseline_aa=run(base, "baseline-aa"))
    d = json.loads(json.dumps(cmp.metrics_dict(), allow_nan=False))
    for key in ("n", "baseline_accuracy", "pd_accuracy", "accuracy_delta", "delta_ci", "mcnemar_p",
                "discordant", "mde", "agreement", "noise_floor", "logprob", "transfer"):
        assert key in d
    assert d["transfer"]["prompt_tokens_external"] == 1200.0
    assert d["transfer"]["requests_own_params"] == 12
    assert d["transfer"]["prompt_tokens_total"] == 1200.0
    assert d["discordant"] == {"baseline_only": 0, "pd_only": 0}


def test_metrics_dict_turns_infinite_mde_into_null():
    cmp = compare(run([question(0)]), run([question(0)], "pd"), good_proof(1))
    assert math.isinf(cmp.mde)                  # one question can reveal no drop at alpha=0.01
    assert cmp.metrics_dict()["mde"] is None
