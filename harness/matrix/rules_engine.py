"""Validity rules for a cell's engine settings: async scheduling, speculative decoding, prefix
reuse, chunked prefill, the CUDA-graph mode, the decode's KV layout and the KV cache dtypes
(harness.core.cell).

They look at the cell and, where an upstream limit depends on it, at the model's facts (hybrid or
not). Every exclusion names the vLLM code that makes the setting impossible or a no-op, read in
vLLM 0.32 (the CPU build this repository runs) unless it says otherwise; a cell that would only
repeat the default cell's servers is excluded too, with that reason, rather than run twice.

Registered in the order they are checked (harness.matrix.rules runs these after rules_cell).
"""
from __future__ import annotations

from harness.core.cell import (ASYNC_SCHEDULING, CUDAGRAPH_MODES, DRAFT_MODEL_SPEC_DECODE,
                               EAGLE_SPEC_DECODE, KV_CACHE_DTYPES, KV_LAYOUTS, MTP_SPEC_DECODE,
                               SPEC_DECODE_METHODS, Cell)
from harness.core.spec_decode import (EAGLE_TARGETS, MTP_MODELS, PREFILL_SPEC_TOKENS,
                                      SPEC_DECODE_CONFIGS)
from harness.connectors import KV_CONNECTORS
from harness.connectors.facts import (KV_DTYPE_MIX, KV_HEAD_MIX, KV_LAYERS_MIX, PERMUTE_HYBRID,
                                      Refusal)
from harness.matrix.rule_types import RuleContext, RuleList
from harness.matrix.rules_models import NO_PREFIX_CACHING
from harness.zoo import registry
MIN_CHUNK_TOKENS = 16     # the smallest chunked-prefill budget a cell may ask for (see the rule)

RULES = RuleList()
rule = RULES.rule


# the draft on the decode only (the prefill without it), and how a pair of it must end: the
# decode's handshake refuses the prefill's fewer KV layers and every request errors
DRAFT_DECODE_ONLY = "draft_p0_d3"
# the EAGLE head on the decode only: the decode's handshake refuses it (the connector's facts)
EAGLE_DECODE_ONLY = "eagle_p0_d3"


def refusal(cell: Cell, kind: str) -> Refusal | None:
    """How the cell's connector refuses a pair whose servers differ by `kind` (None: unknown)."""
    row = KV_CONNECTORS.get(cell.kv_connector)
    return row.refusals.get(kind) if row else None


def refusal_reason(cell: Cell, kind: str) -> str:
    """The refusal in words: the connector's own, or that it was not measured."""
    row = KV_CONNECTORS.get(cell.kv_connector)
    found = refusal(cell, kind)
    if found:
        return found.how
    word = row.word if row else cell.kv_connector
    return f"how {word} refuses such a pair was not measured: any loud failure is the refusal"


def refusal_pattern(kind: str):
    """An xfail rule's pattern: the words of the cell's connector's refusal of `kind`."""
    def pattern(cell: Cell) -> str | None:
        found = refusal(cell, kind)
        return found.fails_with if found else None
    return pattern


# ---- vocabulary -----------------------------------------------------------------------------

def _vocabulary(name: str, field: str, allowed: tuple[str, ...], summary: str,
                nullable: bool = False) -> None:
    """Register rule `name`: the cell's `field` is one of `allowed` (or null when `nullable`)."""
    def check(cell: Cell, ctx: RuleContext) -> str | None:
        value = getattr(cell, field)
        if value in allowed or (nullable and value is None):
            return None
        return (f"unknown {field} {value!r}; use {'null or ' if nullable else ''}one of "
                f"{', '.join(allowed)}")

    check.__doc__ = summary
    rule(name, "invalid")(check)


_vocabulary("known-async-scheduling", "async_scheduling", ASYNC_SCHEDULING,
            "Async scheduling is vLLM's default, on (--async-scheduling) or off (--no-async-scheduling).")
