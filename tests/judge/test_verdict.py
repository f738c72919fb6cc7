"""Decision rules: each one both ways, on Comparisons built from synthetic runs."""
from __future__ import annotations

import dataclasses

import pytest

from harness.judge.compare import Comparison, TransferProof, compare
from harness.eval.lmeval import EvalRun, QuestionRecord, prompt_hash
from harness.eval.metrics import TransferCounters
from harness.core.outcomes import (CONTINUE, ERROR, EXIT_CODES, FAIL, INCONCLUSIVE, PASS, SEVERITY,
                                   worst_outcome)
from harness.judge.verdict import Policy, Verdict, decide, error, fail

N = 200  # a clean cell proves the 5-pt margin at the third look (50, 100, 200, 400)


def logprobs(tokens: list[str], values: list[float]) -> dict:
    return {"tokens": tokens, "token_logprobs": values,
            "top_logprobs": [{t: v} for t, v in zip(tokens, values)]}


def question(doc_id: int, correct: bool = True, generated: str | None = None,
             lp: dict | None = None) -> QuestionRecord:
    answer = "42" if correct else "7"
    return QuestionRecord(doc_id=doc_id, prompt_hash=prompt_hash(f"Q{doc_id}"), target="#### 42",
                          generated=generated or f"#### {answer}", answer_strict=answer,
                          answer_flexible=answer, correct=correct, correct_flexible=correct,
                          logprobs=lp)


def run(questions: list[QuestionRecord], role: str) -> EvalRun:
    n = len(questions)
    return EvalRun(role=role, base_url="u", task="t", n=n,
                   accuracy=sum(q.correct for q in questions) / n, accuracy_flexible=0.0,
                   wall_s=0.0, questions=tuple(questions))


def proof(n: int = N, **changes) -> TransferProof:
    counters = TransferCounters(prompt_tokens_external=120.0 * n, kv_bytes=1e5 * n,
                                kv_transfers=float(n))
    base = TransferProof(requests=n, requests_with_params=n, requests_own_params=n,
                         counters=counters, recompute_allowance=0, requests_sent_params=n)
    counter_changes = changes.pop("counters", {})
    return dataclasses.replace(base, counters=dataclasses.replace(counters, **counter_changes),
                               **changes)


def comparison(n: int = N, *, pd_wrong: int = 0, transfer: TransferProof | None = None,
               pd_generated_differ: int = 0, aa: bool = False,
               base_lp: list[float] | None = None, pd_lp: list[float] | None = None,
               aa_lp: list[float] | None = None) -> Comparison:
    toks = ["#", "###", " 42"]

    def lp(values):
        return None if values is None else logprobs(toks, values)

    base = [question(i, lp=lp(base_lp)) for i in range(n)]
    pd = [question(i, correct=i >= pd_wrong,
                   generated=f"other {i} #### 42" if i < pd_generated_differ else None,
                   lp=lp(pd_lp)) for i in range(n)]
    base_aa = run([question(i, lp=lp(aa_lp or base_lp)) for i in range(n)], "baseline-aa") if aa else None
    return compare(run(base, "baseline"), run(pd, "pd"), transfer or proof(n), baseline_aa=base_aa)


def check(verdict: Verdict, name: str):
    return next(c for c in verdict.checks if c.name == name)


# ---- PASS -----------------------------------------------------------------------------------
def test_clean_powered_cell_passes():
    v = decide(comparison(aa=True, base_lp=[-0.1, -0.2, -0.3], pd_lp=[-0.1, -0.2, -0.3]))
    assert v.status == PASS and v.outcome == PASS and v.exit_code == 0
    assert all(c.passed for c in v.checks)
    assert {c.name for c in v.checks} >= {"kv-arrived-externally", "accuracy", "noise-floor",
                                          "logprob-divergence"}
    assert "prompt tokens arrived through the connector" in v.reason


# ---- transfer proof -------------------------------------------------------------------------
def test_no_external_tokens_means_decode_recomputed():
    v = decide(comparison(transfer=proof(counters={"prompt_tokens_external": 0.0, "kv_bytes": 0.0,
                                                   "prompt_tokens_local": 120.0 * N})))
    assert v.status == FAIL
    assert v.reason.startswith("decode recomputed the prompt: no KV crossed")
    assert not check(v, "kv-arrived-externally").passed
    assert not check(v, "decode-did-not-recompute").passed


