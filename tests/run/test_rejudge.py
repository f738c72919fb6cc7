"""Re-judging committed records offline (harness.run.rejudge): the H200 gemma-3-4b cell that
FAILed on the harness's own byte geometry, a canary that must stay caught, and the records it
refuses."""
from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest

from harness.core.outcomes import CAUGHT, FAIL, INCONCLUSIVE, PASS
from harness.judge.verdict import decide
from harness.run.rejudge import rejudge

REPO = Path(__file__).resolve().parents[2]
H200_SHAPES = REPO / "results/reference/gpu-h200-shapes-fp8-push-20261203"
GEMMA = H200_SHAPES / ("third-call/records/20261203T200141Z-868bd2/"
               "v1-FLASH_ATTN-p128d128-shape-gemma-3-4b-tp1x1.json")
CANARY = H200_SHAPES / ("second-call/records/20261203T195245Z-911f15/"
                "v2-FLASHINFER-p128d128-shape-qwen3-0.6b-tp1x1-fault-corrupt-block.json")


def test_the_h200_gemma_cell_passes_its_byte_count_when_re_judged():
    """Recorded FAIL: NIXL moved 3,670,016,000 B, the harness expected 3,565,158,400 (34 of the
    35 layer slots of vLLM's 7 KV cache groups of 5). Re-judged with those slots: exact, PASS."""
    rejudged = rejudge(GEMMA)
    recorded = rejudged.record["verdict"]
    assert recorded["status"] == FAIL and "kv-bytes-exact" in recorded["reason"]
    assert rejudged.record["metrics"]["transfer"]["byte_account"]["expected"] == 3_565_158_400
    account = rejudged.comparison.transfer.byte_account
    assert (account["expected"], account["actual"], account["attention_blocks"]) == (
        3_670_016_000, 3_670_016_000, 1400)
    checks = {c.name: c for c in rejudged.verdict.checks}
    assert checks["kv-bytes-exact"].passed and checks["kv-digest"].passed
    assert rejudged.verdict.outcome == PASS, rejudged.verdict.reason
    assert rejudged.verdict.not_available == ()


def copy_run(record: Path, into: Path) -> Path:
    """`record` with the files beside it that it names (run directory layout kept)."""
    run = record.parent
    shutil.copytree(run, into / run.name)
    return into / run.name / record.name


def test_the_re_judge_judges_the_rebuilt_proof_not_the_recorded_one(tmp_path):
    path = copy_run(GEMMA, tmp_path)
    record = json.loads(path.read_text())
    record["metrics"]["transfer"]["kv_bytes"] = 3_565_158_400.0   # what the old count wanted
    path.write_text(json.dumps(record))
    rejudged = rejudge(path)
    assert rejudged.verdict.outcome == FAIL
    assert "kv-bytes-exact" in rejudged.verdict.reason and "short by 104,857,600" in rejudged.verdict.reason
    # the proxy records are read as committed (gzipped); without them nothing is re-judged
    records = path.parent / path.stem / "proxy-records.jsonl.gz"
    with gzip.open(records, "rt") as f:
        assert sum(1 for _ in f) == 50
    records.unlink()
    with pytest.raises(ValueError, match="proxy records .* are not beside the record"):
        rejudge(path)


def test_a_committed_canary_stays_caught():
    rejudged = rejudge(CANARY)
    assert rejudged.record["verdict"]["outcome"] == CAUGHT
    assert rejudged.verdict.outcome == CAUGHT, rejudged.verdict.reason
    assert {c.name: c.passed for c in rejudged.verdict.checks}["kv-digest"] is False


def test_a_byte_count_that_cannot_be_exact_is_declared_not_available_never_passed():
    """A recurrent hybrid whose KV cache groups are padded has no exact byte expectation
    (kv_geometry refuses it): the check is listed as not available with the reason, and a
    random-weight cell, which rests on it, is INCONCLUSIVE, not PASS."""
    cmp = rejudge(GEMMA).comparison
    why = ("a recurrent hybrid whose KV cache groups are padded (full 2/2, full 1/2, state 2/2 "
           "layers/slots): the bytes of its padding slots are not modelled")
    unknown = dataclasses.replace(cmp, transfer=dataclasses.replace(
        cmp.transfer, byte_account=None, byte_account_skipped=why))
    verdict = decide(unknown, random_weights=True)
    assert verdict.status == INCONCLUSIVE and "kv-bytes-exact did not run" in verdict.reason
    assert verdict.not_available == (f"kv-bytes-exact: not available: {why}",)
    assert "kv-bytes-exact" not in {c.name for c in verdict.checks}


