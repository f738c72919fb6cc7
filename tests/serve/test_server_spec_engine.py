"""The engine settings' argv and env: which server of a cell runs which setting (engine_settings)
and the exact vLLM flags of each value (engine_argv, build_argv, build_env)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.spec_decode import speculative_expectation
from harness.serve.deploy import DeployContext, Placement, plan_server
from harness.serve.host.ports import PortAllocator
from harness.serve.launch.server_spec import (ROLES, SPEC_DECODE_CONFIGS, ServerSpec, build_argv, build_env,
                                       engine_argv, engine_settings, kv_transfer_config, Features)
from tests.server_specs import flag, make_spec


def spec(role: str = "decode", device: str = "cuda", **kw) -> ServerSpec:
    return make_spec(role, device, gpu_backend="FLASH_ATTN", **kw)


def served(cell: Cell, role: str) -> ServerSpec:
    """The ServerSpec deploy plans for `role` of `cell` (no process, no port taken)."""
    ctx = DeployContext(allocator=PortAllocator(), placement=Placement(cpu_cores=(0, 1)),
                        log_dir=Path("/logs"), python="/py")
    return plan_server(cell, role, 0, ctx, model_path="/m", hybrid=False, port=8100,
                       side_channel_port=None if role == "baseline" else 5600)


# ---- one flag per value ---------------------------------------------------------------------

@pytest.mark.parametrize("value,flags", [
    ("default", []), ("on", ["--async-scheduling"]), ("off", ["--no-async-scheduling"]),
])
def test_async_scheduling_flags(value, flags):
    assert engine_argv(spec(async_scheduling=value)) == flags


def test_spec_decode_ngram_is_one_speculative_config():
    argv = build_argv(spec(spec_decode="ngram"))
    config = json.loads(flag(argv, "--speculative-config"))
    assert config == SPEC_DECODE_CONFIGS["ngram"]
    assert config["method"] == "ngram" and config["num_speculative_tokens"] >= 1
    assert "--speculative-config" not in build_argv(spec())


def test_prefix_reuse_turns_prefix_caching_on_explicitly():
    assert engine_argv(spec(prefix_caching=True)) == ["--enable-prefix-caching"]
    assert "--enable-prefix-caching" not in build_argv(spec())


@pytest.mark.parametrize("budget,max_seqs", [(64, "64"), (16, "16"), (512, "128")])
def test_chunked_prefill_budget_and_the_max_num_seqs_it_allows(budget, max_seqs):
    argv = engine_argv(spec(device="cpu", max_num_batched_tokens=budget))
    assert argv[0] == "--enable-chunked-prefill"
    assert flag(argv, "--max-num-batched-tokens") == str(budget)
    # vLLM: max_num_batched_tokens must be >= max_num_seqs (CPU default 128)
    assert flag(argv, "--max-num-seqs") == max_seqs and int(max_seqs) <= budget


@pytest.mark.parametrize("budget,max_seqs", [(None, "64"), (512, "64"), (32, "32")])
def test_cuda_servers_batch_at_most_64_sequences(budget, max_seqs):
    # vLLM 0.26's H200 default (1024) costs CUDA-graph captures and V2 warm-up at start-up
    argv = build_argv(spec(device="cuda", max_num_batched_tokens=budget))
    assert flag(argv, "--max-num-seqs") == max_seqs and argv.count("--max-num-seqs") == 1
    assert ("--enable-chunked-prefill" in argv) == (budget is not None)


def test_cpu_servers_keep_vllms_max_num_seqs_without_a_budget():
    assert "--max-num-seqs" not in build_argv(spec(device="cpu"))


@pytest.mark.parametrize("mode", ["FULL", "PIECEWISE", "NONE"])
def test_cudagraph_mode_is_a_compilation_config(mode):
    argv = build_argv(spec(cudagraph_mode=mode))
    assert json.loads(flag(argv, "--compilation-config")) == {"cudagraph_mode": mode}
    assert "--compilation-config" not in build_argv(spec())


def test_engine_flags_come_before_the_cells_extra_args():
    argv = build_argv(spec(async_scheduling="off", extra_args=("--async-scheduling",)))
    assert argv.index("--no-async-scheduling") < argv.index("--async-scheduling")  # the cell's last word


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_kv_layout_is_the_decode_env(layout):
    env = build_env(spec(kv_layout=layout), base_env={})
    assert env["VLLM_KV_CACHE_LAYOUT"] == layout
    assert "VLLM_KV_CACHE_LAYOUT" not in build_env(spec(), base_env={})


def test_an_nhd_decode_permutes_the_hnd_blocks_it_receives():
    nhd = kv_transfer_config(spec(kv_layout="NHD"), Features())
    assert nhd["enable_permute_local_kv"] is True and nhd["kv_role"] == "kv_consumer"
    for same in (spec(kv_layout="HND"), spec(), spec("prefill", kv_layout="NHD")):
        assert "enable_permute_local_kv" not in kv_transfer_config(same, Features())


def test_default_settings_add_nothing():
    assert engine_argv(spec()) == []
    plain = served(Cell(model="m"), "decode")
    assert build_argv(plain) == build_argv(served(Cell(model="m", kv_layout="default"), "decode"))


# ---- which role runs which setting ----------------------------------------------------------

ALL_SET = Cell(model="m", device="cuda", kv_buffer_device="cuda", backend="FLASH_ATTN",
               async_scheduling="off", spec_decode="ngram", prefix_reuse=True, chunked_prefill=64,
               cudagraph_mode="PIECEWISE", kv_layout="NHD")


@pytest.mark.parametrize("role", ROLES)
def test_every_server_runs_scheduling_prefix_caching_chunking_and_cuda_graphs(role):
    argv = build_argv(served(ALL_SET, role))
    assert "--no-async-scheduling" in argv and "--enable-prefix-caching" in argv
    assert flag(argv, "--max-num-batched-tokens") == "64"
    assert json.loads(flag(argv, "--compilation-config")) == {"cudagraph_mode": "PIECEWISE"}


@pytest.mark.parametrize("role,drafts", [("baseline", True), ("prefill", False), ("decode", True)])
def test_speculative_decoding_runs_where_tokens_are_generated(role, drafts):
    """The baseline generates like the decode (the verdict pairs their answers); the prefill
    makes one token and hands its KV over."""
    assert ("--speculative-config" in build_argv(served(ALL_SET, role))) is drafts
    assert (engine_settings(ALL_SET, role)["spec_decode"] == "ngram") is drafts


@pytest.mark.parametrize("role,layout", [("baseline", None), ("prefill", None), ("decode", "NHD")])
def test_the_kv_layout_is_the_decodes_alone(role, layout):
    env = build_env(served(ALL_SET, role), base_env={})
    assert env.get("VLLM_KV_CACHE_LAYOUT") == layout


def test_engine_settings_reject_an_unknown_role():
    with pytest.raises(ValueError, match="unknown server role"):
        engine_settings(ALL_SET, "router")


# ---- a draft model: P and D on their own counts of speculative tokens ----------------------

DRAFT = Cell(model="tiny-llama-gsm", spec_decode="draft_p1_d3")


@pytest.mark.parametrize("role,tokens", [("baseline", 3), ("prefill", 1), ("decode", 3)])
def test_a_draft_model_runs_on_every_server_with_its_roles_count(role, tokens):
    """vLLM's P/D CI runs P with 1 speculative token and D with 3; the baseline generates like
    the decode; the prefill runs the draft too, so both sides hold its KV layers."""
    config = json.loads(flag(build_argv(served(DRAFT, role)), "--speculative-config"))
    assert config["method"] == "draft_model" and config["num_speculative_tokens"] == tokens
    assert config["model"].endswith("harness/zoo/checkpoints/tiny-llama-gsm-draft")


@pytest.mark.parametrize("role,asked", [("baseline", True), ("prefill", False), ("decode", True)])
def test_where_tokens_are_drafted_each_answer_carries_its_acceptance(role, asked):
    """The baseline and the decode answer with their own acceptance (check spec-acceptance
    pairs it by question) where the vLLM has the flag; the prefill drafts nothing to judge."""
    with_flag = Features(spec_decode_metrics_flag=True)
    argv = build_argv(served(DRAFT, role), with_flag)
    assert (flag(argv, "--per-request-spec-decode-metrics") == "summary") is asked
    assert "--per-request-spec-decode-metrics" not in build_argv(served(DRAFT, role))
    assert "--per-request-spec-decode-metrics" not in build_argv(spec(), with_flag)


def test_ngram_stays_off_the_prefill_while_a_draft_model_runs_there():
    assert engine_settings(ALL_SET, "prefill")["spec_decode"] is None
    assert engine_settings(DRAFT, "prefill")["spec_decode"] == "draft_p1_d3"


@pytest.mark.parametrize("role,tokens", [("baseline", 3), ("prefill", 1), ("decode", 3)])
def test_an_eagle_head_runs_on_every_server_with_its_roles_count(role, tokens):
    """eagle_p1_d3 runs the zoo's EAGLE head like draft_p1_d3 runs the draft: on the prefill
    with 1 token (its KV layer exists on both sides), on the decode and the baseline with 3."""
    cell = DRAFT.replace(spec_decode="eagle_p1_d3")
    config = json.loads(flag(build_argv(served(cell, role)), "--speculative-config"))
    assert config["method"] == "eagle" and config["num_speculative_tokens"] == tokens
    assert config["model"].endswith("harness/zoo/checkpoints/tiny-llama-gsm-eagle")
    assert speculative_expectation("eagle_p1_d3", role) == ("eagle", tokens)


@pytest.mark.parametrize("value,role,tokens", [
    ("mtp_p1_d3", "baseline", 3), ("mtp_p1_d3", "prefill", 1), ("mtp_p1_d3", "decode", 3),
    ("mtp_p3_d3", "prefill", 3), ("mtp_p3_d3", "decode", 3)])
def test_an_mtp_head_names_no_model_and_drafts_from_the_served_checkpoint(value, role, tokens):
    """mtp_p1_d3: vLLM's mtp method with no model (vLLM reads the head from the served
    checkpoint), on every server with its role's count; the byte account reads the drafter's
    layers from that same checkpoint."""
    from harness.serve.launch.server_spec import draft_checkpoint, draft_model_path

    cell = Cell(model="tiny-qwen3next-hybrid-gsm-mtp", spec_decode=value)
    spec = served(cell, role)
    config = json.loads(flag(build_argv(spec), "--speculative-config"))
    assert config == {"method": "mtp", "num_speculative_tokens": tokens}
    assert speculative_expectation(value, role) == ("mtp", tokens)
    assert draft_model_path(spec) == spec.model_path
    assert draft_checkpoint("eagle_p1_d3", role, spec.model_path).endswith(
        "harness/zoo/checkpoints/tiny-llama-gsm-eagle")
    assert draft_checkpoint("ngram", role, spec.model_path) is None


@pytest.mark.parametrize("role,tokens", [("baseline", 3), ("prefill", None), ("decode", 3)])
def test_a_draft_on_the_decode_only_leaves_the_prefill_without_it(role, tokens):
    argv = build_argv(served(DRAFT.replace(spec_decode="draft_p0_d3"), role))
    if tokens is None:
        assert "--speculative-config" not in argv
    else:
        assert json.loads(flag(argv, "--speculative-config"))["num_speculative_tokens"] == tokens