def test_local_tokens_within_the_hybrid_allowance_pass_beyond_it_fail():
    ok = decide(comparison(transfer=proof(recompute_allowance=1,
                                          counters={"prompt_tokens_local": float(N)})))
    assert ok.status == PASS
    bad = decide(comparison(transfer=proof(recompute_allowance=1,
                                           counters={"prompt_tokens_local": float(N + 1)})))
    assert bad.status == FAIL
    assert bad.reason.startswith("decode recomputed the prompt: no KV crossed")


def test_dropped_params_fail_as_recompute():
    # the drop-transfer canary: prefill returned params, the proxy sent decode none
    p = proof(requests_own_params=0, requests_sent_params=0,
              counters={"prompt_tokens_external": 0.0, "kv_bytes": 0.0,
                        "prompt_tokens_local": 120.0 * N})
    v = decide(comparison(transfer=p))
    assert v.status == FAIL
    assert v.reason.startswith("decode recomputed the prompt: no KV crossed")
    assert "another request" not in v.reason
    assert not check(v, "decode-got-params").passed
    assert check(v, "decode-got-own-params").passed        # nothing foreign was sent


def test_foreign_params_fail_as_decode_got_own_params():
    p = proof(requests_own_params=1)      # KV still arrived, but for the wrong requests
    v = decide(comparison(transfer=p))
    assert v.status == FAIL
    assert "decode-got-own-params" in v.reason
    assert f"another request's transfer parameters on {N - 1} of {N}" in v.reason


def test_unknown_sent_count_treats_missing_own_params_as_foreign():
    p = proof(requests_own_params=N - 2, requests_sent_params=None)
    v = decide(comparison(transfer=p))
    assert v.status == FAIL and "another request's transfer parameters on 2 of" in v.reason
    assert check(v, "decode-got-params").passed


@pytest.mark.parametrize("counter", ["failed_transfers", "failed_notifications"])
def test_failed_transfers_fail(counter):
    v = decide(comparison(transfer=proof(counters={counter: 1.0})))
    assert v.status == FAIL and "no-failed-transfers" in v.reason


def test_proxy_missing_requests_and_prefill_without_params_fail():
    v = decide(comparison(transfer=proof(requests=N - 1, requests_with_params=N - 1,
                                         requests_own_params=N - 1, requests_sent_params=N - 1)))
    assert v.status == FAIL and "proxy-saw-every-question" in v.reason
    v = decide(comparison(transfer=proof(requests_with_params=N - 3)))
    assert v.status == FAIL and "prefill-returned-params" in v.reason


def test_transfer_failure_wins_over_accuracy_failure():
    v = decide(comparison(pd_wrong=20, transfer=proof(counters={"prompt_tokens_external": 0.0})))
    assert v.reason.startswith("decode recomputed the prompt")
    assert not check(v, "accuracy").passed      # every check is still computed and recorded


# ---- accuracy -------------------------------------------------------------------------------
def test_significant_accuracy_drop_fails():
    v = decide(comparison(pd_wrong=12))              # 12 discordant pairs, all against P/D
    assert v.status == FAIL
    assert v.reason.startswith("P/D accuracy is lower")
    assert "doc 0: baseline '42' vs P/D '7'" in v.reason
    assert not check(v, "accuracy").passed


def test_small_accuracy_difference_is_not_significant():
    v = decide(comparison(400, pd_wrong=2), Policy(stages=(50, 100, 200, 400)))   # p = 0.25
    assert check(v, "accuracy").passed
    assert v.status == PASS            # 0.5 pts lost of 400: within the 5-pt margin


# ---- noise floor ----------------------------------------------------------------------------
def test_generations_beyond_the_aa_floor_fail():
    v = decide(comparison(aa=True, pd_generated_differ=15))
    assert v.status == FAIL
    assert v.reason.startswith("P/D generations diverge beyond the A/A floor")
    assert check(v, "accuracy").passed


