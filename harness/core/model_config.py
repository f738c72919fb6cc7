"""A model's facts read from its own config.json: what the validity rules need, for any model.

The matrix YAML may override a fact (harness.core.catalog), never has to declare one: a copy of a
zoo checkpoint at a path of its own gets the same facts, hence the same rules, as its zoo name.

Read as written, for the decoder's config (`text_config` of a multimodal model first); a fact the
file leaves to its class default (gemma-3's config.json states no head counts) is completed by
transformers' config class for its `model_type`, the class vLLM itself loads, only when needed.

The hybrid block-size arithmetic mirrors vLLM's own (Platform.check_and_update_config's
hybrid branch, vLLM 0.26 and 0.32): the attention page of one block must hold one SSM state page,
so vLLM raises a smaller --block-size, silently, to `align * ceil(state / (align * kv_per_token))`
with `align = max(block, the backend's smallest kernel block)`. On the zoo's Granite hybrid this
gives the raises vLLM CPU 0.32 logs (64 -> 128, 16 -> 96; harness.zoo.registry).
Pure: no vLLM import; transformers is imported lazily.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

HYBRID_ARCHITECTURES = frozenset({
    "GraniteMoeHybridForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
    "NemotronHForCausalLM", "FalconH1ForCausalLM", "BambaForCausalLM", "JambaForCausalLM",
    "Zamba2ForCausalLM", "MambaForCausalLM", "Mamba2ForCausalLM", "Plamo2ForCausalLM",
    "Lfm2ForCausalLM",
})
STATE_LAYER_KINDS = ("mamba", "mamba2", "linear_attention", "linear", "ssm", "conv")
# model_type -> the family name the matrix YAML's selectors and known-bug rules use
FAMILY_ALIASES = {"granitemoehybrid": "granite", "qwen3_next": "qwen3next",
                  "qwen3_5_text": "qwen3_5", "gemma3_text": "gemma3"}
# facts a decoder config must state (or its class default) for the shape rules
_SHAPE_KEYS = ("num_attention_heads", "num_hidden_layers", "max_position_embeddings")
# smallest kernel block of the attention backends vLLM picks by device (CPU_ATTN: multiples of
# 32; FLASH_ATTN / TRITON_ATTN / FLASHINFER on CUDA: 16)
KERNEL_BLOCK_ALIGNMENT = {"cpu": 32, "cuda": 16}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
# vLLM 0.32 CPU serves an MLA model with one of two backends (CpuPlatform.get_attn_backend_cls,
# check_and_update_config): AMX_MLA where the CPU has AMX tiles (bf16 only, blocks a multiple of
# 32, kept as asked), else CPU_MLA, whose decode kernel compiles for one block: it replaces any
# asked block with 16 ("CPU MLA backend requires block_size=16, overriding ...")
CPU_MLA_BLOCK = 16
AMX_MLA_BLOCK_MULTIPLE = 32
AMX_MLA_DTYPE = "bfloat16"


class ModelConfigError(ValueError):
    """A config.json that cannot be read as a model config; str() is one line."""


@dataclass(frozen=True)
class StatePage:
    """One SSM / linear-attention layer's state per request at TP1, in elements."""

    conv_elements: int
    ssm_elements: int

    def bytes(self, device: str, dtype: str) -> int:
        """vLLM keeps the conv state in the model dtype; vLLM CPU resets the SSM state to float32
        ("Reset SSM cache type to float32", AVX512-BF16 hosts), CUDA keeps the model dtype."""
        model_bytes = _DTYPE_BYTES.get(str(dtype).lower(), 2)
        ssm_bytes = 4 if device == "cpu" else model_bytes
        return self.conv_elements * model_bytes + self.ssm_elements * ssm_bytes


MAX_CONFIG_BYTES = 4 << 20   # an HF config.json is a few KiB; a bound before json reads it


def read_config(path: str | os.PathLike[str], model: str | None = None) -> dict[str, Any]:
    """The JSON object in `path` (a config.json); ModelConfigError with one line otherwise."""
    who = f"model {model!r}: " if model else ""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelConfigError(f"{who}cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"{who}{path} is over {MAX_CONFIG_BYTES >> 20} MiB, not a model config")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ModelConfigError(f"{who}{path} is not JSON (binary data), not a model config") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{who}{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{who}{path} holds a JSON {type(data).__name__}, not an HF "
                               f"config (a model config object)")
    archs = data.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ModelConfigError(f"{who}{path} is not an HF config: its architectures must be a "
                               f"list of names")
    return data


def hub_cache_config(repo_id: str, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """config.json of hub model `repo_id` when it is in the local Hugging Face cache (no network;
    `cache_dir`: another cache than $HF_HUB_CACHE's)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:   # harness installed without vLLM: no hub cache to read
        return None
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    return Path(found) if isinstance(found, str) else None


def find_config(name_or_path: str) -> Path | None:
    """config.json of a local model directory, or of a hub id cached locally; else None."""
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        return p / "config.json"
    if p.exists():
        return p if p.name == "config.json" else None
    if name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/", "~")):
        return hub_cache_config(name_or_path)
    return None


def decoder_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's keys (a multimodal model's `text_config` over its top level), completed by
    transformers' class defaults when a shape fact is missing."""
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, Mapping) else dict(config)
    if all(k in merged for k in _SHAPE_KEYS):
        return merged
    return {**_class_defaults(config), **merged}


