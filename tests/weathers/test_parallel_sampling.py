"""parallel-sampling: each question again with n seeded children; every child is a row of its
own whose prompt KV is digested against its one prefill's, and the children's answers are
judged statistically (children-agree), not by identity."""
from __future__ import annotations

from harness.judge.weather import IDENTICAL, MISSING, RequestRow, silent_wrong
from harness.protocol.kv_digest import KVDigest, record_line
from harness.run.evidence.kv_digest_evidence import (child_of, digest_evidence, parent_id,
                                                    request_digests)
from harness.run.weather.base import SeriesQuestion, WeatherRun
from harness.run.weather_eval import with_digests
from harness.serve.proxy.hops import build_prefill_body
from harness.weathers import WEATHERS, resolved_params
from harness.weathers.parallel_sampling.driver import (WEATHER, agreement_condition, child_id,
                                                       child_rows, sampled_body)

PROXY_ID = "pdacc-" + "ab" * 16
LAYER = "model.layers.0.self_attn.attn"
QUESTION = SeriesQuestion(doc_id=3, payload={"prompt": "Q", "seed": 1234, "temperature": 0.0,
                                           "max_tokens": 64}, baseline_answer="42")


def test_the_weather_asks_two_to_four_children_by_default_two():
    assert resolved_params("parallel-sampling", {}) == {"n": 2, "top_k": 1}
    assert WEATHERS["parallel-sampling"].params["n"].problem("n", 5)
    assert WEATHERS["parallel-sampling"].params["n"].problem("n", 1)


def test_children_are_sampled_at_temperature_one_seeded_and_prefilled_once():
    body = sampled_body(QUESTION.payload, 3, 1, "salt")
    # vLLM refuses n > 1 at temperature 0; top_k 1 keeps them nearly greedy; the look's seed
    assert (body["n"], body["temperature"], body["top_k"], body["seed"]) == (3, 1.0, 1, 1234)
    assert body["cache_salt"] == "salt"
    prefill = build_prefill_body({**body, "best_of": 3}, {"do_remote_decode": True})
    assert prefill["n"] == 1 and "best_of" not in prefill and prefill["max_tokens"] == 1
    assert "n" not in build_prefill_body({"prompt": "p"}, {})


def test_each_child_is_a_row_named_by_its_parent_and_index():
    payload = {"choices": [{"index": 1, "text": "so #### 41", "finish_reason": "stop"},
                           {"index": 0, "text": "so #### 42", "finish_reason": "stop"}]}
    rows = child_rows(PROXY_ID, payload, 200, 3, QUESTION, first_index=6)
    assert [r.request_id for r in rows] == [f"{PROXY_ID}#0", f"{PROXY_ID}#1", f"{PROXY_ID}#2"]
    assert [r.agrees for r in rows[:2]] == [True, False] and [r.series_index for r in rows] == [6, 7, 8]
    assert rows[2].error == "no such child in the answer" and not rows[2].answered
    assert parent_id(rows[1].request_id) == PROXY_ID and parent_id(PROXY_ID) == PROXY_ID


def digest(hashes: str) -> dict:
    return {LAYER: KVDigest(head_offset=0, num_tokens=32, token_chunk=16, dtype="bfloat16",
                            hashes=(((hashes[0], hashes[1]),), ((hashes[2], hashes[3]),)))}


