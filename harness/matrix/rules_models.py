"""Validity rules that need the model's facts (harness.core.catalog): hybrid SSM models and the
model's shape (KV heads, head size, context length).

Registered in the order they are checked (harness.matrix.rules runs these after rules_cell).
"""
from __future__ import annotations

from harness.core.cell import MLA_BACKENDS, Cell
from harness.matrix.rule_types import RuleContext, RuleList, blocks

NO_PREFIX_CACHING = "--no-enable-prefix-caching"
SSM_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"
SSM_LAYOUT_REQUIRED = "DS"
HEAD_SIZES = {
    "FLASHINFER": (64, 128, 256, 512),
    "CPU_ATTN": (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512),
}

RULES = RuleList()
rule = RULES.rule


# ---- hybrid SSM models ----------------------------------------------------------------------

@rule("hybrid-conv-state-layout", "invalid")
def _hybrid_layout(cell: Cell, ctx: RuleContext) -> str | None:
    """Hybrid SSM models need VLLM_SSM_CONV_STATE_LAYOUT=DS (added automatically; rejects others)."""
    if not ctx.model.is_hybrid:
        return None
    layout = dict(cell.extra_env).get(SSM_LAYOUT_ENV)
    if layout != SSM_LAYOUT_REQUIRED:
        return (f"hybrid model {cell.model} needs {SSM_LAYOUT_ENV}={SSM_LAYOUT_REQUIRED} for P/D transfer "
                f"(cell has {layout!r}); remove the override or set it to {SSM_LAYOUT_REQUIRED}")
    return None


@rule("hybrid-homogeneous-block", "invalid")
def _hybrid_homogeneous(cell: Cell, ctx: RuleContext) -> str | None:
    """Hybrid models need equal prefill and decode block sizes."""
    p, d = blocks(cell)
    if ctx.model.is_hybrid and p != d:
        return f"heterogeneous block size unsupported upstream for hybrid models; use p{d}d{d} or p{p}d{p}"
    return None


@rule("hybrid-min-block-size", "invalid")
def _hybrid_min_block(cell: Cell, ctx: RuleContext) -> str | None:
    """A hybrid model's attention block is aligned to its Mamba page; smaller blocks get replaced."""
    if not ctx.model.is_hybrid:
        return None
    # vLLM's own arithmetic on config.json's shapes, unless the YAML declares the minimum
    computed = ctx.model.state_page is not None and not ctx.model.min_block_size.get(cell.device)
    for block in sorted(set(blocks(cell))) if computed else ():
        runs = ctx.model.block_vllm_runs(block, cell.device, cell.dtype)
        if runs is not None and runs != block:
            kept = ctx.model.smallest_kept_block(cell.device, cell.dtype)
            return (f"{cell.model} on {cell.device} keeps no attention block below {kept} (one "
                    f"block's KV page must hold a {ctx.model.ssm or 'state'} layer's state page); "
                    f"vLLM would silently raise {block} to {runs}; use block_size {runs}")
    need = None if computed else ctx.catalog.min_block_size(cell.model, cell.device)
    small = sorted({b for b in blocks(cell) if need and b < need})
    if small:
        return (f"{cell.model} on {cell.device} needs block size {need} (attention block aligned to the "
                f"Mamba page; vLLM would silently raise {small[0]} to {need}); use block_size {need}")
    return None


@rule("hybrid-tp-multiple", "invalid")
def _hybrid_tp(cell: Cell, ctx: RuleContext) -> str | None:
    """For hybrid models one TP size must be an integer multiple of the other."""
    lo, hi = sorted((cell.prefill_tp, cell.decode_tp))
    if ctx.model.is_hybrid and lo >= 1 and hi % lo:
        return f"hybrid P/D needs one TP a multiple of the other; tp{cell.prefill_tp}x{cell.decode_tp} is not"
    return None


@rule("granite-hybrid-cpu-prefix-caching", "xfail")
def _granite_prefix_caching(cell: Cell, ctx: RuleContext) -> str | None:
    """Granite hybrids on CPU crash with prefix caching when a prefill chunk crosses a block boundary."""
    if (ctx.model.is_hybrid and ctx.model.family == "granite" and cell.device == "cpu"
            and NO_PREFIX_CACHING not in cell.extra_args):
        return (f"upstream: Granite hybrid with prefix caching on CPU crashes (IndexError in "
                f"conv_ssm_forward) when a prefill chunk crosses a block boundary; add {NO_PREFIX_CACHING}")
    return None


@rule("hybrid-spec-decode-cpu-prefix-caching", "invalid")
def _hybrid_spec_prefix_caching(cell: Cell, ctx: RuleContext) -> str | None:
    """A hybrid with speculative decoding and prefix caching does not run on vLLM CPU 0.32."""
    if (not ctx.model.is_hybrid or cell.device != "cpu" or not cell.spec_decode
            or (NO_PREFIX_CACHING in cell.extra_args and not cell.prefix_reuse)):
        return None
    return (f"vLLM CPU 0.32 crashes on a hybrid's first request with speculative decoding and "
            f"prefix caching on: prefix caching puts the {ctx.model.ssm or 'state'} cache in "
            f"mamba_cache_mode 'align', whose step with a drafter copies states with a Triton "
            f"kernel (v1/worker/mamba_utils.py, preprocess_mamba -> "
            f"precopy_mamba_align_fused_kernel[grid]) that the CPU build lacks: \"TypeError: "
            f"'function' object is not subscriptable\" (2026-12-08); add {NO_PREFIX_CACHING}")