def _class_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' defaults for `config`'s model_type (its decoder's), or {} when unknown."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return {}
    try:
        from transformers import AutoConfig

        full = AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
        return full.get_text_config(decoder=True).to_dict()
    except Exception:  # noqa: BLE001 - unknown type or invalid values: the file's own keys stand
        return {}


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and value > 0:
            return int(value)
    return None


def layer_kinds(config: Mapping[str, Any]) -> list[str]:
    """Per-layer kinds, lower case (layer_types, layers_block_type, or NemotronH's pattern)."""
    kinds = config.get("layer_types") or config.get("layers_block_type")
    if isinstance(kinds, list):
        return [str(k).lower() for k in kinds]
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        return [{"M": "mamba", "*": "attention"}.get(c, "mlp") for c in pattern]
    return []


def state_page(config: Mapping[str, Any]) -> tuple[str | None, StatePage | None]:
    """(ssm kind, one state layer's page at TP1) from the decoder config; (None, None) if dense."""
    if _int(config, "linear_num_value_heads"):
        k_heads = _int(config, "linear_num_key_heads") or 0
        v_heads = _int(config, "linear_num_value_heads") or 0
        k_dim = _int(config, "linear_key_head_dim") or 0
        v_dim = _int(config, "linear_value_head_dim") or 0
        kernel = _int(config, "linear_conv_kernel_dim") or 4
        conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
        return "gdn", StatePage(conv_dim * (kernel - 1), v_heads * v_dim * k_dim)
    heads = _int(config, "mamba_n_heads")
    if heads:
        hidden = _int(config, "hidden_size") or 0
        expand = _int(config, "mamba_expand") or 2
        groups = _int(config, "mamba_n_groups") or 1
        d_state = _int(config, "mamba_d_state", "ssm_state_size") or 0
        d_head = _int(config, "mamba_d_head") or 0
        conv_dim = expand * hidden + 2 * groups * d_state
        return "mamba2", StatePage(conv_dim * ((_int(config, "mamba_d_conv") or 4) - 1),
                                   heads * d_head * d_state)
    return None, None


def facts_from_config(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelInfo fields `config` (a config.json's object) states about model `name`."""
    text = decoder_config(config)
    archs = [str(a) for a in config.get("architectures") or [] if isinstance(a, str)]
    kinds = layer_kinds(text)
    ssm, page = state_page(text)
    hybrid = (bool(set(archs) & HYBRID_ARCHITECTURES) or page is not None
              or any(k in STATE_LAYER_KINDS for k in kinds))
    model_type = str(config.get("model_type") or text.get("model_type") or "") or None
    mla = _int(text, "kv_lora_rank") is not None
    heads = _int(text, "num_attention_heads")
    window = _int(text, "sliding_window")
    if text.get("use_sliding_window") is False:   # Qwen2/3 state a window they do not use
        window = None
    attention_layers = sum(("attention" in k and k not in STATE_LAYER_KINDS) for k in kinds) \
        or _int(text, "num_hidden_layers")
    facts: dict[str, Any] = {
        "name": name,
        "kind": "hybrid" if hybrid else "dense",
        "ssm": ssm if hybrid else None,
        "family": FAMILY_ALIASES.get(model_type, model_type) if model_type else None,
        "max_position_embeddings": _int(text, "max_position_embeddings"),
        "sliding_window": window,
        "attention": "mla" if mla else "mha",
        "architecture": archs[0] if archs else None,
        "attention_layers": attention_layers,
        "mtp_layers": _int(text, "num_nextn_predict_layers", "mtp_num_hidden_layers") or 0,
        "state_page": page,
        "source": "config.json",
    }
    if mla:   # one latent per token and layer, replicated across TP ranks: no KV heads to split
        facts.update(kv_lora_rank=_int(text, "kv_lora_rank"),
                     qk_rope_head_dim=_int(text, "qk_rope_head_dim"))
    elif heads:
        facts.update(num_kv_heads=_int(text, "num_key_value_heads") or heads,
                     head_dim=_int(text, "head_dim") or ((_int(text, "hidden_size") or 0) // heads or None))
    return facts


def raised_block_size(block: int, device: str, dtype: str, num_kv_heads: int, head_dim: int,
                      page: StatePage) -> int:
    """The attention block a hybrid server really runs when asked for `block` (vLLM's rule)."""
    dtype_bytes = _DTYPE_BYTES.get(str(dtype).lower(), 2)
    per_token = 2 * num_kv_heads * head_dim * dtype_bytes
    state = page.bytes(device, dtype)
    kernel = KERNEL_BLOCK_ALIGNMENT.get(device, 16)
    align = max(kernel, block)
    raised = align * math.ceil(state / (align * per_token))
    return max(block, kernel * math.ceil(raised / kernel))


def smallest_kept_block(device: str, dtype: str, num_kv_heads: int, head_dim: int,
                        page: StatePage) -> int:
    """The smallest block vLLM keeps as asked for this hybrid on `device`."""
    kernel = KERNEL_BLOCK_ALIGNMENT.get(device, 16)
    per_token = 2 * num_kv_heads * head_dim * _DTYPE_BYTES.get(str(dtype).lower(), 2)
    return kernel * math.ceil(page.bytes(device, dtype) / (kernel * per_token))


def cpu_mla_backend(cpu_isa: tuple[str, ...] | list[str]) -> str:
    """The backend vLLM CPU serves an MLA model with on a CPU with these ISA flags."""
    return "AMX_MLA" if "amx_tile" in cpu_isa else "CPU_MLA"


def cpu_mla_block_runs(block: int, cpu_isa: tuple[str, ...] | list[str]) -> int | None:
    """The block vLLM CPU runs an MLA model at when asked for `block`: CPU_MLA replaces it with
    16; AMX_MLA keeps a multiple of 32 and runs no other (None)."""
    if cpu_mla_backend(cpu_isa) == "CPU_MLA":
        return CPU_MLA_BLOCK
    return block if block % AMX_MLA_BLOCK_MULTIPLE == 0 else None