def test_few_differing_generations_stay_within_the_floor():
    v = decide(comparison(aa=True, pd_generated_differ=1))
    assert check(v, "noise-floor").passed and v.status == PASS


def test_no_aa_run_means_no_floor_check():
    v = decide(comparison(pd_generated_differ=15))
    assert all(c.name != "noise-floor" for c in v.checks)


# ---- logprobs -------------------------------------------------------------------------------
def test_logprob_divergence_above_threshold_fails():
    v = decide(comparison(base_lp=[-0.1, -0.2, -0.3], pd_lp=[-0.6, -0.7, -0.8]))
    assert v.status == FAIL
    assert v.reason.startswith("P/D logprobs diverge from the baseline")
    assert "p95 0.5000" in v.reason


def test_logprob_divergence_within_threshold_passes():
    v = decide(comparison(base_lp=[-0.1, -0.2, -0.3], pd_lp=[-0.15, -0.25, -0.35]))
    assert check(v, "logprob-divergence").passed and v.status == PASS


def test_logprob_threshold_scales_with_the_aa_floor():
    # A/A itself moves 0.1 nats: 5 × 0.1 = 0.5 allowed, so a 0.3-nat P/D shift is noise
    kw = dict(aa=True, base_lp=[-0.1, -0.2, -0.3], aa_lp=[-0.2, -0.3, -0.4])
    assert decide(comparison(pd_lp=[-0.4, -0.5, -0.6], **kw)).status == PASS
    assert decide(comparison(pd_lp=[-0.7, -0.8, -0.9], **kw)).status == FAIL
    strict = Policy(logprob_floor_factor=1.0)
    assert decide(comparison(pd_lp=[-0.4, -0.5, -0.6], **kw), strict).status == FAIL


# ---- power ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [50, 100])
def test_a_clean_cell_is_undecided_until_its_bound_is_within_the_margin(n):
    """0 of n questions differ: at n = 50 the 99 % upper bound of the drop is 9.8 pts, at 100
    it is 5.1 pts (more than the 5-pt margin): ask more questions, never PASS yet."""
    v = decide(comparison(n))
    assert v.status == CONTINUE and v.look["next_n"] == 2 * n
    assert v.look["drop_upper"] > 0.05 and "continue to" in v.reason


def test_a_clean_cell_passes_under_the_margin_in_the_users_terms():
    v = decide(comparison(200))
    assert v.status == PASS and v.exit_code == 0
    assert v.reason.startswith("P/D is not worse than the baseline by more than 5.0 pts")
    assert "n = 200" in v.reason and v.look["drop_upper"] <= 0.05


def test_a_ten_point_drop_never_passes():
    """The measured GDN-state fault: 96 % vs 86 % at n = 50 (5 lost, 0 gained, McNemar p =
    0.031) PASSed under the old rule. Now it is not PASS at any look: undecided at 50, FAIL
    once the evidence reaches the look's level."""
    assert decide(comparison(50, pd_wrong=5)).status == CONTINUE
    v = decide(comparison(100, pd_wrong=10))
    assert v.status == FAIL and v.reason.startswith("P/D accuracy is lower: P/D is worse")


def test_inconclusive_at_the_budget_with_the_bound_reached():
    v = decide(comparison(50), Policy(stages=(50,)))   # one look, 0 differ: bound 9.8 pts
    assert v.status == INCONCLUSIVE and v.exit_code == 4
    assert v.reason.startswith("inconclusive at the budget of 50 questions: the drop is at most 9.8 pts")


def test_a_wider_margin_decides_earlier():
    assert decide(comparison(50), Policy(margin=0.15)).status == PASS


# ---- expected failures, outcomes, exit codes --------------------------------------------------
def test_expected_failure_that_fails_is_xfail():
    v = decide(comparison(pd_wrong=12), expected_failure="upstream bug #1")
    assert (v.status, v.outcome, v.exit_code) == (FAIL, "XFAIL", 0)
    assert v.to_dict()["expected_failure"] == "upstream bug #1"


def test_expected_failure_that_passes_is_xpass():
    v = decide(comparison(), expected_failure="upstream bug #1")
    assert (v.status, v.outcome, v.exit_code) == (PASS, "XPASS", 1)


