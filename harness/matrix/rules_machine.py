"""Validity rules about this machine: its GPU count, network namespaces and the installed vLLM. They stay silent
when the cell is checked for any machine (no platform); their kind is "unavailable".

Registered in the order they are checked (harness.matrix.rules runs these last). Beside them, one
expansion step rewrites a cell for this machine: `host_dtype`, the dtype its CPU computes fast.
"""
from __future__ import annotations

from harness.core.cell import DEVICES, Cell
from harness.connectors import KV_CONNECTORS
from harness.core.model_config import (AMX_MLA_BLOCK_MULTIPLE, AMX_MLA_DTYPE, CPU_MLA_BLOCK,
                                       cpu_mla_backend, cpu_mla_block_runs)
from harness.core.platform import PlatformInfo
from harness.weathers import WEATHERS
from harness.matrix.rule_types import RuleContext, RuleList

RULES = RuleList()
rule = RULES.rule

# What a CPU without bf16 instructions runs instead of bf16. On the AVX2-only 2-core host a bf16
# evaluation took 2.4-2.5x as long as in float32 (results/benchmarks/cpu-ci-no-bf16-20261202). The KV
# path under test stays the same there: CPU_ATTN lays a bf16 cache out for AMX only on AMX CPUs
# (vLLM 0.32 cpu_attn._get_attn_isa); without AMX bf16 and float32 both take the "vec" page
# order, the connector moves the blocks byte for byte either way (twice the bytes), and the baseline runs
# the same dtype. On an AMX host float32 would leave the AMX cache layout untested: no change.
HOST_FALLBACK_DTYPE = "float32"


def host_dtype(cell: Cell, platform: PlatformInfo | None) -> Cell:
    """`cell` in the dtype this machine computes fast: a bf16 CPU cell in float32 where the CPU
    has no bf16 instructions (the cell id then ends in the dtype); any other cell unchanged."""
    if (platform is None or cell.device != "cpu" or cell.dtype != "bfloat16"
            or platform.computes_bf16):
        return cell
    return cell.replace(dtype=HOST_FALLBACK_DTYPE)


@rule("gpu-count", "unavailable")
def _gpu_count(cell: Cell, ctx: RuleContext) -> str | None:
    """A cuda cell needs at least as many GPUs as its widest server (servers may share GPUs)."""
    if cell.device != "cuda" or ctx.platform is None:
        return None
    need = cell.gpus_needed["min_shared"]
    if need > ctx.platform.gpu_count:
        return f"needs {need} GPU(s), this machine has {ctx.platform.gpu_count}"
    return None


@rule("netns-host", "unavailable")
def _netns_host(cell: Cell, ctx: RuleContext) -> str | None:
    """A network: netns cell needs a machine that can make network namespaces (root, `ip`)."""
    if cell.network == "netns" and ctx.platform is not None and ctx.platform.netns_unavailable:
        return ctx.platform.netns_unavailable
    return None


# x86 extensions vLLM CPU's fp8 KV cache needs, either one (cpu_attn._get_attn_isa: "FP8 KV cache
# on CPU requires x86 with AVX-512 or AMX", torch.cpu._is_avx512_supported / _is_amx_tile_supported)
FP8_KV_CPU_ISA = ("avx512f", "amx_tile")


@rule("kv-cache-fp8-cpu-isa", "unavailable")
def _fp8_kv_cpu_isa(cell: Cell, ctx: RuleContext) -> str | None:
    """An fp8 KV cache on CPU needs AVX-512 or AMX (silent when the ISA is not known)."""
    isa = ctx.platform.cpu_isa if ctx.platform is not None else None
    if cell.device != "cpu" or isa is None or any(f in isa for f in FP8_KV_CPU_ISA):
        return None
    if {cell.prefill_kv_cache_dtype, cell.decode_kv_cache_dtype} == {"auto"}:
        return None
    return ("vLLM CPU stores an fp8 KV cache only on x86 with AVX-512 or AMX ('FP8 KV cache on "
            f"CPU requires x86 with AVX-512 or AMX'); this host has {'+'.join(isa) or 'neither'}")


@rule("cpu-mla-block", "unavailable")
def _cpu_mla_block(cell: Cell, ctx: RuleContext) -> str | None:
    """On CPU an MLA model runs at the block (and dtype) its MLA backend on this host takes:
    CPU_MLA (no AMX) block 16 only, AMX_MLA blocks a multiple of 32 in bf16 (silent when the
    ISA is not known)."""
    isa = ctx.platform.cpu_isa if ctx.platform is not None else None
    if cell.device != "cpu" or ctx.model.attention != "mla" or isa is None:
        return None
    backend = cpu_mla_backend(isa)
    wrong = [b for b in sorted({cell.prefill_block_size, cell.decode_block_size})
             if cpu_mla_block_runs(b, isa) != b]
    if backend == "CPU_MLA" and wrong:
        return (f"vLLM CPU serves {cell.model} with CPU_MLA on this host (no amx_tile), which "
                f"runs block {CPU_MLA_BLOCK} only: it would silently run block {wrong[0]} as "
                f"{CPU_MLA_BLOCK}; use block_size {CPU_MLA_BLOCK}")
    if backend == "AMX_MLA" and wrong:
        return (f"vLLM CPU serves {cell.model} with AMX_MLA on this host (amx_tile), which runs "
                f"blocks that are a multiple of {AMX_MLA_BLOCK_MULTIPLE} only, not {wrong[0]}")
    if backend == "AMX_MLA" and cell.dtype != AMX_MLA_DTYPE:
        return (f"vLLM CPU serves {cell.model} with AMX_MLA on this host (amx_tile), which "
                f"computes {AMX_MLA_DTYPE} only, not {cell.dtype}")
    return None


