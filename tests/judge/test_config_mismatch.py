"""A cell whose servers ran something other than its id says is not judged as that cell."""
from __future__ import annotations

import json
from pathlib import Path

from harness.core.cell import Cell
from harness.core.outcomes import ERROR, EXIT_ERROR, PASS, XFAIL
from harness.judge.effective_config import judged_as_ran, mismatches
from harness.judge.verdict import Check, Verdict
from harness.core.options import RunOptions
from harness.run.evidence.effective_config_evidence import record_judged, with_effective_config
from harness.run.record import Recorder
from harness.protocol.effective_config import parse_server_log

LOGS = Path(__file__).resolve().parents[1] / "data" / "server_logs"
DECODE = (LOGS / "cpu-llama-p32-decode.log").read_text()
BASELINE = (LOGS / "cpu-llama-p32-baseline.log").read_text()
RAISED = ("(EngineCore pid=1) INFO 12-03 16:00:00 [interface.py:1097] Setting attention block size "
          "to 64 tokens to ensure that attention page size is >= mamba page size.\n")
CELL = Cell(model="tiny-llama-gsm", prefill_block_size=32, decode_block_size=32, compile="eager")
PASSED = Verdict(PASS, "P/D is not worse than the baseline", checks=(Check("transfer", True, "ok"),))


def configs(decode_extra: str = "") -> dict:
    return {"baseline": parse_server_log("baseline", BASELINE),
            "prefill-0": parse_server_log("prefill-0", DECODE),
            "decode-0": parse_server_log("decode-0", DECODE + decode_extra)}


def test_servers_that_ran_the_cell_keep_the_verdict():
    verdict = judged_as_ran(PASSED, CELL, configs())
    assert verdict.status == PASS and verdict.reason == PASSED.reason
    assert verdict.checks[-1] == Check("effective-config", True, "servers ran the cell's configuration")


def test_a_decode_that_ran_another_block_is_error_with_the_reason():
    verdict = judged_as_ran(PASSED, CELL, configs(RAISED))
    assert verdict.status == ERROR and verdict.outcome == ERROR and verdict.exit_code == EXIT_ERROR
    assert "decode ran block 64, the cell says 32" in verdict.reason
    assert verdict.reason.endswith("decode ran block 64, the cell says 32")
    assert verdict.checks[-1].name == "effective-config" and not verdict.checks[-1].passed
    assert "own verdict would have been PASS" in verdict.checks[-1].detail
    assert verdict.decision_path[-1] == "effective-config"


def test_every_stated_difference_is_named_and_asked_values_are_not_compared():
    cell = Cell(model="m", prefill_block_size=32, decode_block_size=32, compile="default",
                backend="CPU_ATTN", runner="v1")
    lines = mismatches(cell, configs())
    assert lines == ["baseline ran eager, the cell says default", "prefill ran eager, the cell says default",
                     "decode ran eager, the cell says default"]
    # the baseline's backend is only asked (no line of its own): not compared
    assert mismatches(Cell(model="m", backend="FLASH_ATTN", prefill_block_size=32,
                           decode_block_size=32, compile="eager"), configs())[0] == \
        "prefill ran CPU_ATTN, the cell says FLASH_ATTN"
    # an MLA model on CPU: vLLM CPU serves CPU_ATTN with its MLA backend (the mla-backend
    # rule), but the block it forces is not the cell's
    mla = parse_server_log("decode-0", DECODE.replace("['CPU_ATTN']", "['CPU_MLA']")
                           + "(APIServer pid=1) WARNING 12-03 16:00:00 [cpu.py:276] CPU MLA backend "
                           "requires block_size=16, overriding user-specified block_size=32.\n")
    assert mla.attention_backend == "CPU_MLA"
    assert mismatches(CELL, {"decode-0": mla}) == ["decode ran block 16, the cell says 32"]


def test_an_expected_failure_matches_the_misconfiguration_not_the_verdict_it_hid():
    hidden = Verdict(ERROR, "the baseline itself is broken here", expected_failure="upstream bug",
                     expected_failure_match="the baseline itself is broken")
    assert judged_as_ran(hidden, CELL, configs(RAISED)).outcome == ERROR
    declared = Verdict(PASS, "ok", expected_failure="vLLM forces it",
                       expected_failure_match="decode ran block 64, the cell says 32")
    assert judged_as_ran(declared, CELL, configs(RAISED)).outcome == XFAIL


def raised_block_logs(tmp_path: Path) -> dict[str, str]:
    """Server logs of a pair whose decode ran block 64 where the cell says 32."""
    logs = {}
    for role, text in (("baseline", BASELINE), ("prefill-0", DECODE), ("decode-0", DECODE + RAISED)):
        path = tmp_path / f"{role}.log"
        path.write_text(text)
        logs[role] = str(path)
    logs["proxy"] = str(tmp_path / "proxy.log")
    return logs