def test_expected_failure_keeps_inconclusive_and_error():
    """An expected failure whose baseline broke is the environment's failure: ERROR (retried),
    never a green XFAIL."""
    assert decide(comparison(50), Policy(stages=(50,)), expected_failure="x").outcome == INCONCLUSIVE
    assert error("baseline died", expected_failure="x").outcome == ERROR
    assert error("baseline died", expected_failure="x").exit_code == 3
    assert error("baseline died").outcome == ERROR and error("b").exit_code == 3
    assert fail("P/D died", expected_failure="x").outcome == "XFAIL"


def test_canary_caught_only_for_its_own_reason():
    from dataclasses import replace

    no_kv = fail("decode recomputed the prompt: no KV crossed (external=0)", check="transfer")
    assert replace(no_kv, canary="drop-transfer").outcome == "CAUGHT"
    assert replace(no_kv, canary="drop-transfer").exit_code == 0
    # the same FAIL is the wrong reason for a corrupted block: MISSED, exit 1
    assert replace(no_kv, canary="corrupt-block").outcome == "MISSED"
    assert replace(no_kv, canary="corrupt-block").exit_code == 1
    passed = decide(comparison(N))
    assert passed.status == PASS and replace(passed, canary="corrupt-block").outcome == "MISSED"
    # a canary whose baseline broke tested nothing: ERROR
    assert replace(error("baseline died"), canary="drop-transfer").outcome == ERROR
    assert replace(no_kv, canary="drop-transfer").to_dict()["canary"] == "drop-transfer"


def test_summary_line_names_canaries():
    from harness.core.outcomes import summary_line

    outcomes = ["PASS"] * 5 + ["XFAIL"] + ["CAUGHT"] * 4
    assert summary_line(outcomes) == "10 cells: 5 PASS, 1 XFAIL, 4 canaries caught"
    assert summary_line(["CAUGHT", "MISSED"]) == "2 cells: 1 canary caught, 1 canary missed"
    assert worst_outcome(["CAUGHT", "PASS"]) == "CAUGHT"
    assert EXIT_CODES[worst_outcome(["CAUGHT", "PASS", "XFAIL"])] == 0
    assert EXIT_CODES[worst_outcome(["CAUGHT", "MISSED", "PASS"])] == 1


def test_fail_helper_and_to_dict():
    v = fail("P/D pair failed to start", check="pd-startup")
    d = v.to_dict()
    assert (d["status"], d["outcome"], d["exit_code"]) == (FAIL, FAIL, 1)
    assert d["checks"] == [{"name": "pd-startup", "passed": False,
                            "detail": "P/D pair failed to start"}]
    assert d["decision_path"] == ["pd-startup"]


def test_exit_codes():
    assert EXIT_CODES == {PASS: 0, FAIL: 1, ERROR: 3, INCONCLUSIVE: 4, "XFAIL": 0, "XPASS": 1,
                          "CAUGHT": 0, "MISSED": 1}


@pytest.mark.parametrize("outcomes,worst", [
    ([], PASS),
    ([PASS, "XFAIL"], "XFAIL"),
    ([PASS, INCONCLUSIVE, "XFAIL"], INCONCLUSIVE),
    ([INCONCLUSIVE, ERROR], ERROR),
    ([ERROR, "XPASS"], "XPASS"),
    (["XPASS", FAIL, PASS], FAIL),
])
def test_worst_outcome(outcomes, worst):
    assert worst_outcome(outcomes) == worst
    assert set(SEVERITY) == set(EXIT_CODES)


# ---- baseline health against the model card -----------------------------------------------------
def test_baseline_far_below_its_model_card_is_error_before_any_pd_check():
    from harness.judge.verdict import ReferenceAccuracy

    broken = comparison(transfer=proof(counters={"prompt_tokens_external": 0.0}))
    # every baseline answer wrong: 0/60 where the card says 100%
    cmp = dataclasses.replace(broken, baseline_accuracy=0.02)
    v = decide(cmp, reference=ReferenceAccuracy(1.0, 200, "its model card"))
    assert v.status == ERROR and v.exit_code == EXIT_CODES[ERROR]
    assert v.decision_path == ("baseline-health",)
    assert "the baseline itself is broken" in v.reason and "100.0%" in v.reason


