"""Every validity rule, from both sides: a cell that passes it and one that trips it."""
from __future__ import annotations

import pytest

from harness.core.cell import Cell
from harness.core.catalog import ModelCatalog, ModelInfo
from harness.matrix.rules import (
    RULES,
    InvalidCellError,
    check_cell,
    describe_rules,
    normalize_cell,
    validate_or_die,
)
from harness.core.platform import PlatformInfo, VllmFeatures

CATALOG = ModelCatalog({
    "dense": ModelInfo("dense", kind="dense", num_kv_heads=4, head_dim=32, max_position_embeddings=1024),
    "granite": ModelInfo("granite", kind="hybrid", ssm="mamba2", family="granite", min_block_size={"cpu": 64}),
    "gdn": ModelInfo("gdn", kind="hybrid", ssm="gdn", family="qwen3next"),
    "swa": ModelInfo("swa", kind="dense", num_kv_heads=2, head_dim=64, sliding_window=64),
    "mla": ModelInfo("mla", kind="dense", attention="mla"),
    "h80": ModelInfo("h80", kind="dense", num_kv_heads=2, head_dim=80),
})
CPU = PlatformInfo()
GPU2 = PlatformInfo.from_spec("cuda:2")
AVX2 = PlatformInfo.from_spec("cpu:avx2")
AMX = PlatformInfo.from_spec("cpu:avx2+avx512f+avx512_bf16+amx_bf16+amx_tile")
DS = (("VLLM_SSM_CONV_STATE_LAYOUT", "DS"),)
NO_PC = ("--no-enable-prefix-caching",)