_vocabulary("known-spec-decode", "spec_decode", SPEC_DECODE_METHODS,
            "Speculative decoding is off (null) or a method the harness configures (ngram, or "
            "the zoo's draft model, EAGLE head or MTP head with P and D token counts: "
            "draft_p1_d3, eagle_p1_d3, mtp_p1_d3, mtp_p3_d3).",
            nullable=True)
_vocabulary("known-cudagraph-mode", "cudagraph_mode", CUDAGRAPH_MODES,
            "The CUDA-graph mode is vLLM's default or one of FULL, PIECEWISE, NONE.")
_vocabulary("known-kv-layout", "kv_layout", KV_LAYOUTS,
            "The decode's KV layout is vLLM's default, HND or NHD.")
_vocabulary("known-prefill-kv-cache-dtype", "prefill_kv_cache_dtype", KV_CACHE_DTYPES,
            "The prefill's KV cache dtype is auto (the model's) or an fp8 format.")
_vocabulary("known-decode-kv-cache-dtype", "decode_kv_cache_dtype", KV_CACHE_DTYPES,
            "The decode's KV cache dtype is auto (the model's) or an fp8 format.")


@rule("chunked-prefill-budget", "invalid")
def _chunk_budget(cell: Cell, ctx: RuleContext) -> str | None:
    """A chunked-prefill budget is an integer from 16 to below max_model_len (it must split a prompt)."""
    budget = cell.chunked_prefill
    if budget is None:
        return None
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_CHUNK_TOKENS:
        return (f"chunked_prefill {budget!r} must be an integer >= {MIN_CHUNK_TOKENS} tokens per step "
                "(vLLM needs the decode's draft slots inside the budget; smaller budgets only add "
                "engine steps), e.g. 64")
    if budget >= cell.max_model_len:
        return (f"chunked_prefill {budget} splits no prompt: it is not below max_model_len "
                f"{cell.max_model_len} (vLLM CPU's own budget is 2048 per step); use e.g. 64")
    return None


# ---- where a setting exists -----------------------------------------------------------------

@rule("async-scheduling-not-on-cpu", "invalid")
def _async_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """vLLM CPU forces async scheduling off, so on/off are GPU settings."""
    if cell.device == "cpu" and cell.async_scheduling != "default":
        return ("vLLM CPU always schedules synchronously (vllm/platforms/cpu.py "
                "check_and_update_config sets scheduler_config.async_scheduling = False): "
                f"async_scheduling {cell.async_scheduling} would run the default cell; use device cuda")
    return None


@rule("async-scheduling-spec-decode", "invalid")
def _async_spec(cell: Cell, ctx: RuleContext) -> str | None:
    """Explicit async scheduling rejects ngram speculative decoding (EAGLE/MTP/draft/ngram_gpu only)."""
    if cell.async_scheduling == "on" and cell.spec_decode == "ngram":
        return ("vLLM refuses --async-scheduling with ngram speculative decoding ('Currently, async "
                "scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/...', "
                "vllm/config/vllm.py); by default it turns async off for ngram: use "
                "async_scheduling default with spec_decode ngram")
    return None


@rule("draft-model-zoo-target", "invalid")
def _draft_target(cell: Cell, ctx: RuleContext) -> str | None:
    """The zoo's draft model speaks the zoo's tokenizer: its target must be a zoo model."""
    if cell.spec_decode not in DRAFT_MODEL_SPEC_DECODE or cell.model in registry.zoo_names():
        return None
    return (f"spec_decode {cell.spec_decode} drafts with the zoo's tiny-llama-gsm-draft, whose "
            f"tokenizer and 1,024-token vocabulary are the zoo's; {cell.model} has its own, and "
            "vLLM's draft_model method proposes token ids of the target's vocabulary: use a zoo "
            "model, or ngram")


@rule("eagle-head-target", "invalid")
def _eagle_target(cell: Cell, ctx: RuleContext) -> str | None:
    """An EAGLE head reads its target's hidden states: it drafts for that one model only."""
    target = EAGLE_TARGETS.get(cell.spec_decode or "")
    if target is None or cell.model == target:
        return None
    head = SPEC_DECODE_CONFIGS[cell.spec_decode]["model"]
    return (f"spec_decode {cell.spec_decode} drafts with the zoo's {head}, an EAGLE head trained "
            f"on {target}'s hidden states (its width, its lm_head and embedding); {cell.model} "
            f"is another model: use {target}, or a draft model (draft_p1_d3) or ngram")


