"""How many bytes of KV cache one prompt token occupies, read from a model's HF config.json.

Used for the exact byte accounting of the KV connector (harness.judge.byte_accounting): on every cell measured so far
(CPU vLLM 0.32 and H200 vLLM 0.26; dense, Granite/Mamba2, Qwen3Next/GDN; blocks 16/32/64/128,
P64->D128, TP1->TP2, host buffer) the connector's byte counter equals, to the byte,

    sum over requests of (attention blocks read x prefill block size x attention bytes per token)
                       + (state layers x state bytes per layer)

where the attention bytes per token are ``2 (K and V) x KV heads x head dim x dtype bytes`` summed
over the attention layers, whatever the backend's physical layout or kernel block size (the bytes
of one logical block are the same however it is split). A recurrent layer's state bytes are not
derivable from config.json alone (vLLM keeps the SSM state in float32 on CPU and in the model
dtype on the H200), so they come from the decode server's own log line (harness.serve.launch.logscan).

An MLA model caches one latent vector per token and layer (``kv_lora_rank + qk_rope_head_dim``
elements, no K/V pair, no heads): 2,906 blocks x 16 tokens x 576 x 2 bytes x 2 layers was
exactly the connector's count of the random MLA cell on CPU (results/reference/cpu-mla-20261201).

A model with sliding-window layers (``layer_types`` lists ``sliding_attention``) is served by
vLLM's hybrid KV cache manager in KV cache groups of equal size (`kv_cache_groups`: vLLM's
uniform-page grouping, a kind's short groups padded to the size), and a sliding group lists
only the blocks its window still reads, the null block (id 0) in place of the others. A block
id of any group spans one page in each of the group size's cache tensors, padding slots
included, so each group's bytes are its real (non-null) block ids x block size x group size x
one layer's bytes per token: on the CPU cell of tiny-llama-swa-gsm (2 sliding + 2 full layers:
two groups of two; window 64, prompts of 429-485 tokens) that was 139,853,824 bytes for 200
requests, the connector's own count to the byte, where counting the null ids too gives 157,286,400
(results/reference/cpu-swa-20261202); on the H200 cell of shape-gemma-3-4b (5 full + 29
sliding layers: groups of 5, the sixth sliding one padded, 7 x 5 = 35 slots for 34 layers) it
was 3,670,016,000 bytes for 50 requests, where 34 layers give 3,565,158,400
(results/reference/gpu-h200-shapes-fp8-push-20261203). A recurrent hybrid whose groups are padded is not
modelled (which padding slots its state/attention registration reads was never measured).

An fp8 KV cache (``--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2``, the cell's kv_cache_dtype) stores one
byte per element in the same layout, and nothing else: vLLM's KV scales are per layer (k_scale,
v_scale: 1.0 unless a checkpoint or calculate_kv_scales sets them), held in the attention layer,
not in the cache blocks, so the connector moves blocks only and no scale crosses to the decode. The
attention bytes per token use 1 byte per element then. MLA's fp8 formats pack scales into the
latent (FlashMLA's fp8_ds_mla), so an fp8 latent cache is not modelled.

A draft model for speculative decoding (vLLM's draft_model method) adds its own attention
layers to the server's KV cache; with the target's page size they share its KV cache group, so
a P/D pair whose both sides run the draft moves the draft's KV of the same blocks too
(`with_draft`). An EAGLE head (vLLM's eagle method) does the same with its own decoder layer(s),
read from the head's config.json like a draft model's. An MTP head (vLLM's mtp method) lives in
the target's own checkpoint: its ``num_nextn_predict_layers`` full-attention layers, of the
target's page (`draft_geometry`).

Pure: no vLLM import. Models whose geometry this does not model (an fp8 latent cache, a window
without per-layer types, a hybrid with a window, a --kv-cache-dtype in extra_args) raise
GeometryUnknown with the reason, and the check is skipped with that reason in the record rather
than guessed.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import Any, Mapping

from harness.core.model_config import decoder_config

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
# --kv-cache-dtype values other than "auto" (the model dtype): bytes per cached element
KV_CACHE_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
ATTENTION_KINDS = ("attention", "full_attention", "full", "sliding_attention")
SLIDING_KINDS = ("sliding_attention",)
STATE_KINDS = ("mamba", "linear_attention", "mamba2", "ssm", "linear")


class GeometryUnknown(ValueError):
    """The model's KV bytes per token cannot be stated exactly from its config."""