@rule("vllm-device", "unavailable")
def _vllm_device(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM is built for the cell's device."""
    features = ctx.platform and ctx.platform.vllm
    if features is not None and cell.device in DEVICES and features.platform != cell.device:
        return f"the installed vLLM {features.version} is a {features.platform} build; this cell needs {cell.device}"
    return None


@rule("vllm-runner", "unavailable")
def _vllm_runner(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM ships the cell's model runner, and its prefill runner (0.34.0 ships
    V2 only: a V1 cell is not applicable there and never started)."""
    features = ctx.platform and ctx.platform.vllm
    if features is None:
        return None
    for runner in dict.fromkeys((cell.runner, cell.prefill_runner or cell.runner)):
        why = features.runner_missing(runner)
        if why:
            return why
    return None


# the first vLLM whose runner V2 was seen taking ngram drafts is not known: 0.26.0 refused them
V2_NGRAM_REFUSED_BELOW = (0, 27)


@rule("vllm-v2-ngram", "unavailable")
def _vllm_v2_ngram(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM's runner V2 takes ngram speculative decoding (a v2 decode with ngram)."""
    features = ctx.platform and ctx.platform.vllm
    if features is None or cell.runner != "v2" or cell.spec_decode != "ngram":
        return None
    try:
        version = tuple(int(p) for p in str(features.version).split(".")[:2])
    except ValueError:
        return None
    if version < V2_NGRAM_REFUSED_BELOW:
        return (f"the installed vLLM {features.version} refuses runner V2 with ngram drafts at "
                f"start-up: 'Model Runner V2 does not yet support: ngram/ngram_gpu speculative "
                f"decoding' (measured with 0.26.0 on the H200)")
    return None


@rule("vllm-backend", "unavailable")
def _vllm_backend(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM knows the cell's attention backend and a way to select it."""
    features = ctx.platform and ctx.platform.vllm
    if features is None:
        return None
    if not (features.attention_backend_flag or features.attention_backend_env):
        return f"the installed vLLM {features.version} offers no way to select an attention backend"
    if features.attention_backends and cell.backend not in features.attention_backends:
        return f"the installed vLLM {features.version} has no attention backend {cell.backend}"
    return None


@rule("vllm-kv-connector", "unavailable")
def _vllm_kv_connector(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM registers the cell's KV connector, and its transport imports."""
    features = ctx.platform and ctx.platform.vllm
    row = KV_CONNECTORS.get(cell.kv_connector)
    if features is None or row is None:
        return None
    if features.kv_connectors is not None and row.vllm_name not in features.kv_connectors:
        return f"the installed vLLM {features.version} registers no {row.vllm_name} (kv_connector {cell.kv_connector})"
    if features.kv_transports is not None and row.transport not in features.kv_transports:
        error = (features.kv_transport_errors or {}).get(row.transport)
        needs = f"; it needs {row.package}" if row.package else ""
        return (f"{row.vllm_name}'s transport {row.transport} does not import next to vLLM "
                f"{features.version}{f' ({error})' if error else ''}{needs}")
    return None


@rule("vllm-weather", "unavailable")
def _vllm_weather(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM has the settings the cell's weather drives (the row's min_vllm)."""
    from packaging.version import InvalidVersion, Version

    features = ctx.platform and ctx.platform.vllm
    row = WEATHERS.get(cell.weather)
    if features is None or row is None or row.min_vllm is None:
        return None
    try:
        too_old = Version(features.version.split("+")[0]) < Version(row.min_vllm)
    except InvalidVersion:
        return None
    if too_old:
        return (f"weather {cell.weather} needs vLLM >= {row.min_vllm}; the installed vLLM is "
                f"{features.version}")
    return None


@rule("vllm-hooks", "unavailable")
def _vllm_hooks(cell: Cell, ctx: RuleContext) -> str | None:
    """The hook a cell's canary or weather rests on attaches to the installed vLLM (the
    compatibility table, harness.serve.plugins.compat, as the feature probe read it)."""
    features = ctx.platform and ctx.platform.vllm
    missing = features.hooks_missing() if features is not None else {}
    if not missing:
        return None
    from harness.core.vllm_hooks import unavailable_for

    return ((cell.fault and unavailable_for("canary", cell.fault, missing, features.version))
            or unavailable_for("weather", cell.weather, missing, features.version))
