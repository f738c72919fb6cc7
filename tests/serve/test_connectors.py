"""The KV connector seam: the one table, what each connector gives the servers, the proxy and
the evidence, and how the harness reads a pair's counters and proxy records through it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.connectors import (CONNECTORS, DEFAULT_KV_CONNECTOR, KV_CONNECTORS, connector_for,
                                connector_row, driven_connectors)
from harness.connectors.driver import KV_COUNTERS, KvConnector, MetricMap
from harness.eval.metrics import TransferCounters, parse_transfer_counters
from harness.serve.launch.server_spec import Features, ServerSpec, build_argv, build_env

DATA = Path(__file__).resolve().parents[1] / "data" / "metrics"
AFTER_PD = (DATA / "decode_after_pd_request.txt").read_text()
PULL, PUSH = connector_for("nixl"), connector_for("nixl-push")
RECEIVED = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e-p",
            "remote_request_id": "r-1", "remote_block_ids": [[3, 4, 5]], "remote_host": "10.0.0.1",
            "remote_port": 5600, "tp_size": 1, "transfer_mode": "push"}


def test_every_driven_row_has_a_registered_connector_and_no_other_row_one():
    assert set(CONNECTORS) == set(driven_connectors())


@pytest.mark.parametrize("value", driven_connectors())
def test_every_driven_row_has_a_connector_of_its_own(value):
    connector = connector_for(value)
    assert isinstance(connector, KvConnector)
    assert connector.value == value and connector.vllm_name == connector_row(value).vllm_name
    assert set(connector.metrics.samples.values()) <= set(KV_COUNTERS)


def test_an_unknown_connector_names_the_known_ones():
    with pytest.raises(KeyError, match="nixl, nixl-push"):
        connector_for("no-such")


def test_a_driven_row_no_driver_serves_says_so(monkeypatch):
    monkeypatch.setitem(KV_CONNECTORS, "unregistered", KV_CONNECTORS["nixl"])
    with pytest.raises(KeyError, match="its package lists no driver for it"):
        connector_for("unregistered")


def test_a_connector_the_harness_does_not_drive_says_why():
    with pytest.raises(KeyError, match="not driven by the harness: .*alias|old name"):
        connector_for("nixl-pull")


# vLLM CPU 0.32's KVConnectorFactory registrations (vllm/distributed/kv_transfer/kv_connector/
# factory.py): the table has a row for each, so `list --show-excluded` names every one
VLLM_032_CONNECTORS = {
    "ExampleConnector", "ExampleHiddenStatesConnector", "LMCacheConnectorV1",
    "LMCacheMPConnector", "NixlConnector", "NixlPullConnector", "NixlPushConnector",
    "MultiConnector", "HiSparseConnector", "MoRIIOConnector", "OffloadingConnector",
    "DecodeBenchConnector", "MooncakeConnector", "MooncakeStoreConnector", "FlexKVConnectorV1",
    "SimpleCPUOffloadConnector", "HF3FSKVConnector"}


def test_every_connector_vllm_registers_has_a_row_with_its_reason_when_not_driven():
    assert {row.vllm_name for row in KV_CONNECTORS.values()} == VLLM_032_CONNECTORS
    for value, row in KV_CONNECTORS.items():
        # a connector is driven, or moves no KV, or says why the harness does not drive it
        assert row.driven or row.moves_kv or row.not_driven, value
        assert set(row.devices) <= {"cpu", "cuda", "rocm"}, value


def test_the_docs_count_the_connectors_the_harness_does_not_drive():
    text = (Path(__file__).resolve().parents[2] / "docs" / "connectors.md").read_text()
    said = int(re.search(r"The other (\d+) connectors vLLM registers", text).group(1))
    assert said == len(KV_CONNECTORS) - len(driven_connectors())


def test_the_installed_vllm_registers_exactly_the_table():
    factory = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.factory")
    assert set(factory.KVConnectorFactory._registry) == VLLM_032_CONNECTORS


def test_a_metric_map_takes_only_neutral_counters():
    with pytest.raises(ValueError, match="nixl_bytes"):
        MetricMap({"vllm:nixl_bytes_transferred_sum": "nixl_bytes"})


def test_the_default_cell_keeps_its_id_and_another_connector_shares_its_baseline():
    plain = Cell(model="tiny-llama-gsm", compile="eager")
    push = plain.replace(kv_connector="nixl-push")
    assert plain.kv_connector == DEFAULT_KV_CONNECTOR
    assert plain.cell_id == "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager"
    assert push.cell_id == plain.cell_id + "-kvc_nixl_push"
    assert push.baseline_key == plain.baseline_key
    assert Cell.from_dict({k: v for k, v in push.to_dict().items()}) == push
    assert Cell.from_dict({"model": "m"}).kv_connector == DEFAULT_KV_CONNECTOR   # an old record


def spec(role: str, connector: str, **kw) -> ServerSpec:
    return ServerSpec(role=role, index=0, model_path="/m", served_model_name="m", port=8000,
                      backend="CPU_ATTN", block_size=128, kv_connector=connector,
                      side_channel_port=5600, **kw)


@pytest.mark.parametrize("value,vllm_name", [("nixl", "NixlConnector"), ("nixl-push", "NixlPushConnector")])
def test_servers_get_the_connectors_config_and_side_channel(value, vllm_name):
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        argv = build_argv(spec(role, value), Features())
        config = argv[argv.index("--kv-transfer-config") + 1]
        assert f'"kv_connector":"{vllm_name}"' in config and f'"kv_role":"{kv_role}"' in config
        env = build_env(spec(role, value), Features(), base_env={})
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    baseline = spec("baseline", value)
    assert "--kv-transfer-config" not in build_argv(baseline, Features())
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in build_env(baseline, Features(), base_env={})


def test_an_nhd_decode_permutes_nixls_blocks_on_receipt():
    assert PULL.kv_transfer_config("decode", kv_role="kv_consumer", kv_buffer_device="cpu",
                                   kv_layout="NHD")["enable_permute_local_kv"] is True
    assert "enable_permute_local_kv" not in PULL.kv_transfer_config(
        "prefill", kv_role="kv_producer", kv_buffer_device="cpu", kv_layout="NHD")


def test_pull_hands_the_decode_what_the_prefill_answered():
    assert PULL.decode_params(RECEIVED) == RECEIVED
    assert PULL.decode_params(None) is None
    assert PULL.block_params(RECEIVED, RECEIVED) == RECEIVED


def test_push_hands_the_decode_coordinates_and_accounts_the_prefills_blocks():
    sent = PUSH.decode_params(RECEIVED)
    assert sent == {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e-p",
                    "remote_request_id": "r-1", "remote_host": "10.0.0.1", "remote_port": 5600,
                    "tp_size": 1}
    assert PUSH.decode_params(None) is None and PUSH.decode_params({}) is None
    # the blocks that crossed are the prefill's, for a request whose decode asked for a push
    assert PUSH.block_params(RECEIVED, sent) == RECEIVED
    assert PUSH.block_params(RECEIVED, None) is None


def test_push_counters_come_from_the_writer():
    """A pull decode READs and counts; a push prefill WRITEs and counts: the same page read as
    the other role gives the prompt tokens only (decode) or the transfer counters only (prefill)."""
    pull = parse_transfer_counters(AFTER_PD, PULL.metrics, "decode")
    assert pull.kv_bytes == pytest.approx(1.1e6) and pull.prompt_tokens_external == 1088.0
    push_decode = parse_transfer_counters(AFTER_PD, PUSH.metrics, "decode")
    assert push_decode.kv_bytes == 0.0 and push_decode.kv_transfers == 0.0
    assert push_decode.prompt_tokens_external == 1088.0
    assert push_decode.failed_notifications == pull.failed_notifications
    push_prefill = parse_transfer_counters(AFTER_PD, PUSH.metrics, "prefill")
    assert push_prefill.kv_bytes == pytest.approx(1.1e6) and push_prefill.kv_transfers == 1.0
    assert push_prefill.prompt_tokens_external == 0.0 and push_prefill.requests_finished == 0.0
    assert push_decode.plus(push_prefill) == pull
    assert TransferCounters().plus(pull) == pull


MOONCAKE = connector_for("mooncake")


def test_mooncake_prefill_gets_a_named_transfer_and_a_bootstrap_port_of_its_own():
    prefill = spec("prefill", "mooncake")
    argv = build_argv(prefill, Features())
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "MooncakeConnector" and config["kv_role"] == "kv_producer"
    assert config["kv_connector_extra_config"] == {"mooncake_protocol": "tcp"}
    assert config["engine_id"] == "pdacc-mooncake-5600"
    assert build_env(prefill, Features(), base_env={})["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "5600"
    decode = json.loads(_config(spec("decode", "mooncake")))
    assert "engine_id" not in decode and decode["kv_role"] == "kv_consumer"


def _config(server: ServerSpec) -> str:
    argv = build_argv(server, Features())
    return argv[argv.index("--kv-transfer-config") + 1]


def test_mooncake_decode_params_are_what_the_proxy_named_since_the_prefill_answers_none():
    assert MOONCAKE.prefill_answers_params is False
    sent = MOONCAKE.prefill_params_for("pdacc-abc")
    assert sent == {"do_remote_decode": True, "do_remote_prefill": False,
                    "transfer_id": "xfer-pdacc-abc"}
    handle = MOONCAKE.prefill_answer(None, sent=sent, side="127.0.0.1:5600")
    assert handle == {"transfer_id": "xfer-pdacc-abc", "remote_engine_id": "pdacc-mooncake-5600",
                      "remote_bootstrap_addr": "http://127.0.0.1:5600"}
    assert MOONCAKE.decode_params(handle) == {"do_remote_prefill": True, "do_remote_decode": False,
                                              **handle}
    assert MOONCAKE.prefill_answer(None, sent=sent, side=None) is None   # no side channel known
    assert MOONCAKE.decode_params(None) is None
    assert MOONCAKE.block_params(handle, handle) is None and MOONCAKE.byte_accounting is None
    # NIXL's prefill answers: the answer is what it said
    assert PULL.prefill_answer(RECEIVED, sent={}, side="h:1") == RECEIVED


def test_mooncake_counters_come_from_the_writer_and_the_decodes_failed_reads():
    page = ("# TYPE vllm:mooncake_bytes_transferred counter\n"
            'vllm:mooncake_bytes_transferred_total{engine="0"} 4096.0\n'
            "# TYPE vllm:mooncake_transfers counter\n"
            'vllm:mooncake_transfers_total{engine="0"} 2.0\n'
            "# TYPE vllm:mooncake_num_failed_recvs counter\n"
            'vllm:mooncake_num_failed_recvs_total{engine="0"} 1.0\n')
    prefill = parse_transfer_counters(page, MOONCAKE.metrics, "prefill")
    decode = parse_transfer_counters(page, MOONCAKE.metrics, "decode")
    assert (prefill.kv_bytes, prefill.kv_transfers, prefill.failed_notifications) == (4096, 2, 0)
    assert (decode.kv_bytes, decode.failed_notifications) == (0, 1)


def test_multiconnector_nests_nixl_and_offloading_in_vllms_ci_shape():
    multi = connector_for("multi-nixl-offload")
    config = multi.kv_transfer_config("decode", kv_role="kv_consumer", kv_buffer_device="cuda",
                                      kv_layout="NHD")
    assert config["kv_connector"] == "MultiConnector" and config["kv_role"] == "kv_consumer"
    nixl, offload = config["kv_connector_extra_config"]["connectors"]
    assert nixl["kv_connector"] == "NixlConnector" and nixl["enable_permute_local_kv"] is True
    assert offload["kv_connector"] == "OffloadingConnector"
    assert offload["kv_connector_extra_config"]["cpu_bytes_to_use"] > 0
    assert multi.metrics.samples == PULL.metrics.samples and multi.byte_accounting == "blocks"


def test_multiconnector_alone_wraps_nixl_only_and_runs_where_nixl_runs():
    multi = connector_for("multi-nixl")
    config = multi.kv_transfer_config("prefill", kv_role="kv_producer", kv_buffer_device="cpu")
    assert [c["kv_connector"] for c in config["kv_connector_extra_config"]["connectors"]] == [
        "NixlConnector"]
    assert "cpu" in connector_row("multi-nixl").devices
    assert "cpu" not in connector_row("multi-nixl-offload").devices


EXAMPLE = connector_for("example")


def test_example_servers_share_one_path_producer_and_consumer():
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        argv = build_argv(spec(role, "example", kv_shared_path="/logs/pair-x.kv-files"), Features())
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config == {"kv_connector": "ExampleConnector", "kv_role": kv_role,
                          "kv_connector_extra_config": {
                              "shared_storage_path": "/logs/pair-x.kv-files"}}
        assert not {k for k in build_env(spec(role, "example"), Features(), base_env={})
                    if "NIXL" in k or "MOONCAKE" in k}
    # a connector that takes no shared path gets none, even when a spec carries one
    nixl = build_argv(spec("decode", "nixl", kv_shared_path="/logs/x"), Features())
    assert "shared_storage_path" not in nixl[nixl.index("--kv-transfer-config") + 1]


def test_example_sends_no_params_and_cannot_be_held_to_param_or_counter_checks():
    assert EXAMPLE.prefill_answer(None, sent={}, side="127.0.0.1:1") is None
    assert EXAMPLE.decode_params(None) is None and EXAMPLE.decode_params(RECEIVED) is None
    assert EXAMPLE.block_params(RECEIVED, RECEIVED) is None
    assert not EXAMPLE.prefill_answers_params and EXAMPLE.byte_accounting is None
    assert EXAMPLE.metrics.samples == {} and EXAMPLE.kv_digest
    lines = EXAMPLE.not_available_lines()
    assert set(lines) == {"prefill-returned-params", "decode-got-params",
                          "decode-got-own-params", "no-failed-transfers",
                          "decode-did-not-recompute", "kv-bytes-exact"}
    assert all(line.startswith(f"{check}: not available for example: ")
               for check, line in lines.items())
    assert PULL.not_available_lines() == {}
    assert connector_row("example").no_params and connector_row("nixl").no_params is None