def test_baseline_near_its_model_card_passes_the_health_check():
    from harness.judge.verdict import ReferenceAccuracy

    cmp = dataclasses.replace(comparison(), baseline_accuracy=0.95)   # 57/60 vs card 97.5%
    v = decide(cmp, reference=ReferenceAccuracy(0.975, 200, "its model card"))
    assert v.status == PASS
    assert check(v, "baseline-health").passed


def test_no_reference_no_health_check():
    v = decide(comparison())
    assert all(c.name != "baseline-health" for c in v.checks)


def test_an_expected_failure_xfails_only_for_its_declared_reason():
    from dataclasses import replace

    declared = "P/D (accuracy is lower|generations diverge)"
    bad_accuracy = replace(decide(comparison(pd_wrong=12)), expected_failure="bug #1",
                           expected_failure_match=declared)
    assert bad_accuracy.outcome == "XFAIL" and bad_accuracy.exit_code == 0
    no_kv = replace(fail("decode recomputed the prompt: no KV crossed (x)", check="transfer"),
                    expected_failure="bug #1", expected_failure_match=declared)
    assert no_kv.outcome == FAIL and no_kv.exit_code == 1          # failed, but not as declared
    broken_base = replace(error("the baseline itself is broken here: baseline 2%"),
                          expected_failure="baseline broken upstream",
                          expected_failure_match="the baseline itself is broken here")
    assert broken_base.outcome == "XFAIL"                         # the declaration names it
    env = replace(error("baseline failed to start: OOM"), expected_failure="bug #1",
                  expected_failure_match=declared)
    assert env.outcome == ERROR                                   # the environment: retry
    assert replace(no_kv, expected_failure_match=None).outcome == "XFAIL"   # no pattern: any FAIL


# ---- exact byte accounting ------------------------------------------------------------------
def test_byte_shortfall_fails_the_transfer_proof_with_both_numbers():
    from harness.judge.byte_accounting import account
    from harness.core.kv_geometry import KvGeometry
    geo = KvGeometry(attention_layers=4, kv_heads=2, head_dim=64, dtype_bytes=2)
    short = account([{"remote_block_ids": [[0, 1, 2, 3]]}] * N, geo, 128, 0.75 * N * 1_048_576)
    v = decide(comparison(aa=True, transfer=proof(byte_account=short.to_dict())))
    assert v.status == FAIL and "kv-bytes-exact" in v.reason and "short by" in v.reason
    exact = account([{"remote_block_ids": [[0, 1, 2, 3]]}] * N, geo, 128, N * 1_048_576)
    v = decide(comparison(aa=True, transfer=proof(byte_account=exact.to_dict())))
    assert v.status == PASS and check(v, "kv-bytes-exact").passed
    # no account (geometry not modelled): no check, nothing passed in its name
    assert "kv-bytes-exact" not in {c.name for c in decide(comparison(aa=True)).checks}


# ---- KV digest ------------------------------------------------------------------------------
def digest_summary(n: int = N, differing: int = 0, compared: int | None = None) -> dict:
    compared = n if compared is None else compared
    first = None if not differing else {
        "request_id": "pdacc-x", "layer": "model.layers.1.self_attn.attn", "kv": "K", "head": 0,
        "token_range": [64, 96], "decode_block": 0, "differing_entries": 3, "entries": 40}
    return {"requests": n, "compared": compared, "identical": compared - differing,
            "differing": differing, "missing_prefill": 0, "missing_decode": n - compared,
            "not_digested": 0, "first_mismatch": first, "skipped_layers": {}, "cost_s": {}}


def test_identical_digests_pass_and_are_checked_before_accuracy():
    v = decide(comparison(transfer=proof(kv_digest=digest_summary())))
    assert v.status == PASS
    assert check(v, "kv-digest").detail == f"identical on {N}/{N} requests"
    assert v.decision_path.index("kv-digest") < next(
        i for i, step in enumerate(v.decision_path) if step.startswith("accuracy"))