@rule("mtp-head-model", "invalid")
def _mtp_model(cell: Cell, ctx: RuleContext) -> str | None:
    """vLLM's mtp method reads the head from the served checkpoint: only the zoo model that holds
    it (the target's weights and the head's) can run it."""
    model = MTP_MODELS.get(cell.spec_decode or "")
    if model is None or cell.model == model:
        return None
    return (f"spec_decode {cell.spec_decode} runs vLLM's mtp method, which reads the MTP head from "
            f"the served checkpoint (mtp.* weights, num_nextn_predict_layers); the zoo's head, "
            f"trained on tiny-qwen3next-hybrid-gsm's hidden states, is in {model} only; "
            f"{cell.model} has none: use {model}, or ngram")


@rule("draft-model-on-both-sides", "note")
def _draft_both_sides(cell: Cell, ctx: RuleContext) -> str | None:
    """A draft model, EAGLE or MTP head runs on the prefill too (1 token), the decode and the
    baseline (3)."""
    if (cell.spec_decode not in DRAFT_MODEL_SPEC_DECODE + EAGLE_SPEC_DECODE + MTP_SPEC_DECODE
            or cell.spec_decode in (DRAFT_DECODE_ONLY, EAGLE_DECODE_ONLY)):
        return None
    tokens = PREFILL_SPEC_TOKENS[cell.spec_decode]
    counts = ("with 1 speculative token, the decode and the baseline with 3 (vLLM's P/D CI)"
              if tokens == 1 else f"with {tokens} speculative tokens, as the decode and the "
              "baseline do")
    return (f"the prefill runs the draft {counts}: vLLM adds the draft's attention layers to "
            "each server's KV "
            "cache, so the pair moves them with the target's and the byte account counts them")


@rule("draft-model-decode-only", "xfail", fails_with=refusal_pattern(KV_LAYERS_MIX))
def _draft_decode_only(cell: Cell, ctx: RuleContext) -> str | None:
    """A draft on the decode only must be refused loudly: the prefill lacks its KV layers."""
    if cell.spec_decode != DRAFT_DECODE_ONLY:
        return None
    return ("the decode runs the draft and the prefill does not, so the decode's KV cache has the "
            f"draft's attention layers too (tiny-llama-gsm: 6 against 4); "
            f"{refusal_reason(cell, KV_LAYERS_MIX)}. That refusal is the expected outcome; "
            "serving any answer is not")


@rule("eagle-decode-only", "xfail", fails_with=refusal_pattern(KV_HEAD_MIX))
def _eagle_decode_only(cell: Cell, ctx: RuleContext) -> str | None:
    """An EAGLE head on the decode only must be refused loudly: the prefill lacks it."""
    if cell.spec_decode != EAGLE_DECODE_ONLY:
        return None
    return ("the decode runs the EAGLE head and the prefill does not, so the decode's KV cache "
            f"has the head's layer too (tiny-llama-gsm: 5 against 4); "
            f"{refusal_reason(cell, KV_HEAD_MIX)}. That refusal is the expected outcome; "
            "serving any answer is not")


@rule("cudagraph-mode-cuda-only", "invalid")
def _cudagraph_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """CUDA graphs exist only on GPU."""
    if cell.device == "cpu" and cell.cudagraph_mode != "default":
        return ("vLLM CPU captures no CUDA graphs (CPUModelRunner sets use_cuda_graph = False; "
                "vllm/platforms/cpu.py empties cudagraph_capture_sizes and the mode resolves to NONE): "
                f"cudagraph_mode {cell.cudagraph_mode} would run the default cell; use device cuda")
    return None


