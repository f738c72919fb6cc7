"""Reading back what a vLLM server ran, from its log and /metrics text (vLLM CPU 0.32 logs of a
smoke cell's decode and baseline, tests/data/server_logs/, and the lines vLLM prints when it
changes what it was asked)."""
from __future__ import annotations

from pathlib import Path

from harness.protocol.effective_config import cache_config_info, parse_server_log, summary

LOGS = Path(__file__).resolve().parents[1] / "data" / "server_logs"
DECODE = (LOGS / "cpu-llama-p32-decode.log").read_text()
BASELINE = (LOGS / "cpu-llama-p32-baseline.log").read_text()
RAISED = ("(EngineCore pid=1) INFO 12-03 16:00:00 [interface.py:1097] Setting attention block size "
          "to 128 tokens to ensure that attention page size is >= mamba page size.\n")


def test_a_pd_decode_log_states_what_it_ran():
    c = parse_server_log("decode-0", DECODE)
    assert (c.block_size, c.attention_backend, c.kv_cache_dtype, c.kv_cache_layout, c.runner,
            c.tensor_parallel_size, c.enforce_eager, c.speculative_config, c.prefix_caching,
            c.chunked_prefill) == (32, "CPU_ATTN", "bfloat16", "LBHNC", "v1", 1, True, "none",
                                   True, True)
    assert c.sources["attention_backend"] == "log"            # NIXL's "Detected attention backend(s)"
    assert c.sources["block_size"] == "log: the block asked for, no change logged"
    assert c.kernel_block_size is None and "kernel_block_size" in c.not_exposed
    assert "async_scheduling" in c.not_exposed


def test_a_baseline_states_no_backend_so_it_is_marked_asked():
    c = parse_server_log("baseline", BASELINE)
    assert c.attention_backend == "CPU_ATTN" and c.sources["attention_backend"].startswith("asked")
    assert "attention_backend" in c.not_exposed
    assert summary({"baseline": c.to_dict()}) == "baseline: block 32, CPU_ATTN?, bfloat16, LBHNC, v1"
    # a log cut before the engine started states no block of its own
    cut = parse_server_log("baseline", BASELINE.split("Initializing a V1")[0])
    assert cut.sources["block_size"].startswith("asked")


def test_vllm_changing_the_block_is_what_the_server_ran():
    raised = parse_server_log("decode-0", DECODE + RAISED)
    assert raised.block_size == 128 and raised.requested_block_size == 32
    assert raised.sources["block_size"] == "log: vLLM raised it to the Mamba page"
    forced = parse_server_log("decode-0", DECODE + "(APIServer pid=1) WARNING 12-03 16:00:00 "
                              "[cpu.py:276] CPU MLA backend requires block_size=16, overriding "
                              "user-specified block_size=32.\n")
    assert forced.block_size == 16 and forced.sources["block_size"] == "log: the backend forced it"


def test_backend_runner_async_and_spec_lines():
    text = BASELINE + ("(APIServer pid=1) INFO 12-03 16:00:00 [cpu.py:178] Cannot use "
                       "AttentionBackendEnum.FLASH_ATTN backend on CPU.\n"
                       "(APIServer pid=1) WARNING 12-03 16:00:00 [vllm.py:1606] Async scheduling "
                       "not supported with ngram-based speculative decoding and will be disabled.\n")
    c = parse_server_log("baseline", text)
    assert c.attention_backend == "CPU_ATTN" and "FLASH_ATTN" in c.sources["attention_backend"]
    assert c.async_scheduling is False
    spec = parse_server_log("decode-0", DECODE.replace(
        "speculative_config=None", "speculative_config=SpeculativeConfig(method='ngram', "
        "model=None, num_spec_tokens=3)"))
    assert spec.speculative_config == "ngram"
    v2 = parse_server_log("decode-0", "(Worker pid=1) INFO 12-03 16:00:00 [model_runner.py:392] "
                          "Loading model from scratch...\n")
    assert v2.runner == "v2"


def test_metrics_cache_config_info_wins_for_the_block():
    metrics = ('# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="128",'
               'cache_dtype="auto",engine="0",kv_cache_layout="LBHNC"} 1.0\n')
    assert cache_config_info(metrics)["block_size"] == "128"
    c = parse_server_log("decode-0", DECODE, metrics)
    assert c.block_size == 128 and c.sources["block_size"] == "/metrics vllm:cache_config_info"


def test_an_empty_log_states_nothing():
    c = parse_server_log("decode-0", "")
    assert c.block_size is None and c.sources == {} and set(c.not_exposed) >= {"kernel_block_size"}
    assert summary(None) == "-"


def test_a_hybrids_state_backend_is_not_its_attention_backend():
    """vLLM CPU 0.32, the zoo Granite hybrid's decode: NIXL lists the Mamba layers' backend first."""
    line = ("(Worker pid=16189) INFO 12-03 16:20:46 [base_worker.py:861] Detected attention "
            "backend(s) ['MAMBA2_ATTN', 'CPU_ATTN']\n")
    assert parse_server_log("decode-0", line).attention_backend == "CPU_ATTN"
    assert parse_server_log("decode-0", line.replace("'MAMBA2_ATTN', ", "'GDN_ATTN', ")).attention_backend == "CPU_ATTN"
