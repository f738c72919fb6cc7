"""A pair of several instances is judged only when every instance served (every-instance-served),
and a hybrid cell carries vLLM CI's consistency number next to the harness's own divergence."""
from __future__ import annotations

import dataclasses
import math

from harness.core.outcomes import CAUGHT, FAIL, MISSED, PASS
from harness.judge.canaries import canary_outcome
from harness.judge.compare import compare
from harness.judge.logprobs import TokenLogprob, first_tokens_delta, summarize_consistency
from harness.judge.verdict import CHECKS, decide
from harness.run.evidence.transfer_evidence import instance_counts
from tests.judge.test_verdict import N, check, comparison, logprobs, proof, question, run

P0, P1 = "http://127.0.0.1:8100", "http://127.0.0.1:8101"
D0, D1 = "http://127.0.0.1:8200", "http://127.0.0.1:8201"
ONE_P_TWO_D = {"prefill": [("prefill-0", P0)], "decode": [("decode-0", D0), ("decode-1", D1)]}


def routed(n: int, decodes: list[str]) -> list[dict]:
    return [{"prefill_url": P0, "decode_url": decodes[i % len(decodes)]} for i in range(n)]


def test_requests_per_instance_come_from_the_proxy_records():
    counts = instance_counts(routed(5, [D0, D1]), ONE_P_TWO_D)
    assert counts == {"prefill": [{"name": "prefill-0", "url": P0, "requests": 5}],
                      "decode": [{"name": "decode-0", "url": D0, "requests": 3},
                                 {"name": "decode-1", "url": D1, "requests": 2}]}
    # one prefill and one decode: every request meets both, nothing to count
    assert instance_counts(routed(5, [D0]), {"prefill": [("prefill-0", P0)],
                                             "decode": [("decode-0", D0)]}) is None


def test_a_pair_whose_instances_all_served_passes_and_says_the_counts():
    v = decide(comparison(transfer=proof(instances=instance_counts(routed(N, [D0, D1]),
                                                                   ONE_P_TWO_D))))
    assert v.status == PASS
    assert check(v, "every-instance-served").detail == (
        "requests per instance: prefill: prefill-0 200; decode: decode-0 100, decode-1 100")


def test_an_idle_instance_fails_first_and_the_routing_canary_is_caught():
    counts = instance_counts(routed(N, [D0]), ONE_P_TWO_D)
    counts["decode"][0]["external_tokens"] = 24000.0
    v = decide(comparison(transfer=proof(instances=counts)))
    assert v.status == FAIL
    assert v.reason.startswith("an instance of the pair served no request: decode-1 got none")
    assert "decode-0 200 (24000 prompt tokens through the connector)" in v.reason
    assert canary_outcome("idle-instance", v.status, v.reason) == CAUGHT
    # another canary failing for a transfer reason is not this one's catch
    assert canary_outcome("idle-instance", FAIL, "decode recomputed the prompt: x") == MISSED


def test_the_instance_check_comes_right_after_the_proxy_saw_every_question():
    names = [row.name for row in CHECKS]
    assert names.index("every-instance-served") == names.index("proxy-saw-every-question") + 1


def tokens(values: list[float]) -> list[TokenLogprob]:
    return [TokenLogprob(str(i), v) for i, v in enumerate(values)]


def test_the_consistency_number_is_upstreams_first_four_positions():
    # position by position, whatever was chosen there; the fifth token is not looked at
    assert math.isclose(first_tokens_delta(tokens([-0.1, -0.2, -0.3, -0.4, -9.0]),
                                           tokens([-0.1, -0.5, -0.3, -0.4, -0.1])), 0.3)
    assert first_tokens_delta(tokens([math.nan]), tokens([-1.0])) is None
    summary = summarize_consistency({3: 0.02, 7: 1.6, 9: 0.04})
    assert summary["max_nats"] == 1.6 and summary["worst_doc"] == 7
    assert summary["over_bound"] == 1 and summary["bound_nats"] == 1.5 and summary["tokens"] == 4


def test_a_hybrid_cell_says_the_consistency_number_beside_its_own_divergence():
    toks = ["#", "###", " 42"]
    base = [question(i, lp=logprobs(toks, [-0.1, -0.2, -0.3])) for i in range(N)]
    pd = [question(i, lp=logprobs(toks, [-0.1, -0.25, -0.3])) for i in range(N)]
    hybrid = compare(run(base, "baseline"), run(pd, "pd"), proof(), hybrid=True)
    dense = compare(run(base, "baseline"), run(pd, "pd"), proof())
    assert dense.consistency is None and "consistency" not in check(decide(dense), "logprob-divergence").detail
    assert math.isclose(hybrid.consistency["max_nats"], 0.05)
    assert hybrid.metrics_dict()["consistency"] == hybrid.consistency
    line = check(decide(hybrid), "logprob-divergence").detail
    assert "vLLM CI's hybrid consistency: first 4 tokens' top-1 |Δ logprob| max 0.050 nats" in line
    assert "upstream's bound 1.5: 0 at or over it" in line
    # a number to compare, not a gate: over upstream's bound the verdict is the harness's own
    far = [question(i, lp=logprobs(toks, [-2.0, -0.2, -0.3])) for i in range(N)]
    cmp = compare(run(base, "baseline"), run(far, "pd"), proof(), hybrid=True)
    assert cmp.consistency["over_bound"] == N
    assert decide(dataclasses.replace(cmp)).status == FAIL   # logprob-divergence: p95 1.9 nats
