"""Check spec-acceptance: P/D's draft acceptance against the baseline's on the same questions,
from each answer's own counts (vLLM's per-request metrics), paired by question; its error rate
at the boundary of its bound, its power, and the verdict it gives a canary."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.core.outcomes import CAUGHT, FAIL, PASS
from harness.eval.lmeval import QuestionRecord
from harness.judge.compare import compare
from harness.judge.spec_acceptance import Counts, SpecEvidence, counts_of, describe
from harness.judge.verdict import decide
from tests.judge.test_verdict import check, proof, question, run

K = 3


def spec(hist: list[int], drafted: int | None = None) -> dict:
    """vLLM's metrics.speculative_decoding of one answer."""
    steps = sum(hist)
    return {"acceptance_histogram": hist, "num_spec_steps": steps,
            "num_draft_tokens": steps * (len(hist) - 1) if drafted is None else drafted,
            "num_accepted_draft_tokens": sum(j * h for j, h in enumerate(hist)),
            "num_spec_tokens": len(hist) - 1}


def test_an_answers_histogram_gives_vllms_own_rates():
    c = counts_of(spec([2, 1, 3, 4]))
    assert c == Counts(steps=10, drafted=30, accepted=0 * 2 + 1 + 6 + 12, per_pos=(8, 7, 4))
    d = c.to_dict()
    assert d["rate"] == pytest.approx(19 / 30) and d["per_position"] == [0.8, 0.7, 0.4]
    assert counts_of(None) is None and counts_of({}) is None


def pairs_of(base: list[list[int]], pd: list[list[int]]) -> tuple:
    return tuple((counts_of(spec(b)), counts_of(spec(p))) for b, p in zip(base, pd))


GOOD = [[1, 2, 3, 4 + i % 3] for i in range(50)]
REJECTED = [[sum(h), 0, 0, 0] for h in GOOD]


def test_the_same_acceptance_passes_and_says_what_it_would_find():
    ev = SpecEvidence(pairs_of(GOOD, GOOD), (), {})
    passed, line = describe(ev, 0.05, 0.01)
    assert passed and "overall +0.0 %" in line and "found with 80% power" in line


def test_drafts_all_rejected_fail_and_name_every_position():
    ev = SpecEvidence(pairs_of(GOOD, REJECTED), (), {})
    passed, line = describe(ev, 0.05, 0.01)
    assert not passed
    assert line.startswith("lower at overall, position 0, position 1, position 2")


def test_a_drop_at_the_last_position_only_is_named_alone():
    late = [[1, 2, 3 + h[3], 0] for h in GOOD]        # the third draft never accepted
    passed, line = describe(SpecEvidence(pairs_of(GOOD, late), (), {}), 0.05, 0.01)
    assert not passed and line.startswith("lower at overall, position 2:")
    assert "position 0" not in line.split(";")[0]


def test_a_drop_the_aa_shows_too_is_not_called_one():
    lower = [[2, 2, 3, 3 + i % 3] for i in range(50)]     # ~10 % fewer accepted
    assert not describe(SpecEvidence(pairs_of(GOOD, lower), (), {}), 0.05, 0.01)[0]
    aa = pairs_of(GOOD, lower)      # the baseline's own re-run differs as much
    passed, line = describe(SpecEvidence(pairs_of(GOOD, lower), aa, {}), 0.05, 0.01)
    assert passed and "tolerance 1" in line


def test_a_decode_that_drafts_nothing_accepts_nothing():
    nothing = [[0, 0, 0, 0] for _ in GOOD]
    ev = SpecEvidence(tuple((counts_of(spec(b)), counts_of(spec(p, drafted=0)))
                            for b, p in zip(GOOD, nothing)), (), {})
    assert not describe(ev, 0.05, 0.01)[0]


def test_a_baseline_that_accepts_nothing_has_nothing_to_lose():
    passed, line = describe(SpecEvidence(pairs_of(REJECTED, REJECTED), (), {}), 0.05, 0.01)
    assert passed and "nothing to lose" in line


def test_the_decodes_counters_are_held_to_the_answers_sums():
    pairs = pairs_of(GOOD, GOOD)
    pd = [p for _, p in pairs]
    agree = {"spec_drafts": sum(c.steps for c in pd), "spec_draft_tokens": sum(c.drafted for c in pd),
             "spec_accepted_tokens": sum(c.accepted for c in pd)}
    assert SpecEvidence(pairs, (), agree).counters_agree()
    off = SpecEvidence(pairs, (), {**agree, "spec_accepted_tokens": 1.0})
    assert not off.counters_agree() and "accepted" in describe(off, 0.05, 0.01)[1]


# ---- error rate and power -------------------------------------------------------------------

def _side(rng, p: float, steps: int) -> Counts:
    accepted = int(rng.binomial(steps, p))
    return Counts(steps, steps, accepted, (accepted,))


def fail_rate(drop: float, reps: int, n: int = 50, seed: int = 0) -> float:
    """How often the check FAILs when P/D's acceptance is (1 - drop) x the baseline's, question
    by question (one draft a step: the rate is the per-step probability itself), with
    acceptance differing widely between questions and drawn afresh on each side."""
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(reps):
        pairs = []
        for _ in range(n):
            p, steps = rng.beta(4, 3), int(rng.integers(10, 60))
            pairs.append((_side(rng, p, steps), _side(rng, p * (1 - drop), steps)))
        fails += not describe(SpecEvidence(tuple(pairs), (), {}), 0.05, 0.01)[0]
    return fails / reps