def features(**changes) -> VllmFeatures:
    base = dict(version="9.9", platform="cuda", attention_backend_flag=True, attention_backend_env=False,
                v2_runner_env=True, kv_roles=("kv_producer", "kv_consumer", "kv_both"),
                attention_backends=("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "CPU_ATTN"))
    return VllmFeatures(**{**base, **changes})


# the features of vLLM 0.34.0 (its runners as the probe reads them: V2 only, no variable) and
# of 0.33.0 (both runners, chosen by VLLM_USE_V2_MODEL_RUNNER)
V034 = features(version="0.34.0", v2_runner_env=False, model_runners=("v2",))
V033 = features(version="0.33.0", v2_runner_env=True, model_runners=("v1", "v2"))


def cpu_cell(**kw) -> Cell:
    return Cell(**{"model": "dense", "max_model_len": 1024, **kw})


def gpu_cell(**kw) -> Cell:
    return Cell(**{"model": "dense", "device": "cuda", "kv_buffer_device": "cuda", "backend": "FLASH_ATTN",
                   "max_model_len": 1024, **kw})


def blocks(p: int, d: int | None = None) -> dict:
    return {"prefill_block_size": p, "decode_block_size": p if d is None else d}


def kv(prefill: str, decode: str | None = None) -> dict:
    return {"prefill_kv_cache_dtype": prefill, "decode_kv_cache_dtype": prefill if decode is None else decode}


def hybrid(model: str = "granite", **kw) -> Cell:
    return cpu_cell(model=model, extra_env=DS, extra_args=NO_PC, **kw)


# (rule, passing cell, violating cell, platform) — platform applies to both cells
CASES = [
    ("known-runner", cpu_cell(), cpu_cell(runner="v3"), CPU),
    ("known-backend", cpu_cell(), cpu_cell(backend="XFORMERS"), CPU),
    ("known-device", cpu_cell(), cpu_cell(device="tpu"), CPU),
    ("known-kv-buffer-device", cpu_cell(), cpu_cell(kv_buffer_device="disk"), CPU),
    ("known-fault", cpu_cell(fault="drop-transfer"), cpu_cell(fault="melt-gpu"), CPU),
    # the proxy's param canaries need params to edit: ExampleConnector's hops carry none
    ("known-fault", cpu_cell(kv_connector="example", fault="corrupt-block"),
     cpu_cell(kv_connector="example", fault="drop-transfer"), CPU),
    ("known-fault", cpu_cell(kv_connector="nixl-push", fault="foreign-params"),
     cpu_cell(kv_connector="example", fault="foreign-params"), CPU),
    # the canaries of speculative decoding need drafts (wrong-drafts: either runner's
    # proposer; corrupt-draft-kv: a draft model on both sides, whose KV crosses)
    ("known-fault", cpu_cell(spec_decode="ngram", fault="wrong-drafts"),
     cpu_cell(fault="wrong-drafts"), CPU),
    ("known-fault", gpu_cell(runner="v2", spec_decode="ngram", fault="wrong-drafts"),
     gpu_cell(runner="v2", fault="wrong-drafts"), GPU2),
    ("known-fault", cpu_cell(spec_decode="draft_p1_d3", fault="corrupt-draft-kv"),
     cpu_cell(spec_decode="ngram", fault="corrupt-draft-kv"), CPU),
    # the routing canary leaves every instance but the first idle: it needs a second one
    ("known-fault", cpu_cell(fault="idle-instance", num_decode=2),
     cpu_cell(fault="idle-instance"), CPU),
    ("known-compile", cpu_cell(compile="eager"), cpu_cell(compile="jit"), CPU),
    ("known-network", cpu_cell(network="netns"), cpu_cell(network="wan"), CPU),
    ("known-network", cpu_cell(network="netns"), gpu_cell(network="netns"), GPU2),
    ("known-dtype", cpu_cell(dtype="float16"), cpu_cell(dtype="int3"), CPU),
    ("positive-sizes", cpu_cell(num_prefill=2), cpu_cell(num_prefill=0), CPU),
    ("backend-device", cpu_cell(backend="CPU_ATTN"), cpu_cell(backend="FLASH_ATTN"), CPU),
    ("backend-device", gpu_cell(backend="TRITON_ATTN"), gpu_cell(backend="CPU_ATTN"), GPU2),
    ("kv-buffer-on-cpu", cpu_cell(kv_buffer_device="cpu"), cpu_cell(kv_buffer_device="cuda"), CPU),
    ("v2-runner-not-on-cpu", gpu_cell(runner="v2"), cpu_cell(runner="v2"), GPU2),
    ("known-prefill-runner", gpu_cell(prefill_runner="v2"), gpu_cell(prefill_runner="v3"), GPU2),
    ("known-prefill-runner", gpu_cell(runner="v2", prefill_runner="v1"),
     gpu_cell(runner="v2", prefill_runner="v2"), GPU2),
    ("mixed-runners-not-on-cpu", gpu_cell(prefill_runner="v2"), cpu_cell(prefill_runner="v2"), GPU2),
    ("cpu-attn-block-multiple-32", cpu_cell(**blocks(96)), cpu_cell(**blocks(48)), CPU),
    ("flash-attn-block-multiple-16", gpu_cell(**blocks(48)), gpu_cell(**blocks(40)), GPU2),
    ("triton-attn-block-multiple-16", gpu_cell(backend="TRITON_ATTN", **blocks(16)),
     gpu_cell(backend="TRITON_ATTN", **blocks(24)), GPU2),
    ("flashinfer-kernel-block", gpu_cell(backend="FLASHINFER", model="x", **blocks(128)),
     gpu_cell(backend="FLASHINFER", model="x", **blocks(24)), GPU2),
    ("flashinfer-logical-block", gpu_cell(backend="FLASHINFER", model="x", **blocks(64)),
     gpu_cell(backend="FLASHINFER", model="x", **blocks(128)), GPU2),
    ("heterogeneous-block-divisible", cpu_cell(**blocks(64, 128)), cpu_cell(**blocks(128, 64)), CPU),
    ("heterogeneous-block-divisible", cpu_cell(**blocks(32, 96)), cpu_cell(**blocks(64, 96)), CPU),
    ("heterogeneous-block-host-buffer", gpu_cell(**blocks(16, 64)),
     gpu_cell(kv_buffer_device="cpu", **blocks(16, 64)), GPU2),
    # engine settings (rules_engine)
    ("known-async-scheduling", gpu_cell(async_scheduling="off"), gpu_cell(async_scheduling="maybe"), GPU2),
    ("known-spec-decode", cpu_cell(spec_decode="ngram"), cpu_cell(spec_decode="eagle"), CPU),
    ("known-cudagraph-mode", gpu_cell(cudagraph_mode="PIECEWISE"),
     gpu_cell(cudagraph_mode="FULL_AND_PIECEWISE"), GPU2),
    ("known-kv-layout", gpu_cell(kv_layout="NHD"), gpu_cell(kv_layout="LBHNC"), GPU2),
    ("chunked-prefill-budget", cpu_cell(chunked_prefill=64), cpu_cell(chunked_prefill=8), CPU),
    ("chunked-prefill-budget", cpu_cell(chunked_prefill=16), cpu_cell(chunked_prefill=1024), CPU),
    ("chunked-prefill-budget", cpu_cell(chunked_prefill=1023), cpu_cell(chunked_prefill=True), CPU),
    ("async-scheduling-not-on-cpu", gpu_cell(async_scheduling="on"), cpu_cell(async_scheduling="on"), GPU2),
    ("async-scheduling-not-on-cpu", cpu_cell(), cpu_cell(async_scheduling="off"), CPU),
    ("async-scheduling-spec-decode", gpu_cell(async_scheduling="off", spec_decode="ngram"),
     gpu_cell(async_scheduling="on", spec_decode="ngram"), GPU2),
    ("draft-model-zoo-target", gpu_cell(model="tiny-llama-gsm", spec_decode="draft_p1_d3"),
     gpu_cell(spec_decode="draft_p1_d3"), GPU2),
    ("eagle-head-target", cpu_cell(model="tiny-llama-gsm", spec_decode="eagle_p1_d3"),
     cpu_cell(model="tiny-llama-swa-gsm", spec_decode="eagle_p1_d3"), CPU),
    ("mtp-head-model", cpu_cell(model="tiny-qwen3next-hybrid-gsm-mtp", spec_decode="mtp_p1_d3"),
     cpu_cell(model="tiny-qwen3next-hybrid-gsm", spec_decode="mtp_p1_d3"), CPU),
    ("draft-model-on-both-sides", cpu_cell(spec_decode="ngram"),
     cpu_cell(model="tiny-llama-gsm", spec_decode="draft_p1_d3"), CPU),
    ("eagle-decode-only", cpu_cell(model="tiny-llama-gsm", spec_decode="eagle_p1_d3"),
     cpu_cell(model="tiny-llama-gsm", spec_decode="eagle_p0_d3"), CPU),
    ("draft-model-decode-only", cpu_cell(model="tiny-llama-gsm", spec_decode="draft_p1_d3"),
     cpu_cell(model="tiny-llama-gsm", spec_decode="draft_p0_d3"), CPU),
    ("cudagraph-mode-cuda-only", gpu_cell(cudagraph_mode="NONE"), cpu_cell(cudagraph_mode="NONE"), GPU2),
    ("cudagraph-mode-needs-compile", gpu_cell(cudagraph_mode="NONE"),
     gpu_cell(cudagraph_mode="NONE", compile="eager"), GPU2),
    ("cudagraph-full-downgraded", gpu_cell(cudagraph_mode="FULL"),
     gpu_cell(backend="FLASHINFER", model="x", cudagraph_mode="FULL"), GPU2),
    ("cudagraph-full-downgraded", gpu_cell(backend="TRITON_ATTN", cudagraph_mode="FULL"),
     gpu_cell(model="gdn", extra_env=DS, cudagraph_mode="FULL"), GPU2),
    ("cudagraph-full-downgraded", gpu_cell(model="gdn", extra_env=DS, cudagraph_mode="PIECEWISE"),
     gpu_cell(model="granite", extra_env=DS, cudagraph_mode="FULL"), GPU2),
    ("kv-layout-cuda-only", gpu_cell(kv_layout="HND"), cpu_cell(kv_layout="HND"), GPU2),
    ("kv-layout-cuda-only", cpu_cell(), cpu_cell(kv_layout="NHD"), CPU),
    ("kv-layout-nhd-not-hybrid", gpu_cell(model="gdn", extra_env=DS, kv_layout="HND"),
     gpu_cell(model="gdn", extra_env=DS, kv_layout="NHD"), GPU2),
    ("kv-layout-is-connector-default", gpu_cell(kv_layout="NHD"), gpu_cell(kv_layout="HND"), GPU2),
    ("known-prefill-kv-cache-dtype", cpu_cell(prefill_kv_cache_dtype="fp8_e5m2"),
     cpu_cell(prefill_kv_cache_dtype="int4"), AMX),
    ("known-decode-kv-cache-dtype", cpu_cell(decode_kv_cache_dtype="fp8"),
     cpu_cell(decode_kv_cache_dtype="bf16"), AMX),
    ("kv-cache-dtype-backend", gpu_cell(**kv("fp8_e4m3")), gpu_cell(**kv("fp8_e5m2")), GPU2),
    ("kv-cache-dtype-backend", gpu_cell(backend="FLASHINFER", **kv("fp8_e5m2")),
     gpu_cell(model="mla", backend="TRITON_MLA", **kv("fp8_e5m2")), GPU2),
    # listed by TRITON_ATTN, but its server died in torch.compile on the H200 (2026-12-03)
    ("kv-cache-dtype-backend", gpu_cell(backend="TRITON_ATTN", **kv("fp8")),
     gpu_cell(backend="TRITON_ATTN", **kv("fp8_e5m2")), GPU2),
    ("kv-cache-fp8-cpu-head-size", cpu_cell(**kv("fp8")), cpu_cell(model="h80", **kv("fp8")), AMX),
    ("kv-cache-fp8-cpu-head-size", cpu_cell(model="h80"), cpu_cell(model="h80", **kv("auto", "fp8")), AMX),
    ("kv-cache-dtype-mismatch", cpu_cell(**kv("fp8")), cpu_cell(**kv("auto", "fp8")), AMX),
    ("kv-cache-dtype-mismatch", gpu_cell(**kv("fp8")), gpu_cell(**kv("fp8", "auto")), GPU2),
    ("prefix-reuse-needs-prefix-caching", cpu_cell(prefix_reuse=True),
     cpu_cell(prefix_reuse=True, extra_args=NO_PC), CPU),
    ("prefix-reuse-evidence", cpu_cell(), cpu_cell(prefix_reuse=True), CPU),
    ("hybrid-conv-state-layout", hybrid(), cpu_cell(model="granite", extra_args=NO_PC,
                                                    extra_env=(("VLLM_SSM_CONV_STATE_LAYOUT", "SD"),)), CPU),
    ("hybrid-homogeneous-block", hybrid(**blocks(128)), hybrid(**blocks(64, 128)), CPU),
    ("hybrid-min-block-size", hybrid(**blocks(64)), hybrid(**blocks(32)), CPU),
    ("hybrid-tp-multiple", gpu_cell(model="gdn", extra_env=DS, prefill_tp=1, decode_tp=2),
     gpu_cell(model="gdn", extra_env=DS, prefill_tp=2, decode_tp=3), PlatformInfo.from_spec("cuda:8")),
    ("granite-hybrid-cpu-prefix-caching", hybrid(), cpu_cell(model="granite", extra_env=DS), CPU),
    ("hybrid-spec-decode-cpu-prefix-caching", hybrid("gdn", spec_decode="mtp_p1_d3"),
     cpu_cell(model="gdn", extra_env=DS, spec_decode="mtp_p1_d3"), CPU),
    ("hybrid-spec-decode-cpu-prefix-caching", cpu_cell(model="gdn", extra_env=DS),
     hybrid("gdn", spec_decode="ngram", prefix_reuse=True), CPU),
    ("hybrid-spec-token-count-mix", hybrid("gdn", spec_decode="mtp_p3_d3"),
     hybrid("gdn", spec_decode="mtp_p1_d3"), CPU),
    ("hybrid-spec-token-count-mix", hybrid("gdn", spec_decode="ngram"),
     hybrid("gdn", spec_decode="draft_p1_d3"), CPU),
    ("hybrid-spec-decode-cpu-prefix-caching", gpu_cell(model="gdn", extra_env=DS, spec_decode="ngram"),
     hybrid("gdn", spec_decode="ngram").replace(extra_args=()), CPU),
    ("tp-divides-kv-heads", gpu_cell(prefill_tp=2, decode_tp=4), gpu_cell(prefill_tp=3), PlatformInfo.from_spec("cuda:8")),
    ("backend-head-size", cpu_cell(backend="CPU_ATTN"), gpu_cell(backend="FLASHINFER"), GPU2),
    ("flashinfer-sliding-window", gpu_cell(model="swa", backend="FLASH_ATTN"),
     gpu_cell(model="swa", backend="FLASHINFER"), GPU2),
    ("mla-backend", gpu_cell(model="mla", backend="TRITON_MLA"),
     gpu_cell(model="mla", backend="FLASH_ATTN"), GPU2),
    ("mla-backend", gpu_cell(model="mla", backend="FLASHMLA", **blocks(64)),
     gpu_cell(backend="FLASHMLA", **blocks(64)), GPU2),
    ("mla-backend", cpu_cell(model="mla"), gpu_cell(model="mla", backend="FLASHINFER", **blocks(64)), CPU),
    ("max-model-len", cpu_cell(max_model_len=1024), cpu_cell(max_model_len=2048), CPU),
    # servers may share GPUs: TP2 pairs fit on 2 GPUs, a TP4 server does not
    ("gpu-count", gpu_cell(prefill_tp=2, decode_tp=2), gpu_cell(prefill_tp=4, decode_tp=4), GPU2),
    ("netns-host", cpu_cell(network="netns"), cpu_cell(network="netns"), None),
    # fp8 KV on CPU: an AMX or AVX-512 host runs it; an AVX2 host does not; bf16 KV runs anywhere
    ("kv-cache-fp8-cpu-isa", cpu_cell(**kv("fp8")), cpu_cell(**kv("fp8")), "isa"),
    ("kv-cache-fp8-cpu-isa", cpu_cell(), cpu_cell(**kv("fp8_e5m2")), AVX2),
    ("kv-cache-fp8-cpu-isa", gpu_cell(**kv("fp8")), cpu_cell(**kv("auto", "fp8")), AVX2),
    # an MLA model on CPU: CPU_MLA (no AMX) runs block 16 only, AMX_MLA multiples of 32 in bf16
    ("cpu-mla-block", cpu_cell(model="mla", **blocks(16)), cpu_cell(model="mla", **blocks(128)), AVX2),
    ("cpu-mla-block", cpu_cell(**blocks(128)), cpu_cell(model="mla", **blocks(16, 128)), AVX2),
    ("cpu-mla-block", cpu_cell(model="mla", **blocks(128)), cpu_cell(model="mla", **blocks(16)), AMX),
    ("cpu-mla-block", cpu_cell(model="mla", **blocks(64)),
     cpu_cell(model="mla", dtype="float32", **blocks(128)), AMX),
    ("vllm-device", cpu_cell(), gpu_cell(), None),
    ("vllm-runner", gpu_cell(runner="v1"), gpu_cell(runner="v2"), None),
    # vLLM 0.34.0 ships runner V2 only: a V1 cell (or a V1 prefill) is not applicable there
    ("vllm-runner", gpu_cell(runner="v2"), gpu_cell(runner="v1"), "v2-only"),
    ("vllm-runner", gpu_cell(runner="v2"), gpu_cell(runner="v2", prefill_runner="v1"), "v2-only"),
    ("vllm-backend", gpu_cell(backend="FLASH_ATTN"), gpu_cell(backend="TRITON_ATTN"), None),
    ("vllm-kv-connector", cpu_cell(), cpu_cell(), None),
    ("vllm-kv-connector", cpu_cell(kv_connector="nixl-push"), cpu_cell(kv_connector="nixl-push"), "push"),
    ("known-kv-connector", cpu_cell(kv_connector="nixl-push"), cpu_cell(kv_connector="no-such"), CPU),
    # a connector vLLM CPU refuses at start-up is excluded on CPU, kept on a GPU
    ("known-kv-connector", gpu_cell(kv_connector="offloading"), cpu_cell(kv_connector="offloading"), GPU2),
    ("kv-connector-moves-kv", cpu_cell(kv_connector="nixl-push"), cpu_cell(kv_connector="decode-bench"), CPU),
    ("kv-connector-driven", cpu_cell(kv_connector="example"), cpu_cell(kv_connector="flexkv"), CPU),
    ("vllm-kv-connector", gpu_cell(kv_connector="mooncake"), gpu_cell(kv_connector="mooncake"), "mooncake"),
    ("known-weather", cpu_cell(weather="load"), cpu_cell(weather="storm"), CPU),
    ("vllm-v2-ngram", gpu_cell(runner="v2", spec_decode="ngram"),
     gpu_cell(runner="v2", spec_decode="ngram"), "v2-ngram"),
    ("known-weather", cpu_cell(weather="load", weather_params=(("in_flight", 64),)),
     cpu_cell(weather="load", weather_params=(("in_flight", 1.5),)), CPU),
    # block-boundary's k*128+-1 prompts: a boundary of blocks dividing 128, with room to answer
    ("boundary-blocks", cpu_cell(weather="block-boundary", **blocks(64, 128)),
     cpu_cell(weather="block-boundary", **blocks(96)), CPU),
    ("boundary-blocks", cpu_cell(weather="block-boundary", **blocks(128)),
     cpu_cell(weather="block-boundary", max_model_len=512, **blocks(128)), CPU),
    # "future": a row test_rule_both_sides adds, needing vLLM >= 0.40
    ("vllm-weather", cpu_cell(weather="future"), cpu_cell(weather="future"), None),
    # a vLLM whose connector interface lacks what the canary's hook needs
    ("vllm-hooks", cpu_cell(fault="corrupt-block"), cpu_cell(fault="corrupt-block"), None),
]


def _platform_for(rule: str, violating: bool, platform: PlatformInfo | None) -> PlatformInfo:
    """Rules about the installed vLLM need a platform whose features differ per side."""
    if rule == "vllm-device":
        return PlatformInfo(device="cuda", gpu_count=2, gpu_memory_bytes=(1, 1), vllm=features(platform="cpu"))
    if rule == "vllm-runner" and platform == "v2-only":
        return PlatformInfo(device="cuda", gpu_count=2, vllm=V034)
    if rule == "vllm-runner":
        return PlatformInfo(device="cuda", gpu_count=2, vllm=features(v2_runner_env=not violating))
    if rule == "vllm-backend":
        return PlatformInfo(device="cuda", gpu_count=2, vllm=features(attention_backends=("FLASH_ATTN",)))
    if rule == "kv-cache-fp8-cpu-isa" and platform == "isa":
        return PlatformInfo.from_spec("cpu:avx2" if violating else "cpu:avx2+avx512f")
    if rule == "netns-host":
        return PlatformInfo(netns_unavailable="network: netns needs root" if violating else None)
    if rule == "vllm-kv-connector" and platform == "push":   # vLLM without the push connector
        return PlatformInfo(vllm=features(platform="cpu", kv_connectors=(
            "NixlConnector",) if violating else ("NixlConnector", "NixlPushConnector")))
    if rule == "vllm-kv-connector" and platform == "mooncake":   # its package is not installed
        error = {"mooncake.engine:TransferEngine": "ImportError: libibverbs.so.1: cannot open"}
        return PlatformInfo(device="cuda", gpu_count=2, vllm=features(kv_transports=(
            () if violating else ("mooncake.engine:TransferEngine",)),
            kv_transport_errors=error if violating else {}))
    if rule == "vllm-v2-ngram":      # vLLM 0.26.0 refused it on the H200 (2026-12-03)
        return PlatformInfo(device="cuda", gpu_count=2,
                            vllm=features(version="0.26.0" if violating else "0.32.0"))
    if rule == "vllm-weather":       # a vLLM older than the weather's min_vllm (set by the test)
        return PlatformInfo(vllm=features(platform="cpu", version="0.1" if violating else "99.0"))
    if rule == "vllm-hooks":
        return PlatformInfo(vllm=features(platform="cpu", hooks={
            "kv-faults": "kv-events: no get_finished" if violating else None}))
    if rule == "vllm-kv-connector":   # NIXL does not import
        return PlatformInfo(vllm=features(platform="cpu", kv_transports=(
            () if violating else ("nixl._api:nixl_agent",))))
    return platform or GPU2


@pytest.mark.parametrize("rule_name,passing,violating,platform", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_both_sides(rule_name, passing, violating, platform, monkeypatch):
    from harness import weathers
    from harness.weathers import facts

    monkeypatch.setitem(weathers.WEATHERS, "future",
                        facts.WeatherRow(min_vllm="0.40"))
    ok = check_cell(passing, _platform_for(rule_name, False, platform), CATALOG)
    bad = check_cell(violating, _platform_for(rule_name, True, platform), CATALOG)
    assert rule_name not in [p.rule for p in ok], ok
    hits = [p for p in bad if p.rule == rule_name]
    assert hits, bad
    expected_kind = next(r.kind for r in RULES if r.name == rule_name)
    assert hits[0].kind == expected_kind
    assert hits[0].message and "\n" not in hits[0].message


def test_every_rule_has_a_case():
    assert {r.name for r in RULES} == {c[0] for c in CASES}


def test_clean_cells_have_no_problems():
    assert check_cell(cpu_cell(), CPU, CATALOG) == []
    assert check_cell(hybrid(), CPU, CATALOG) == []
    assert check_cell(gpu_cell(model="x", runner="v2"), GPU2, CATALOG) == []


def test_messages_carry_the_fix():
    msg = {p.rule: p.message for p in check_cell(hybrid(**blocks(32)), CPU, CATALOG)}
    assert "use block_size 64" in msg["hybrid-min-block-size"]
    msg = {p.rule: p.message for p in check_cell(cpu_cell(model="granite", extra_env=DS, **blocks(64)), CPU, CATALOG)}
    assert "--no-enable-prefix-caching" in msg["granite-hybrid-cpu-prefix-caching"]
    assert "IndexError" in msg["granite-hybrid-cpu-prefix-caching"]
    msg = {p.rule: p.message for p in check_cell(hybrid(**blocks(64, 128)), CPU, CATALOG)}
    assert "heterogeneous block size unsupported upstream for hybrid models" in msg["hybrid-homogeneous-block"]


def test_normalize_adds_ssm_layout_to_hybrids_only():
    raw = cpu_cell(model="gdn", extra_env=(("A", "1"),))
    fixed = normalize_cell(raw, CATALOG)
    assert dict(fixed.extra_env) == {"A": "1", "VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
    assert normalize_cell(fixed, CATALOG) == fixed
    assert normalize_cell(cpu_cell(), CATALOG) == cpu_cell()
    explicit = cpu_cell(model="gdn", extra_env=(("VLLM_SSM_CONV_STATE_LAYOUT", "SD"),))
    assert normalize_cell(explicit, CATALOG) == explicit  # an explicit choice is left for the rule to reject


def test_validate_or_die_one_line_with_id_rule_and_fix():
    good = cpu_cell()
    bad = cpu_cell(runner="v2")
    validate_or_die([good], CPU, CATALOG)
    with pytest.raises(InvalidCellError) as info:
        validate_or_die([good, bad], CPU, CATALOG)
    text = str(info.value)
    assert "\n" not in text
    assert bad.cell_id in text and "v2-runner-not-on-cpu" in text and "use runner v1" in text
    assert info.value.cell_id == bad.cell_id


def test_validate_or_die_ignores_xfail_and_notes_but_not_unavailable():
    validate_or_die([cpu_cell(model="granite", extra_env=DS, **blocks(64))], CPU, CATALOG)  # xfail only
    with pytest.raises(InvalidCellError, match="gpu-count"):
        validate_or_die([gpu_cell()], CPU, CATALOG)


def test_unknown_model_skips_fact_rules():
    cell = gpu_cell(model="someone/else", prefill_tp=3, decode_tp=3, backend="FLASHINFER")
    rules = {p.rule for p in check_cell(cell, PlatformInfo.from_spec("cuda:8"), CATALOG)}
    assert not rules & {"tp-divides-kv-heads", "backend-head-size", "hybrid-tp-multiple"}


def test_block_size_provider_overrides_catalog():
    catalog = ModelCatalog(dict(CATALOG.models), block_size_provider=lambda m, d: 128 if m == "granite" else None)
    rules = {p.rule for p in check_cell(hybrid(**blocks(64)), CPU, catalog)}
    assert "hybrid-min-block-size" in rules
    assert catalog.min_block_size("gdn", "cpu") is None


def test_cell_gpus_needed():
    assert cpu_cell(prefill_tp=2).gpus_needed["total"] == 0
    need = gpu_cell(prefill_tp=2, decode_tp=1, num_decode=2).gpus_needed
    assert need == {"prefill": 2, "decode": 2, "baseline": 1, "total": 4, "all_at_once": 5,
                    "min_shared": 2}
    assert gpu_cell(prefill_tp=1, decode_tp=4).gpus_needed["total"] == 5


def test_no_platform_means_machine_agnostic():
    big = gpu_cell(prefill_tp=4, decode_tp=4)
    assert check_cell(big, None, CATALOG) == []
    validate_or_die([big], None, CATALOG)
    with pytest.raises(InvalidCellError, match="v2-runner-not-on-cpu"):
        validate_or_die([cpu_cell(runner="v2")], None, CATALOG)


def test_rules_are_checked_and_listed_by_subject_in_a_fixed_order():
    assert [name for name, _, _ in describe_rules()] == [
        # the cell alone (rules_cell)
        "known-runner", "known-backend", "known-device", "known-kv-buffer-device", "known-kv-connector",
        "kv-connector-moves-kv", "kv-connector-driven", "known-weather", "boundary-blocks", "known-fault",
        "known-compile", "known-network", "known-dtype", "positive-sizes", "backend-device", "kv-buffer-on-cpu", "v2-runner-not-on-cpu",
        "known-prefill-runner", "mixed-runners-not-on-cpu",
        "cpu-attn-block-multiple-32", "flash-attn-block-multiple-16", "triton-attn-block-multiple-16",
        "flashinfer-kernel-block", "flashinfer-logical-block", "heterogeneous-block-divisible",
        "heterogeneous-block-host-buffer",
        # the engine settings (rules_engine)
        "known-async-scheduling", "known-spec-decode", "known-cudagraph-mode", "known-kv-layout",
        "known-prefill-kv-cache-dtype", "known-decode-kv-cache-dtype",
        "chunked-prefill-budget", "async-scheduling-not-on-cpu", "async-scheduling-spec-decode",
        "draft-model-zoo-target", "eagle-head-target", "mtp-head-model",
        "draft-model-on-both-sides",
        "draft-model-decode-only", "eagle-decode-only",
        "cudagraph-mode-cuda-only", "cudagraph-mode-needs-compile", "cudagraph-full-downgraded",
        "kv-layout-cuda-only", "kv-layout-nhd-not-hybrid", "kv-layout-is-connector-default",
        "kv-cache-dtype-backend", "kv-cache-fp8-cpu-head-size", "kv-cache-dtype-mismatch",
        "prefix-reuse-needs-prefix-caching", "prefix-reuse-evidence",
        # the model's facts (rules_models)
        "hybrid-conv-state-layout", "hybrid-homogeneous-block", "hybrid-min-block-size",
        "hybrid-tp-multiple", "granite-hybrid-cpu-prefix-caching",
        "hybrid-spec-decode-cpu-prefix-caching", "hybrid-spec-token-count-mix",
        "tp-divides-kv-heads",
        "backend-head-size", "flashinfer-sliding-window", "mla-backend", "max-model-len",
        # this machine (rules_machine)
        "gpu-count", "netns-host", "kv-cache-fp8-cpu-isa", "cpu-mla-block", "vllm-device", "vllm-runner",
            "vllm-v2-ngram", "vllm-backend", "vllm-kv-connector", "vllm-weather", "vllm-hooks",
    ]


def test_the_catalog_is_always_passed():
    """No hidden default: the rules read only the model facts they are given."""
    with pytest.raises(TypeError):
        check_cell(cpu_cell(), CPU)   # type: ignore[call-arg]
    with pytest.raises(TypeError):
        normalize_cell(cpu_cell())    # type: ignore[call-arg]


def test_a_transport_that_does_not_import_is_named_with_its_error_and_package():
    platform = PlatformInfo(device="cuda", gpu_count=2, vllm=features(
        kv_transports=(), kv_transport_errors={
            "mooncake.engine:TransferEngine": "ImportError: libibverbs.so.1: cannot open"}))
    [hit] = [p for p in check_cell(gpu_cell(kv_connector="mooncake"), platform, CATALOG)
             if p.rule == "vllm-kv-connector"]
    assert "libibverbs.so.1" in hit.message and "mooncake-transfer-engine" in hit.message


def test_the_param_canaries_are_the_proxys():
    """rule known-fault names the proxy's canaries itself (the matrix imports nothing of serve/)."""
    from harness.matrix.rules_cell import PARAM_FAULTS, ROUTING_FAULTS
    from harness.serve.proxy.hops import PROXY_FAULTS

    assert set(PARAM_FAULTS + ROUTING_FAULTS) == set(PROXY_FAULTS)


def test_a_param_canary_on_a_connector_without_params_says_why():
    bad = check_cell(cpu_cell(kv_connector="example", fault="drop-transfer"), CPU, CATALOG)
    reason = next(p.message for p in bad if p.rule == "known-fault")
    assert "ExampleConnector" in reason and "sends none" in reason and "hash" in reason