# the verdict of a pair whose decode holds another recurrent state than the prefill sent: the
# digest's first difference at a state layer (the MTP run of 2026-12-08: "first at layer
# model.layers.0.linear_attn state of ...")
STATE_DIFFERS = r"\[kv-digest\]: prompt KV differs on .* first at layer \S+ state of "


@rule("hybrid-spec-token-count-mix", "xfail", fails_with=STATE_DIFFERS)
def _hybrid_spec_count_mix(cell: Cell, ctx: RuleContext) -> str | None:
    """A hybrid whose prefill drafts fewer tokens than its decode loses the recurrent state."""
    from harness.core.spec_decode import PREFILL_SPEC_TOKENS, SPEC_DECODE_CONFIGS

    prefill = PREFILL_SPEC_TOKENS.get(cell.spec_decode or "")
    if not ctx.model.is_hybrid or cell.device != "cpu" or prefill is None:
        return None
    decode = SPEC_DECODE_CONFIGS[cell.spec_decode]["num_speculative_tokens"]
    if prefill == decode:
        return None
    return (f"the prefill drafts {prefill} token(s), the decode {decode}: on vLLM CPU 0.32 the "
            f"decode's {ctx.model.ssm or 'recurrent'} state slot then does not hold the "
            f"prefill's state (kv-digest: the state differs on 50/50 requests, every attention "
            f"layer and the drafter's identical) and the answers go wrong (tiny-qwen3next-hybrid-"
            f"gsm-mtp, mtp_p1_d3: 48 of 50 lost, 2026-12-08; P 3 / D 3 lost none). Each side "
            f"drops its own count of trailing speculative scratch slots from the state's blocks "
            f"before they are paired (the connector's get_exchange_clipped_blocks, "
            f"clip_ssm_state_blocks) and the handshake does not compare the counts, so nothing "
            f"refuses the pair. That failure is the expected outcome; use equal counts "
            f"(mtp_p3_d3)")


# ---- model shape ----------------------------------------------------------------------------

@rule("tp-divides-kv-heads", "invalid")
def _tp_kv_heads(cell: Cell, ctx: RuleContext) -> str | None:
    """The model's KV heads split evenly across each side's TP ranks."""
    heads = ctx.model.num_kv_heads
    if not heads:
        return None
    bad = [tp for tp in (cell.prefill_tp, cell.decode_tp) if tp >= 1 and heads % tp]
    if bad:
        return f"{cell.model} has {heads} KV heads, not divisible by TP {bad[0]}; use a TP that divides {heads}"
    return None


@rule("backend-head-size", "invalid")
def _head_size(cell: Cell, ctx: RuleContext) -> str | None:
    """The backend supports the model's attention head size (FLASHINFER rejects 32)."""
    sizes = HEAD_SIZES.get(cell.backend)
    head_dim = ctx.model.head_dim
    if sizes and head_dim and head_dim not in sizes:
        return f"{cell.backend} does not support head size {head_dim} of {cell.model}; it takes {sizes}"
    return None


@rule("flashinfer-sliding-window", "invalid")
def _flashinfer_sliding(cell: Cell, ctx: RuleContext) -> str | None:
    """FLASHINFER on CUDA refuses models with sliding-window layers (vLLM 0.26 on the H200)."""
    if cell.device == "cuda" and cell.backend == "FLASHINFER" and ctx.model.sliding_window:
        return (f"{cell.model} has sliding-window layers ({ctx.model.sliding_window} tokens) and vLLM "
                f"0.26 refuses FLASHINFER for them on SM90: 'NotImplementedError: FlashInfer backend "
                f"on SM90 currently crashes with sliding-window attention layers' (H200, 2026-12-02, "
                f"at the baseline's start); use FLASH_ATTN or TRITON_ATTN")
    return None


@rule("mla-backend", "invalid")
def _mla_backend(cell: Cell, ctx: RuleContext) -> str | None:
    """On CUDA an MLA model needs an MLA backend and an MLA backend an MLA model (on CPU vLLM
    picks its MLA backend itself, whatever --attention-backend says)."""
    mla_model = ctx.model.attention == "mla"
    if cell.device == "cuda" and mla_model and cell.backend not in MLA_BACKENDS:
        return (f"{cell.model} caches an MLA latent; vLLM serves it only with an MLA backend "
                f"({', '.join(MLA_BACKENDS)}), not {cell.backend}")
    if cell.backend in MLA_BACKENDS and not mla_model:
        return f"{cell.backend} serves MLA models only; {cell.model} is not declared attention: mla"
    return None


@rule("max-model-len", "invalid")
def _max_model_len(cell: Cell, ctx: RuleContext) -> str | None:
    """max_model_len stays within the model's max_position_embeddings."""
    limit = ctx.model.max_position_embeddings
    if limit and cell.max_model_len > limit:
        return f"max_model_len {cell.max_model_len} exceeds {cell.model}'s max_position_embeddings {limit}; lower it"
    return None