def test_at_the_bounds_edge_it_fails_no_more_often_than_alpha():
    # a drop of exactly the margin is H0's edge: the error rate there is the test's level
    assert fail_rate(0.05, reps=1000) <= 0.01
    assert fail_rate(0.0, reps=300) == 0.0


def test_a_drop_of_fifteen_percent_is_found_at_fifty_questions():
    assert fail_rate(0.15, reps=200, seed=1) >= 0.8


# ---- in the verdict -------------------------------------------------------------------------

def with_spec(qs: list[QuestionRecord], hists: list[list[int]]) -> list[QuestionRecord]:
    return [dataclasses.replace(q, spec=spec(h)) for q, h in zip(qs, hists)]


def spec_comparison(pd_hists, n: int = 200, aa: bool = True, **counters):
    base_h = [[1, 2, 3, 4 + i % 3] for i in range(n)]
    base = with_spec([question(i) for i in range(n)], base_h)
    pd = with_spec([question(i) for i in range(n)], pd_hists(base_h))
    base_aa = run(with_spec([question(i) for i in range(50)], base_h), "baseline-aa") if aa else None
    return compare(run(base, "baseline"), run(pd, "pd"), proof(n, counters=counters),
                   baseline_aa=base_aa)


def test_wrong_drafts_with_right_answers_fail_on_acceptance_alone():
    v = decide(spec_comparison(lambda hs: [[sum(h), 0, 0, 0] for h in hs]))
    assert v.status == FAIL
    assert v.reason.startswith("P/D's drafts are accepted less than the baseline's "
                               "[spec-acceptance]: lower at overall, position 0")
    assert [c.name for c in v.checks if not c.passed] == ["spec-acceptance"]
    canary = dataclasses.replace(v, canary="wrong-drafts")
    assert canary.outcome == CAUGHT
    assert dataclasses.replace(v, canary="corrupt-draft-kv").outcome == CAUGHT


def test_the_same_acceptance_passes_and_the_record_keeps_the_rates():
    cmp = spec_comparison(lambda hs: hs)
    v = decide(cmp)
    assert v.status == PASS and check(v, "spec-acceptance").passed
    kept = cmp.metrics_dict()["spec_acceptance"]
    assert kept["questions"] == 200 and kept["aa"]["questions"] == 50
    assert kept["pd"]["rate"] == kept["baseline"]["rate"]


def test_a_decode_that_drafted_without_answers_counts_says_not_available():
    base = [question(i) for i in range(200)]
    cmp = compare(run(base, "baseline"), run(base, "pd"),
                  proof(200, counters={"spec_draft_tokens": 900.0}))
    v = decide(cmp)
    assert not any(c.name == "spec-acceptance" for c in v.checks)
    assert any(line.startswith("spec-acceptance: not available: the decode drafted")
               for line in v.not_available)
    # no drafts at all: nothing is said
    plain = decide(compare(run(base, "baseline"), run(base, "pd"), proof(200)))
    assert not any("spec-acceptance" in line for line in plain.not_available)


def test_the_record_keeps_each_questions_counts_and_a_re_judge_reads_them_back():
    from harness.run.rejudge import _spec

    cmp = spec_comparison(lambda hs: [[sum(h), 0, 0, 0] for h in hs])
    kept = cmp.metrics_dict()
    back = _spec(kept)["spec"]
    assert back.pairs == cmp.spec.pairs and back.aa_pairs == cmp.spec.aa_pairs
    assert describe(back, 0.05, 0.01) == describe(cmp.spec, 0.05, 0.01)
    # a summary without them (an older record) is said, never judged on its sums
    older = {**kept, "spec_acceptance": {k: v for k, v in kept["spec_acceptance"].items()
                                         if k != "per_question"}}
    assert _spec(older) == {"spec": None, "spec_skipped": "the record keeps its acceptance "
                                                          "summed only, not per question"}
    assert _spec({"spec_acceptance": None, "spec_acceptance_skipped": None}) == {
        "spec": None, "spec_skipped": None}


def test_corrupt_draft_kv_is_caught_where_the_digest_names_a_draft_layer():
    """A draft model's layers are named draft_model.*; an EAGLE head's continue the target's
    numbering, and the digest says which are the draft's: either is the canary's reason, a
    target layer is not."""
    from harness.core.outcomes import FAIL, MISSED
    from harness.judge.canaries import canary_outcome

    said = ("[kv-digest]: prompt KV differs on 50/50 requests (100%); first at layer {} K head 0 "
            "tokens 0-31 (decode block 0) of cmpl-x, 1/2 entries differ")
    for layer in ("draft_model.model.layers.0.self_attn.attn",
                  "model.layers.4.self_attn.attn (the draft's)"):
        assert canary_outcome("corrupt-draft-kv", FAIL, said.format(layer)) == CAUGHT
    assert canary_outcome("corrupt-draft-kv", FAIL,
                          said.format("model.layers.1.self_attn.attn")) == MISSED