def test_a_differing_byte_fails_even_when_every_answer_survives():
    v = decide(comparison(transfer=proof(kv_digest=digest_summary(differing=1))))
    assert v.status == FAIL and check(v, "accuracy").passed
    assert v.reason.startswith("the decode's prompt KV is not the prefill's [kv-digest]: "
                               f"prompt KV differs on 1/{N} requests")
    assert "layer model.layers.1.self_attn.attn K head 0 tokens 64-95 (decode block 0)" in v.reason
    from dataclasses import replace
    assert replace(v, canary="perturb-kv").outcome == "CAUGHT"
    assert replace(v, canary="corrupt-block").outcome == "CAUGHT"


def test_missing_decode_digests_fail_and_a_transfer_failure_still_names_itself():
    v = decide(comparison(transfer=proof(kv_digest=digest_summary(compared=N - 2))))
    assert v.status == FAIL and f"compared on {N - 2}/{N} requests only" in v.reason
    dropped = proof(requests_sent_params=0, counters={"prompt_tokens_external": 0.0},
                    kv_digest=digest_summary(compared=0))
    v = decide(comparison(transfer=dropped))
    assert v.reason.startswith("decode recomputed the prompt") and not check(v, "kv-digest").passed


def test_no_digest_leaves_the_check_out():
    v = decide(comparison(transfer=proof(kv_digest_skipped="KV digests off (--no-kv-digest)")))
    assert v.status == PASS and "kv-digest" not in {c.name for c in v.checks}


def test_an_accuracy_drop_with_identical_digests_says_the_kv_is_read_wrongly():
    v = decide(comparison(pd_wrong=40, transfer=proof(kv_digest=digest_summary())))
    assert v.status == FAIL and v.reason.startswith("P/D accuracy is lower")
    assert "kv-digest identical): it is read wrongly" in v.reason


# ---- random weights (harness.zoo.shapes): transfer, bytes and digest decide, never accuracy ---
def random_cell_proof(n: int = 50, **digest) -> TransferProof:
    from harness.judge.byte_accounting import account
    from harness.core.kv_geometry import KvGeometry
    geo = KvGeometry(attention_layers=4, kv_heads=2, head_dim=64, dtype_bytes=2)
    exact = account([{"remote_block_ids": [[0, 1, 2, 3]]}] * n, geo, 128, n * 1_048_576)
    return proof(n, byte_account=exact.to_dict(), kv_digest=digest_summary(n, **digest))


def test_random_weights_pass_on_transfer_bytes_and_digest_whatever_the_answers():
    # random weights: P/D "wrong" on 30/50 and generations differ: not judged, said so
    v = decide(comparison(50, pd_wrong=30, pd_generated_differ=30, aa=True,
                          transfer=random_cell_proof()), random_weights=True)
    assert v.status == PASS and v.look is None and "random-weights" in v.decision_path
    assert "accuracy says nothing" in v.reason and "[kv-digest] identical on 50/50" in v.reason
    assert "[kv-bytes-exact]" in v.reason
    assert {c.name for c in v.checks}.isdisjoint({"accuracy", "noise-floor", "logprob-divergence"})
    # the same answers on a trained model: FAIL on accuracy
    assert decide(comparison(50, pd_wrong=30, aa=True, transfer=random_cell_proof())).status == FAIL


def test_random_weights_fail_on_a_differing_byte_and_the_canary_is_caught():
    v = decide(comparison(50, transfer=random_cell_proof(differing=1)), random_weights=True)
    assert v.status == FAIL and v.reason.startswith("the decode's prompt KV is not the prefill's")
    assert "accuracy says nothing" in v.reason
    assert dataclasses.replace(v, canary="corrupt-block").outcome == "CAUGHT"
    dropped = dataclasses.replace(random_cell_proof(), requests_sent_params=0,
                                  counters=TransferCounters(kv_bytes=0.0))
    v = decide(comparison(50, transfer=dropped), random_weights=True)
    assert v.status == FAIL and v.reason.startswith("decode recomputed the prompt")
    assert dataclasses.replace(v, canary="drop-transfer").outcome == "CAUGHT"