def test_the_record_gets_each_servers_effective_config(tmp_path):
    verdict, effective = with_effective_config(CELL, PASSED, {"logs": raised_block_logs(tmp_path)})
    assert set(effective) == {"baseline", "prefill-0", "decode-0"}
    assert effective["decode-0"]["block_size"] == 64 and json.dumps(effective)
    assert verdict.status == ERROR
    assert with_effective_config(CELL, PASSED, {"logs": {"decode-0": str(tmp_path / "gone")}}) == (PASSED, None)


def test_a_real_hybrid_decode_ran_its_cell():
    """The zoo Granite hybrid's decode, p128 eager on vLLM CPU 0.32 (run 20261203T161959Z-715284):
    NIXL lists MAMBA2_ATTN before CPU_ATTN and vLLM keeps block 128 (padding the Mamba page)."""
    text = (LOGS / "cpu-granite-hybrid-p128-decode.log").read_text()
    decode = parse_server_log("decode-0", text)
    assert (decode.block_size, decode.attention_backend, decode.kv_cache_layout) == (128, "CPU_ATTN", "LBHNC")
    cell = Cell(model="tiny-granite-hybrid-gsm", compile="eager",
                extra_env=(("VLLM_SSM_CONV_STATE_LAYOUT", "DS"),))
    assert mismatches(cell, {"decode-0": decode}) == []
    assert mismatches(Cell(model="m", prefill_block_size=64, decode_block_size=64, compile="eager"),
                      {"decode-0": decode}) == ["decode ran block 128, the cell says 64"]


def _speculating(log: str, method: str, tokens: int) -> str:
    return log.replace("speculative_config=None", f"speculative_config=SpeculativeConfig("
                       f"method='{method}', model='/d', num_spec_tokens={tokens})")


def test_a_draft_cell_holds_each_server_to_its_own_count_of_speculative_tokens():
    cell = CELL.replace(spec_decode="draft_p1_d3")
    ran = {"baseline": parse_server_log("baseline", _speculating(BASELINE, "draft_model", 3)),
           "prefill-0": parse_server_log("prefill-0", _speculating(DECODE, "draft_model", 1)),
           "decode-0": parse_server_log("decode-0", _speculating(DECODE, "draft_model", 3))}
    assert ran["prefill-0"].speculative_tokens == 1
    assert mismatches(cell, ran) == []
    # a decode that drafted 1 token (the prefill's count), and a prefill without the draft
    ran["decode-0"] = parse_server_log("decode-0", _speculating(DECODE, "draft_model", 1))
    ran["prefill-0"] = parse_server_log("prefill-0", DECODE)
    assert mismatches(cell, ran) == ["prefill ran speculative decoding none, the cell says draft_model",
                                     "decode ran 1 speculative tokens, the cell says 3"]
    # ngram stays the decode's and the baseline's: a prefill with no drafts ran the cell
    ngram = {"prefill-0": parse_server_log("prefill-0", DECODE)}
    assert mismatches(CELL.replace(spec_decode="ngram"), ngram) == []


def test_an_eagle_cell_holds_every_server_to_the_eagle_method():
    cell = CELL.replace(spec_decode="eagle_p1_d3")
    ran = {"prefill-0": parse_server_log("prefill-0", _speculating(DECODE, "eagle", 1)),
           "decode-0": parse_server_log("decode-0", _speculating(DECODE, "eagle", 3))}
    assert mismatches(cell, ran) == []
    ran["decode-0"] = parse_server_log("decode-0", _speculating(DECODE, "draft_model", 3))
    assert mismatches(cell, ran) == [
        "decode ran speculative decoding draft_model, the cell says eagle"]


def test_the_recorder_stores_the_verdict_it_is_given_judged_once_before(tmp_path):
    logs = raised_block_logs(tmp_path)
    recorder = Recorder(RunOptions(results_dir=str(tmp_path)), {"margin": 0.05}, "run-1",
                        tmp_path, lambda line: None)
    as_given = recorder.record(CELL, PASSED, artifacts={"logs": logs})
    assert as_given.verdict is PASSED and as_given.record["verdict"]["status"] == PASS
    assert as_given.record["effective_config"] is None
    assert as_given.record["options"]["policy"] == {"margin": 0.05}
    declared = CELL.replace(expected_failure="ran another block", expected_failure_match="block 64")
    judged = record_judged(recorder, declared, PASSED, artifacts={"logs": logs})
    assert judged.verdict.status == ERROR and judged.verdict.outcome == XFAIL
    assert judged.record["effective_config"]["decode-0"]["block_size"] == 64
    assert json.loads(judged.record_path.read_text())["verdict"]["outcome"] == XFAIL