@rule("cudagraph-mode-needs-compile", "invalid")
def _cudagraph_eager(cell: Cell, ctx: RuleContext) -> str | None:
    """--enforce-eager sets the CUDA-graph mode to NONE, so a mode needs compile default."""
    if cell.compile == "eager" and cell.cudagraph_mode != "default":
        return ("--enforce-eager overrides cudagraph_mode to NONE (vllm/config/vllm.py: 'Cudagraph is "
                f"disabled under eager mode'): cudagraph_mode {cell.cudagraph_mode} with compile eager "
                "would run the eager cell; use compile default")
    return None


@rule("cudagraph-full-downgraded", "invalid")
def _cudagraph_full(cell: Cell, ctx: RuleContext) -> str | None:
    """FULL needs attention that graphs every batch; FLASHINFER and hybrid models fall back to the default."""
    if cell.cudagraph_mode != "FULL":
        return None
    if cell.backend == "FLASHINFER" or ctx.model.is_hybrid:
        what = ("FLASHINFER graphs only uniform decode batches" if cell.backend == "FLASHINFER"
                else f"the {ctx.model.ssm or 'SSM'} layers of {cell.model} graph only uniform batches")
        return (f"{what} (AttentionCGSupport below ALWAYS), so vLLM downgrades FULL to "
                "FULL_AND_PIECEWISE, its default (CompilationConfig.resolve_cudagraph_mode_and_sizes): "
                "the cell would run the default cell; use PIECEWISE or NONE, or FULL with "
                "FLASH_ATTN (FA3 on Hopper) or TRITON_ATTN on a dense model")
    return None


@rule("kv-layout-cuda-only", "invalid")
def _layout_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """CPU_ATTN reads only HND blocks: the decode layout is a GPU setting."""
    if cell.device == "cpu" and cell.kv_layout != "default":
        return ("CPU_ATTN supports only the HND layout (cpu_attn.py supported_kv_cache_layouts = "
                "(LBHNC,)): NHD fails at start-up ('VLLM_KV_CACHE_LAYOUT=NHD does not satisfy every "
                "supported set') and HND is what every CPU server runs anyway; use device cuda")
    return None


@rule("kv-layout-nhd-not-hybrid", "invalid")
def _layout_hybrid(cell: Cell, ctx: RuleContext) -> str | None:
    """Receiving HND blocks into an NHD decode needs a permute that hybrid models' KV manager
    refuses (where the cell's connector permutes)."""
    found = refusal(cell, PERMUTE_HYBRID)
    if cell.kv_layout == "NHD" and ctx.model.is_hybrid and found:
        return f"{found.how}, such as {cell.model}; use kv_layout default or a dense model"
    return None


@rule("kv-layout-is-connector-default", "note")
def _layout_hnd(cell: Cell, ctx: RuleContext) -> str | None:
    """A decode layout that the cell's connector already asks for: the cell pins it."""
    row = KV_CONNECTORS.get(cell.kv_connector)
    if row and row.kv_layout and cell.kv_layout == row.kv_layout:
        return (f"{row.word} already asks for {row.kv_layout} on both sides "
                "(get_required_kvcache_layout); this cell pins it on the decode so a change of "
                "that default cannot pass unseen")
    return None


# ---- KV cache dtype -------------------------------------------------------------------------