@dataclass(frozen=True)
class KvGeometry:
    attention_layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    state_layers: int = 0           # SSM / linear-attention layers (one state per request each)
    latent: bool = False            # MLA: head_dim is the latent size, one vector per token
    sliding_layers: int = 0         # attention layers with a window (their group lists null ids)
    draft_layers: int = 0           # of attention_layers, a draft model's (speculative decoding)

    @property
    def layer_bytes_per_token(self) -> int:
        """One attention layer's share of `attention_bytes_per_token` (every layer's page is alike)."""
        return self.attention_bytes_per_token // max(1, self.attention_layers)

    @property
    def cache_groups(self) -> tuple["KvCacheGroup", ...]:
        """vLLM's KV cache groups of this model (`kv_cache_groups`; kinds in a fixed order, which
        says nothing of vLLM's: every group spans the same number of slots)."""
        return kv_cache_groups({"full": self.attention_layers - self.sliding_layers,
                                "sliding": self.sliding_layers, "state": self.state_layers})

    @property
    def padded(self) -> bool:
        """Whether vLLM pads a KV cache group of this model (slots that hold no layer)."""
        return any(g.slots > g.layers for g in self.cache_groups)

    @property
    def attention_bytes_per_token(self) -> int:
        """K and V of one token in every attention layer, all KV heads (summed over TP ranks);
        for MLA the one latent vector of each layer."""
        if self.latent:
            return self.attention_layers * self.head_dim * self.dtype_bytes
        return self.attention_layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def to_dict(self) -> dict[str, int]:
        return {"attention_layers": self.attention_layers, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "dtype_bytes": self.dtype_bytes,
                "state_layers": self.state_layers, "latent": self.latent,
                "sliding_layers": self.sliding_layers, "draft_layers": self.draft_layers,
                "attention_bytes_per_token": self.attention_bytes_per_token,
                "kv_cache_groups": [[g.kind, g.layers, g.slots] for g in self.cache_groups]}


@dataclass(frozen=True)
class KvCacheGroup:
    kind: str      # "full" | "sliding" | "state": the layers' KV cache spec
    layers: int    # the model's layers in the group
    slots: int     # the group size: its layers plus the padding vLLM adds


def kv_cache_groups(counts: Mapping[str, int]) -> tuple[KvCacheGroup, ...]:
    """The KV cache groups vLLM's hybrid KV cache manager makes of layers whose pages are alike,
    `counts` being the layers of each kind (spec): one group when there is one kind, else
    vLLM's uniform-page grouping (v1/core/kv_cache_utils.py,
    _get_kv_cache_groups_uniform_page_size, the same in 0.26 and 0.32): the group size is the
    smallest kind's layer count, or the largest's when that is under 1.5 x the smallest; a kind
    of n layers makes ceil(n / size) groups, the i-th holding its layers i, i + groups, ...,
    each group padded to the size. gemma-3-4b (5 full + 29 sliding): 7 groups of 5 slots."""
    kinds = {kind: n for kind, n in counts.items() if n > 0}
    if len(kinds) <= 1:
        return tuple(KvCacheGroup(kind, n, n) for kind, n in kinds.items())
    smallest, largest = min(kinds.values()), max(kinds.values())
    size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for kind, n in kinds.items():
        num = ceil(n / size)
        groups += [KvCacheGroup(kind, len(range(i, n, num)), size) for i in range(num)]
    return tuple(groups)


def _refuse_padded_state(geometry: KvGeometry) -> KvGeometry:
    """`geometry`, unless it is a recurrent hybrid whose KV cache groups vLLM pads."""
    if geometry.state_layers and geometry.padded:
        groups = ", ".join(f"{g.kind} {g.layers}/{g.slots}" for g in geometry.cache_groups)
        raise GeometryUnknown(f"a recurrent hybrid whose KV cache groups are padded ({groups} "
                              f"layers/slots): the bytes of its padding slots are not modelled")
    return geometry


def _layer_kinds(config: Mapping[str, Any]) -> list[str] | None:
    kinds = config.get("layer_types") or config.get("layers_block_type")
    return [str(k).lower() for k in kinds] if kinds else None