def files(tmp_path, decode_lines: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    p, d = tmp_path / "p.jsonl", tmp_path / "d.jsonl"
    p.write_text(record_line("prefill", "r1", remote_request_id=None, token_offset=0,
                             num_tokens=32, layers=digest("abcd"), skipped={},
                             elapsed_s=0.0) + "\n")
    d.write_text("".join(record_line("decode", rid, remote_request_id="r1", token_offset=0,
                                     num_tokens=32, layers=digest(h), skipped={},
                                     elapsed_s=0.0) + "\n" for rid, h in decode_lines))
    return [str(p)], [str(d)]


RECORDS = [{"request_id": PROXY_ID, "prompt_hash": "h",
            "received_kv_transfer_params": {"remote_request_id": "r1"}}]


def test_every_child_is_digested_against_its_one_prefill(tmp_path):
    assert child_of(f"1_cmpl-{PROXY_ID}-0-9f") == 1 and child_of(f"cmpl-{PROXY_ID}-0") is None
    prefill, decode = files(tmp_path, [(f"0_cmpl-{PROXY_ID}-0-9f", "abcd"),
                                       (f"1_cmpl-{PROXY_ID}-0-9f", "abcX")])
    got = request_digests(RECORDS, prefill, decode, 16)
    assert got[f"{PROXY_ID}#0"] == (IDENTICAL, "")
    assert got[f"{PROXY_ID}#1"][0] == "differs" and "V head 0" in got[f"{PROXY_ID}#1"][1]
    # the request's aggregate (the transfer proof's kv-digest) reads its first child
    assert digest_evidence(RECORDS, prefill, decode, 16)["identical"] == 1


def test_a_child_that_read_no_transfer_is_a_silent_wrong_answer(tmp_path):
    # child 1 recomputed its prompt (or was served from child 0's blocks): no decode line
    prefill, decode = files(tmp_path, [(f"0_cmpl-{PROXY_ID}-0-9f", "abcd")])
    digests = request_digests(RECORDS, prefill, decode, 16)
    rows = child_rows(PROXY_ID, {"choices": [{"index": i, "text": "#### 42"} for i in (0, 1)]},
                      200, 2, QUESTION, 0)
    rows = with_digests(tuple(rows), digests, RECORDS)
    assert [r.digest for r in rows] == [IDENTICAL, MISSING] and rows[1].prompt_hash == "h"
    assert rows[1].digest_detail.startswith("no decode digest of this child")
    assert silent_wrong(rows) == [rows[1]]


def agreeing(n: int, differ: int) -> tuple[RequestRow, ...]:
    return tuple(RequestRow(request_id=child_id(f"r{i // 2}", i % 2), doc_id=i // 2,
                            prompt_hash=None, status=200, error=None, digest=IDENTICAL,
                            answer="1", agrees=i >= differ, series_index=i) for i in range(n))


def test_children_are_judged_statistically_not_by_identity():
    # 1 of 12 differing (what two clean CPU NIXL children did at top_k 1) holds
    held = agreement_condition(agreeing(12, 1))
    assert held.passed is True and held.detail.startswith("1 of 12 children answer otherwise")
    assert not agreement_condition(agreeing(100, 20)).passed    # a fifth: beyond chance


def test_the_weather_happened_when_every_asked_request_gave_n_children():
    rows = agreeing(8, 0)
    run = WeatherRun(cell=None, params={"n": 2, "top_k": 1}, rows=rows, proxy_records=(),
                     metrics_before={}, metrics_after={})
    happened, agree = WEATHER.conditions(run)
    assert (happened.name, happened.passed, agree.passed) == ("children-sampled", True, True)
    short = WeatherRun(cell=None, params={"n": 2, "top_k": 1}, rows=rows[:-1], proxy_records=(),
                       metrics_before={}, metrics_after={})
    assert not WEATHER.conditions(short)[0].passed
    assert "kv-bytes-exact" in WEATHER.accounted_checks({"n": 2})


def test_a_hybrids_children_each_recompute_their_last_token_within_the_allowance():
    """A hybrid decode recomputes one prompt token per sequence by design; each child of an
    n > 1 request is a sequence of its own (CPU Granite, n = 2: 150 tokens for 100 requests)."""
    import dataclasses

    from harness.core.outcomes import FAIL
    from harness.judge.verdict import decide
    from harness.run.evidence.transfer_evidence import transfer_proof
    from tests.judge.test_verdict import check, comparison, proof

    records = [{"request_id": f"r{i}", "n": 2 if i >= 50 else 1} for i in range(100)]
    assert transfer_proof(records, proof().counters, hybrid=True, decode_logs=()).sequences == 150
    # 200 requests, 100 of them with two children: 300 sequences, 250 tokens recomputed
    hybrid = proof(recompute_allowance=1, counters={"prompt_tokens_local": 250.0})
    held = check(decide(comparison(transfer=dataclasses.replace(hybrid, sequences=300))),
                 "decode-did-not-recompute")
    assert held.passed and "a child of n > 1 a request of its own: 300 sequences" in held.detail
    v = decide(comparison(transfer=hybrid))     # counted per request: 200 allowed
    assert v.status == FAIL and v.reason.startswith("decode recomputed the prompt")