def test_random_weights_without_digest_or_byte_account_cannot_pass():
    no_digest = proof(50, kv_digest_skipped="KV digests off (--no-kv-digest)")
    v = decide(comparison(50, transfer=no_digest), random_weights=True)
    assert v.status == INCONCLUSIVE and "kv-bytes-exact and kv-digest did not run" in v.reason
    no_bytes = proof(50, kv_digest=digest_summary(50))
    v = decide(comparison(50, transfer=no_bytes), random_weights=True)
    assert v.status == INCONCLUSIVE and "kv-bytes-exact did not run" in v.reason


def test_baseline_far_below_vllm_ci_expected_value_is_environment_error():
    from harness.core.real_models import expected_reference

    cmp = dataclasses.replace(comparison(), baseline_accuracy=0.12)   # 7/60 vs 0.41 ± 0.05
    v = decide(cmp, reference=expected_reference("Qwen/Qwen3-0.6B", "gsm8k"))
    assert v.status == ERROR and v.decision_path == ("baseline-health",)
    assert "baseline 0.12" in v.reason and "expected 0.41 ± 0.05" in v.reason
    assert "the environment" in v.reason and "not P/D" in v.reason


def test_baseline_near_vllm_ci_expected_value_passes_the_health_check():
    from harness.core.real_models import expected_reference

    cmp = dataclasses.replace(comparison(), baseline_accuracy=0.40)   # 24/60 vs 0.41
    v = decide(cmp, reference=expected_reference("Qwen/Qwen3-0.6B", "gsm8k"))
    assert check(v, "baseline-health").passed


# ---- a connector with no params and no counters (ExampleConnector) --------------------------
def example_proof(n: int = N, external: float = 384.0 * N, **digest) -> TransferProof:
    """What the proof of an ExampleConnector pair holds: no params either way, no counters of
    its own, the decode's own external prompt-token count, its tail computed locally."""
    return proof(n, requests_with_params=0, requests_own_params=0, requests_sent_params=0,
                 kv_bytes_counted=False,
                 counters={"prompt_tokens_external": external, "kv_bytes": 0.0,
                           "kv_transfers": 0.0, "prompt_tokens_local": 20.0 * n},
                 kv_digest=digest_summary(n, **digest))


def test_checks_a_connector_cannot_be_held_to_are_said_not_passed():
    from harness.connectors import connector_for

    lines = connector_for("example").not_available_lines()
    v = decide(comparison(transfer=example_proof()), not_available=lines)
    assert v.status == PASS
    names = {c.name for c in v.checks}
    assert not names & set(lines) and {"kv-arrived-externally", "kv-digest"} <= names
    assert sorted(v.not_available) == sorted(lines.values())
    assert check(v, "kv-arrived-externally").detail == (
        f"external_kv_transfer={384 * N} tokens, kv_bytes not counted by the connector")
    # the same proof judged as a connector that owes params and counters fails
    assert decide(comparison(transfer=example_proof())).status == FAIL


def test_no_external_tokens_fail_a_connector_that_counts_no_bytes():
    from harness.connectors import connector_for

    v = decide(comparison(transfer=example_proof(external=0.0)),
               not_available=connector_for("example").not_available_lines())
    assert v.status == FAIL and not check(v, "kv-arrived-externally").passed
    assert v.reason.startswith("decode recomputed the prompt: no KV crossed")


def test_a_corrupted_block_of_a_connector_without_params_is_caught_by_the_digest():
    from harness.connectors import connector_for

    v = decide(comparison(pd_wrong=N // 2, transfer=example_proof(differing=N)),
               not_available=connector_for("example").not_available_lines())
    assert v.status == FAIL and v.reason.startswith("the decode's prompt KV is not the prefill's")
    assert dataclasses.replace(v, canary="corrupt-block").outcome == "CAUGHT"


def test_not_available_names_only_checks_of_the_table():
    with pytest.raises(ValueError, match="names no transfer check"):
        decide(comparison(), not_available={"no-such-check": "no-such-check: why"})
    # one the proof does not compute (no byte account here) may be said not available
    assert decide(comparison(), not_available={"kv-bytes-exact": "kv-bytes-exact: na"}
                  ).not_available == ("kv-bytes-exact: na",)