def geometry_from_config(config: Mapping[str, Any], dtype: str,
                         extra_args: tuple[str, ...] = (), kv_cache_dtype: str = "auto") -> KvGeometry:
    """The geometry of `config` (an HF config.json) served with `dtype` and `kv_cache_dtype`;
    GeometryUnknown if not exact. `extra_args` are the servers' extra vLLM arguments (a
    --kv-cache-dtype there is not read: the cell's kv_cache_dtype axis says it)."""
    if any(a.startswith("--kv-cache-dtype") for a in extra_args):
        raise GeometryUnknown("the servers set --kv-cache-dtype in extra_args: bytes per token "
                              "not modelled (use the kv_cache_dtype axis)")
    if kv_cache_dtype != "auto" and kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise GeometryUnknown(f"kv_cache_dtype {kv_cache_dtype!r}: bytes per element not known")
    config = decoder_config(config)   # a multimodal model's text_config (gemma-3, Qwen3.5)
    windowed = bool(config.get("sliding_window")) and config.get("use_sliding_window", True)
    if windowed and not any(k in SLIDING_KINDS for k in _layer_kinds(config) or ()):
        raise GeometryUnknown("sliding-window attention without per-layer types: which layers "
                              "are clipped to the window is not modelled")
    dtype_bytes = KV_CACHE_DTYPE_BYTES.get(kv_cache_dtype) or DTYPE_BYTES.get(str(dtype).lower())
    if dtype_bytes is None:
        raise GeometryUnknown(f"dtype {dtype!r}: bytes per element not known")
    if config.get("kv_lora_rank") and kv_cache_dtype != "auto":
        raise GeometryUnknown(f"an {kv_cache_dtype} MLA latent cache: its layout (scales packed "
                              "in the latent) is not modelled")
    if config.get("kv_lora_rank"):
        try:
            latent = int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"])
            layers = int(config["num_hidden_layers"])
        except (KeyError, TypeError, ValueError) as exc:
            raise GeometryUnknown(f"MLA config.json lacks {exc} for the latent size") from None
        return KvGeometry(layers, 1, latent, dtype_bytes, latent=True)
    if config.get("use_mla"):
        raise GeometryUnknown("MLA without kv_lora_rank: latent size not known")
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        layers = int(config["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise GeometryUnknown(f"config.json lacks {exc} for the KV geometry") from None
    kinds = _layer_kinds(config)
    if kinds is None:
        return KvGeometry(layers, kv_heads, head_dim, dtype_bytes)
    attention = sum(k in ATTENTION_KINDS for k in kinds)
    state = sum(k in STATE_KINDS for k in kinds)
    if attention + state != len(kinds):
        other = sorted({k for k in kinds if k not in ATTENTION_KINDS + STATE_KINDS})
        raise GeometryUnknown(f"layer kinds {other} not modelled")
    sliding = sum(k in SLIDING_KINDS for k in kinds) if windowed else 0
    if sliding and state:
        raise GeometryUnknown("sliding-window layers in a hybrid: groups not modelled")
    return _refuse_padded_state(KvGeometry(attention, kv_heads, head_dim, dtype_bytes,
                                           state_layers=state, sliding_layers=sliding))


def draft_geometry(config: Mapping[str, Any], dtype: str, extra_args: tuple[str, ...] = (),
                   kv_cache_dtype: str = "auto") -> KvGeometry:
    """The KV geometry of a checkpoint read as a server's draft: a checkpoint that declares MTP
    layers (``num_nextn_predict_layers``, vLLM's mtp method reading the target's own checkpoint)
    drafts with those, each one full-attention layer of the target's KV heads and head dim
    (Qwen3-Next's MTP layer); any other is a draft model or EAGLE head of its own layers."""
    target = geometry_from_config(config, dtype, extra_args, kv_cache_dtype)
    mtp = config.get("num_nextn_predict_layers")
    if not mtp:
        return target
    if target.latent or target.sliding_layers:
        raise GeometryUnknown("MTP layers of an MLA or sliding-window model are not modelled")
    return KvGeometry(int(mtp), target.kv_heads, target.head_dim, target.dtype_bytes)


def with_draft(target: KvGeometry, draft: KvGeometry) -> KvGeometry:
    """``target`` served with a draft model (vLLM's draft_model method) or an EAGLE or MTP head:
    the draft's attention layers join the target's KV cache group when their page is the same (same KV heads, head
    dim and cache dtype), so the same blocks of them cross; another page is not modelled."""
    same_page = ((draft.kv_heads, draft.head_dim, draft.dtype_bytes, draft.latent)
                 == (target.kv_heads, target.head_dim, target.dtype_bytes, target.latent))
    if not same_page or draft.state_layers or draft.sliding_layers or target.sliding_layers:
        raise GeometryUnknown("a draft model whose KV page differs from the target's (its own "
                              "KV cache group) is not modelled")
    return _refuse_padded_state(KvGeometry(
        target.attention_layers + draft.attention_layers, target.kv_heads, target.head_dim,
        target.dtype_bytes, state_layers=target.state_layers, latent=target.latent,
        draft_layers=draft.attention_layers))


__all__ = ["DTYPE_BYTES", "KV_CACHE_DTYPE_BYTES", "GeometryUnknown", "KvCacheGroup", "KvGeometry",
           "draft_geometry", "geometry_from_config", "kv_cache_groups", "with_draft"]
