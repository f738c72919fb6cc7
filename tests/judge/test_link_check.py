"""network: netns cells: the transfer proof FAILs when the decode's P<->D link carried fewer
bytes than NIXL says it moved (the KV went another way, e.g. shared memory)."""
from __future__ import annotations

import dataclasses

from harness.core.outcomes import FAIL, PASS
from harness.eval.lmeval import EvalRun, QuestionRecord, prompt_hash
from harness.eval.metrics import TransferCounters
from harness.judge.compare import TransferProof, compare
from harness.judge.verdict import decide, link_check

N = 200   # a clean cell PASSes at this look


def run(role: str) -> EvalRun:
    qs = tuple(QuestionRecord(doc_id=i, prompt_hash=prompt_hash(f"Q{i}"), target="#### 42",
                              generated="#### 42", answer_strict="42", answer_flexible="42",
                              correct=True, correct_flexible=True) for i in range(N))
    return EvalRun(role=role, base_url="u", task="t", n=N, accuracy=1.0, accuracy_flexible=0.0,
                   wall_s=0.0, questions=qs)


def proof() -> TransferProof:
    counters = TransferCounters(prompt_tokens_external=120.0 * N, kv_bytes=1e5 * N,
                                kv_transfers=float(N))
    return TransferProof(requests=N, requests_with_params=N, requests_own_params=N,
                         counters=counters, recompute_allowance=0, requests_sent_params=N)


def comparison(transfer: TransferProof | None = None):
    return compare(run("baseline"), run("pd"), transfer or proof())


def check(verdict, name: str):
    return next(c for c in verdict.checks if c.name == name)


def link(rx: int | None) -> dict:
    return {"network": "netns", "topology": "abc123", "device": "kv0",
            "decode_netns": "pdacc-abc123-d", "decode_rx_bytes": rx, "decode_tx_bytes": 1000,
            "addresses": {}, "ucx": {"decode-0": {"UCX_TLS": "tcp"},
                                     "prefill-0": {"UCX_TLS": "tcp"}}}


def kv_bytes() -> float:
    return proof().counters.kv_bytes        # 1e5 per question


def test_the_link_carried_the_kv_passes():
    v = decide(comparison(transfer=dataclasses.replace(proof(), link=link(int(kv_bytes()) + 4096))))
    assert v.status == PASS
    c = check(v, "kv-crossed-the-link")
    assert c.passed and "UCX_TLS=tcp" in c.detail and "pdacc-abc123-d" in c.detail


def test_fewer_bytes_on_the_link_than_nixl_moved_fails_with_both_numbers():
    v = decide(comparison(transfer=dataclasses.replace(proof(), link=link(896))))
    assert v.status == FAIL
    assert v.reason.startswith("the KV did not cross the network link:")
    assert "896 bytes" in v.reason and f"{kv_bytes():,.0f}" in v.reason
    assert not check(v, "kv-crossed-the-link").passed


def test_an_unreadable_counter_is_not_proof():
    c = link_check(link(None), kv_bytes())
    assert not c.passed and "could not be read" in c.detail


def test_a_cell_on_one_host_has_no_link_check():
    v = decide(comparison())
    assert "kv-crossed-the-link" not in {c.name for c in v.checks} and v.status == PASS
