"""Start-up phases read from server logs (the lines are copied from real vLLM 0.32 CPU logs)."""
from __future__ import annotations

from harness.serve.launch.startup_phases import PHASES, parse_startup, summed

COMPILED = """\
=== 2026-12-01T12:28:35 start baseline: python -m vllm.entrypoints.openai.api_server --model m
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=7099) INFO 12-01 12:28:48 [api_utils.py:347]        █     █     █▄   ▄█
(APIServer pid=7099) INFO 12-01 12:29:14 [model.py:733] Resolved architecture: LlamaForCausalLM
(EngineCore pid=7393) INFO 12-01 12:29:38 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='m'
(Worker pid=7721) INFO 12-01 12:30:10 [cpu_model_runner.py:68] Starting to load model m...
(Worker pid=7721) INFO 12-01 12:30:11 [default_loader.py:501] Loading weights took 0.04 seconds
(Worker pid=7721) INFO 12-01 12:30:15 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=7721) INFO 12-01 12:32:02 [cpu_model_runner.py:91] Warming up done.
(EngineCore pid=7393) INFO 12-01 12:32:04 [core.py:402] init engine (profile, create kv cache, warmup model) took 108.80 s
(APIServer pid=7099) INFO 12-01 12:32:07 [entry.py:140] Starting vLLM server on http://127.0.0.1:27073
(APIServer pid=7099) INFO 12-01 12:32:07 [launcher.py:186] Available routes are:
INFO:     Application startup complete.
(APIServer pid=7099) INFO 12-01 12:32:18 [loggers.py:335] Engine 000: Avg prompt throughput: 1788.7 tokens/s
"""


def test_compiled_server_phases_add_up():
    p = parse_startup(COMPILED, log_path="x.log")
    assert p.server == "baseline" and p.total_s == 212.0
    assert p.phases == {"imports": 13.0, "api_config": 50.0, "engine_init": 32.0, "weights": 1.0,
                        "compile": 111.0, "kv_cache": 2.0, "ready": 3.0}
    assert p.unaccounted_s == 0.0


def test_eager_server_folds_the_missing_compile_phase():
    eager = COMPILED.replace("Warming up done.", "something else")
    p = parse_startup(eager)
    assert "compile" not in p.phases
    assert p.phases["kv_cache"] == 113.0 and p.total_s == 212.0 and p.unaccounted_s == 0.0


def test_never_ready_and_the_last_attempt_counts():
    first_attempt = COMPILED.split("(APIServer pid=7099) INFO 12-01 12:32:07")[0]
    second = ("=== 2026-12-01T13:00:00 start baseline: python -m vllm\n"
              "(APIServer pid=1) INFO 12-01 13:00:20 [x.py:1] hello\n")
    p = parse_startup(first_attempt + second)
    assert p.total_s is None and p.phases == {"imports": 20.0}
    assert parse_startup("no header here\n") is None


def test_summed_over_servers():
    a, b = parse_startup(COMPILED), parse_startup(COMPILED.replace("start baseline", "start decode-0"))
    total = summed([a, b])
    assert set(total) == set(PHASES) and total["compile"] == 222.0 and total["ready"] == 6.0
