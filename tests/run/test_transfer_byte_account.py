"""The byte account of a pair: geometry from the model, state bytes from the decode's log."""
from __future__ import annotations

from pathlib import Path

from harness.eval.metrics import TransferCounters
from harness.run.evidence.transfer_evidence import (ByteGeometry, forced_block_size_from_logs,
                                                    state_bytes_from_logs, transfer_proof)

ZOO = Path(__file__).resolve().parents[2] / "harness" / "zoo" / "checkpoints"
LINE = ("(Worker pid=30126) INFO 12-01 14:35:21 [base_worker.py:1761] Hybrid SSM registration: "
        "num_blocks=16384, ratio=1, mamba_ssm_size=(3264, 32768), block_len_per_layer={65536}\n")


def record(blocks: list[int]) -> dict:
    p = {"remote_block_ids": [list(range(n)) for n in blocks], "remote_engine_id": "e"}
    return {"request_id": "r", "received_kv_transfer_params": p, "sent_kv_transfer_params": p}


def test_state_bytes_come_from_the_decode_log(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text("noise\n" + LINE)
    assert state_bytes_from_logs([str(tmp_path / "missing.log"), str(log)]) == 36_032
    assert state_bytes_from_logs([]) is None


def test_hybrid_pair_is_accounted_exactly_with_the_logged_state(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text(LINE)
    geo = ByteGeometry.of_pair(str(ZOO / "tiny-granite-hybrid-gsm"), "bfloat16", 128)
    delta = TransferCounters(kv_bytes=2 * 560_320.0, prompt_tokens_external=900.0)
    proof = transfer_proof([record([1, 4, 4])] * 2, delta, True, [str(log)], geo)
    assert proof.byte_account["exact"] and proof.byte_account_skipped is None


def test_without_the_state_line_or_geometry_the_account_is_skipped_with_its_reason(tmp_path):
    geo = ByteGeometry.of_pair(str(ZOO / "tiny-granite-hybrid-gsm"), "bfloat16", 128)
    delta = TransferCounters(kv_bytes=1.0)
    proof = transfer_proof([record([1, 4, 4])], delta, True, [], geo)
    assert proof.byte_account is None and "mamba_ssm_size" in proof.byte_account_skipped
    missing = ByteGeometry.of_pair(str(tmp_path), "bfloat16", 128)
    assert "not readable" in transfer_proof([], delta, False, [], missing).byte_account_skipped
    assert "not a harness-started pair" in transfer_proof([], delta, False, []).byte_account_skipped


def test_a_dense_pair_short_of_bytes_is_not_exact():
    geo = ByteGeometry.of_pair(str(ZOO / "tiny-llama-gsm"), "bfloat16", 128)
    delta = TransferCounters(kv_bytes=39_321_600.0)
    proof = transfer_proof([record([4])] * 50, delta, False, [], geo)
    assert not proof.byte_account["exact"] and proof.byte_account["expected"] == 52_428_800


def test_a_draft_pair_moves_the_drafts_layers_too():
    """Both sides run tiny-llama-gsm-draft: 4 target + 2 draft layers of the same page cross,
    3,072 bytes a token; the target's geometry alone would call that an excess of 50 %."""
    delta = TransferCounters(kv_bytes=78_643_200.0)
    geo = ByteGeometry.of_pair(str(ZOO / "tiny-llama-gsm"), "bfloat16", 128,
                               draft_model_path=str(ZOO / "tiny-llama-gsm-draft"))
    proof = transfer_proof([record([4])] * 50, delta, False, [], geo)
    assert proof.byte_account["exact"] and proof.byte_account["expected"] == 78_643_200
    alone = ByteGeometry.of_pair(str(ZOO / "tiny-llama-gsm"), "bfloat16", 128)
    assert not transfer_proof([record([4])] * 50, delta, False, [], alone).byte_account["exact"]


FORCED = ("(APIServer pid=21243) WARNING 12-01 22:53:01 [cpu.py:275] CPU MLA backend requires "
          "block_size=16, overriding user-specified block_size=128.\n")


def test_the_block_size_vllm_forced_comes_from_the_log(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text("noise\n" + FORCED)
    assert forced_block_size_from_logs([str(log)]) == 16
    assert forced_block_size_from_logs([str(tmp_path / "missing.log")]) is None


def test_an_mla_pair_is_accounted_at_the_forced_block_size(tmp_path):
    """results/reference/cpu-mla-20261201: 2,906 blocks of 16 tokens x 2 layers x 576 x 2 B
    were exactly the decode's NIXL bytes, though the cell asked for block 128."""
    import json

    from harness.zoo.random_mla import config_kwargs

    model = tmp_path / "mla"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config_kwargs()))
    log = tmp_path / "decode.log"
    log.write_text(FORCED)
    geo = ByteGeometry.of_pair(str(model), "bfloat16", 128)
    delta = TransferCounters(kv_bytes=107_126_784.0, prompt_tokens_external=45_847.0)
    records = [record([29]) for _ in range(94)] + [record([30]) for _ in range(6)]  # 2,906
    proof = transfer_proof(records, delta, False, [str(log)], geometry=geo)
    assert proof.byte_account["exact"], proof.byte_account
    log.write_text("no override line\n")   # at the cell's 128 the count is 8x too high
    proof = transfer_proof(records, delta, False, [str(log)], geometry=geo)
    assert not proof.byte_account["exact"]


def test_a_push_pair_is_accounted_from_the_prefills_blocks_and_its_own_params_count():
    """NixlPushConnector: the decode is sent coordinates, never block ids; the blocks that crossed
    are those the prefill answered, and a request's own params are the push params of its own
    prefill's answer."""
    from harness.connectors import connector_for

    geo = ByteGeometry.of_pair(str(ZOO / "tiny-llama-gsm"), "bfloat16", 128)
    push = connector_for("nixl-push")
    rec = record([4])
    records = [{**rec, "kv_connector": "nixl-push",
                "sent_kv_transfer_params": push.decode_params(rec["received_kv_transfer_params"])}
               for _ in range(50)]
    delta = TransferCounters(kv_bytes=52_428_800.0, prompt_tokens_external=50 * 512.0)
    proof = transfer_proof(records, delta, False, [], geo)
    assert proof.byte_account["exact"], proof.byte_account
    assert proof.requests_own_params == proof.requests_sent_params == 50
    # read as pull records (no kv_connector: a record from before the seam), they are foreign
    old = [{k: v for k, v in r.items() if k != "kv_connector"} for r in records]
    assert transfer_proof(old, delta, False, [], geo).requests_own_params == 0


def test_a_connector_the_digest_plugin_does_not_hook_leaves_the_digest_out_saying_why(
        monkeypatch):
    import dataclasses
    from types import SimpleNamespace

    from harness.run.evidence import transfer_evidence
    from harness.run.evidence.transfer_evidence import DigestFiles
    from harness.connectors.nixl.push import CONNECTOR as PUSH

    def pair(connector: str):
        specs = [SimpleNamespace(role=role, block_size=128, kv_connector=connector)
                 for role in ("prefill", "decode")]
        return SimpleNamespace(specs=specs, kv_digest=True,
                               digest_files=lambda role: [f"{role}.kv-digest.jsonl"])

    # the plugin listens on vLLM's connector interface: both NIXL classes are hooked
    assert DigestFiles.of_pair(pair("nixl")).skipped is None
    assert DigestFiles.of_pair(pair("nixl-push")).skipped is None
    unhooked = dataclasses.replace(PUSH, kv_digest=False)
    monkeypatch.setattr(transfer_evidence, "connector_for", lambda value: unhooked)
    skipped = DigestFiles.of_pair(pair("nixl-push")).skipped
    assert skipped == "the kv-digest plugin does not hook NixlPushConnector"
    proof = transfer_proof([], TransferCounters(), False, [],
                           digests=DigestFiles.of_pair(pair("nixl-push")))
    assert proof.kv_digest is None and proof.kv_digest_skipped == skipped


def test_a_connector_whose_prefill_answers_nothing_counts_the_proxys_handle_and_says_so():
    from harness.eval.metrics import TransferCounters
    from harness.run.evidence.transfer_evidence import transfer_proof
    from harness.connectors import connector_for

    mooncake = connector_for("mooncake")
    handle = {"transfer_id": "xfer-pdacc-1", "remote_engine_id": "pdacc-mooncake-5600",
              "remote_bootstrap_addr": "http://127.0.0.1:5600"}
    record = {"request_id": "pdacc-1", "kv_connector": "mooncake",
              "received_kv_transfer_params": None, "kv_transfer_handle": handle,
              "sent_kv_transfer_params": mooncake.decode_params(handle)}
    dropped = {**record, "request_id": "pdacc-2", "sent_kv_transfer_params": None}
    proof = transfer_proof([record, dropped], TransferCounters(), hybrid=False, decode_logs=[])
    assert (proof.requests_with_params, proof.requests_sent_params) == (2, 1)
    assert proof.requests_own_params == 1 and proof.params_named_by_proxy == 2
    assert proof.byte_account is None and "cannot say" in proof.byte_account_skipped


def test_a_padded_recurrent_hybrid_or_unexpected_groups_leave_the_account_out_saying_why(tmp_path):
    import json

    model = tmp_path / "padded-hybrid"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
        "num_hidden_layers": 5,
        "layer_types": ["attention", "mamba", "attention", "mamba", "attention"]}))
    log = tmp_path / "decode.log"
    log.write_text(LINE)
    delta = TransferCounters(kv_bytes=1.0, prompt_tokens_external=900.0)
    proof = transfer_proof([record([1, 4, 4])], delta, True, [str(log)],
                           ByteGeometry.of_pair(str(model), "bfloat16", 128))
    assert proof.byte_account is None and "groups are padded" in proof.byte_account_skipped
    # a sliding model whose params list other groups than vLLM's grouping gives
    swa = ByteGeometry.of_pair(str(ZOO / "tiny-llama-swa-gsm"), "bfloat16", 128)
    proof = transfer_proof([record([1, 4, 4])], delta, False, [], swa)
    assert proof.byte_account is None
    assert proof.byte_account_skipped.startswith("the params list 3 KV cache groups")