# The fp8 --kv-cache-dtype values each backend lists in supported_kv_cache_dtypes (vLLM 0.32's
# vllm/v1/attention/backends/*.py; the CUDA ones read there, not run). FLASH_ATTN's fp8 is FA3's
# e4m3, which needs Hopper (flash_attn_supports_kv_cache_dtype): the H200 the nightly runs on.
FP8_KV_CACHE_DTYPES = {
    "CPU_ATTN": ("fp8", "fp8_e4m3", "fp8_e5m2"),
    "FLASHINFER": ("fp8", "fp8_e4m3", "fp8_e5m2"),
    "TRITON_ATTN": ("fp8", "fp8_e4m3", "fp8_e5m2"),
    "FLASH_ATTN": ("fp8", "fp8_e4m3"),
    "FLASHMLA": ("fp8", "fp8_e4m3"),
    "TRITON_MLA": ("fp8", "fp8_e4m3"),
}
# fp8 formats a backend lists but whose server did not start, measured: (device, backend, dtype)
FP8_KV_FAILS_AT_START = {
    ("cuda", "TRITON_ATTN", "fp8_e5m2"): "vLLM 0.26.0 on the H200 (2026-12-03): the engine core dies in "
    "torch.compile, 'torch._dynamo.exc.Unsupported: Data-dependent assertion failed'",
}
@rule("kv-cache-dtype-backend", "invalid")
def _kv_dtype_backend(cell: Cell, ctx: RuleContext) -> str | None:
    """The backend stores the cell's fp8 KV cache format (FLASH_ATTN and MLA: e4m3 only)."""
    allowed = FP8_KV_CACHE_DTYPES.get(cell.backend, ())
    bad = [d for d in dict.fromkeys((cell.prefill_kv_cache_dtype, cell.decode_kv_cache_dtype))
           if d != "auto" and d in KV_CACHE_DTYPES and d not in allowed]
    if not bad:
        for dtype in (cell.prefill_kv_cache_dtype, cell.decode_kv_cache_dtype):
            seen = FP8_KV_FAILS_AT_START.get((cell.device, cell.backend, dtype))
            if seen:
                return f"{cell.backend} lists {dtype} but its server does not start: {seen}"
        return None
    return (f"{cell.backend} has no {bad[0]} KV cache (its supported_kv_cache_dtypes list "
            f"{', '.join(('auto',) + allowed)}); use one of those or another backend")


@rule("kv-cache-fp8-cpu-head-size", "invalid")
def _kv_dtype_cpu_head(cell: Cell, ctx: RuleContext) -> str | None:
    """CPU_ATTN stores fp8 KV only for head sizes that are multiples of 32."""
    head = ctx.model.head_dim
    fp8 = {cell.prefill_kv_cache_dtype, cell.decode_kv_cache_dtype} != {"auto"}
    if cell.backend != "CPU_ATTN" or not fp8 or not head or head % 32 == 0:
        return None
    return (f"{cell.model} has head_dim {head}; CPU_ATTN raises 'FP8 KV cache requires head_size "
            "divisible by 32 on CPU' (cpu_attn._get_attn_isa): use kv_cache_dtype auto")


@rule("kv-cache-dtype-mismatch", "xfail", fails_with=refusal_pattern(KV_DTYPE_MIX))
def _kv_dtype_mismatch(cell: Cell, ctx: RuleContext) -> str | None:
    """P and D with different KV cache dtypes must be refused loudly (the connector's refusal)."""
    if cell.prefill_kv_cache_dtype == cell.decode_kv_cache_dtype:
        return None
    return (f"prefill {cell.prefill_kv_cache_dtype} and decode {cell.decode_kv_cache_dtype} KV "
            f"caches: {refusal_reason(cell, KV_DTYPE_MIX)}; that refusal is the expected "
            "outcome, serving any answer (right or wrong) is not")


# ---- prefix reuse ---------------------------------------------------------------------------

@rule("prefix-reuse-needs-prefix-caching", "invalid")
def _prefix_caching(cell: Cell, ctx: RuleContext) -> str | None:
    """Prefix reuse needs the decode's prefix cache, so it cannot run with prefix caching off."""
    if cell.prefix_reuse and NO_PREFIX_CACHING in cell.extra_args:
        return (f"prefix_reuse needs the decode's own prefix cache and {NO_PREFIX_CACHING} turns it "
                "off: the decode would fetch every block; drop one of the two")
    return None


@rule("prefix-reuse-evidence", "note")
def _prefix_evidence(cell: Cell, ctx: RuleContext) -> str | None:
    """Prefix reuse: from the second question on, the decode's /metrics count local cache hits."""
    if cell.prefix_reuse:
        return ("the cell asks the task's shared-prefix variant (gsm_synth_shared: one price list; "
                "gsm8k_local_shared: 5 fixed shots); from its second question on the decode's "
                "vllm:prompt_tokens_by_source_total grows in source=local_cache_hit (the shared "
                "blocks) besides source=external_kv_transfer (the rest, through the connector)")
    return None