def test_a_weather_cell_is_not_re_judged():
    weather = REPO / ("results/reference/cpu-weather-20261203/"
                      "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-w_load.json")
    with pytest.raises(ValueError, match="judged per request"):
        rejudge(weather)


SPEC_RUN = (REPO / "results/reference/cpu-spec-decode-20261207/20261207T180734Z-547a02/"
            "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_draft_p1_d3")


@pytest.mark.parametrize("suffix,outcome,failed", [
    ("", PASS, []),
    ("-fault-wrong-drafts", CAUGHT, ["spec-acceptance"]),
    ("-fault-corrupt-draft-kv", CAUGHT, ["kv-digest", "spec-acceptance"])])
def test_the_committed_draft_cells_are_judged_again_on_each_questions_acceptance(
        suffix, outcome, failed):
    """The record keeps each question's draft acceptance: re-judged, the draft-model cell passes
    and its two canaries stay caught, for the same checks."""
    rejudged = rejudge(f"{SPEC_RUN}{suffix}.json")
    assert rejudged.verdict.outcome == outcome, rejudged.verdict.reason
    assert [c.name for c in rejudged.verdict.checks if not c.passed] == failed
    assert rejudged.comparison.spec is not None and len(rejudged.comparison.spec.pairs) >= 50


def test_the_committed_ngram_canary_of_drafts_stays_caught_on_acceptance_alone():
    rejudged = rejudge(REPO / "results/reference/cpu-spec-decode-20261207/20261207T184316Z-3a4878/"
                       "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_ngram-fault-wrong-drafts.json")
    assert rejudged.verdict.outcome == CAUGHT, rejudged.verdict.reason
    assert [c.name for c in rejudged.verdict.checks if not c.passed] == ["spec-acceptance"]


EAGLE_RUN = (REPO / "results/reference/cpu-eagle-20261207/20261207T214425Z-e674ce/"
             "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_eagle_p1_d3")
MTP_RUN = (REPO / "results/reference/cpu-mtp-20261208/20261208T005116Z-322b70/"
           "v1-CPU_ATTN-p128d128-tiny-qwen3next-hybrid-gsm-mtp-tp1x1-eager-spec_mtp_p3_d3-x62f261")


@pytest.mark.parametrize("record,outcome,failed,exact_bytes", [
    (f"{EAGLE_RUN}.json", PASS, [], None),
    (f"{EAGLE_RUN}-fault-wrong-drafts.json", CAUGHT, ["spec-acceptance"], None),
    (f"{EAGLE_RUN}-fault-corrupt-draft-kv.json", CAUGHT, ["kv-digest", "spec-acceptance"], None),
    # the MTP layer read from the served checkpoint's num_nextn_predict_layers
    (f"{MTP_RUN}.json", PASS, [], "164,761,600"),
    (f"{MTP_RUN}-fault-wrong-drafts.json", CAUGHT, ["spec-acceptance"], "41,190,400"),
    (f"{MTP_RUN}-fault-corrupt-draft-kv.json", CAUGHT, ["kv-digest", "spec-acceptance"],
     "41,190,400")], ids=lambda v: v.rsplit("spec_", 1)[-1] if isinstance(v, str) else None)
def test_the_committed_head_cells_are_judged_again_with_the_heads_layer(record, outcome, failed,
                                                                         exact_bytes):
    """The EAGLE and MTP heads' cells re-judged from their records: the head's layer in the
    byte account (from its config.json, or the served checkpoint's for MTP), the digest's draft
    layer kept, the canaries caught again."""
    rejudged = rejudge(record)
    assert rejudged.verdict.outcome == outcome, rejudged.verdict.reason
    assert [c.name for c in rejudged.verdict.checks if not c.passed] == failed
    assert rejudged.comparison.spec is not None and len(rejudged.comparison.spec.pairs) >= 50
    if exact_bytes is not None:
        bytes_check = next(c for c in rejudged.verdict.checks if c.name == "kv-bytes-exact")
        assert bytes_check.passed and exact_bytes in bytes_check.detail
