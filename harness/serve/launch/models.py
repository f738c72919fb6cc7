"""Resolve a cell's `model` to something vLLM can load, and read the facts the run needs from its
config.json (hybrid or dense), without importing vLLM."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.core.reference import ReferenceAccuracy

HYBRID_ARCHITECTURES = {
    "GraniteMoeHybridForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM", "FalconH1ForCausalLM",
    "BambaForCausalLM", "JambaForCausalLM", "Zamba2ForCausalLM", "MambaForCausalLM",
    "Mamba2ForCausalLM", "Plamo2ForCausalLM", "Lfm2ForCausalLM",
}


class ModelNotFound(ValueError):
    pass


@dataclass(frozen=True)
class ResolvedModel:
    name: str            # what the cell said
    path: str            # what vLLM gets as --model
    local: bool          # a directory on this machine (else a hub id)
    hybrid: bool
    architecture: str | None


MAX_CONFIG_BYTES = 4 << 20   # an HF config.json is a few KiB


def _zoo_path(name: str) -> str | None:
    from harness.zoo import random_llama, registry

    if name == random_llama.NAME:
        return str(random_llama.build())
    if name in registry.zoo_names():
        return str(registry.resolve_model(name))
    return None


def resolve(name: str) -> ResolvedModel:
    """Zoo name → committed checkpoint; existing path → itself; 'org/name' → hub id (GPU farms)."""
    path = _zoo_path(name)
    if path is None:
        p = Path(name).expanduser()
        if p.exists():
            path = str(p.resolve())
        elif name.count("/") == 1 and not name.startswith((".", "/", "~")):
            return ResolvedModel(name, name, local=False, hybrid=False, architecture=None)
        else:
            raise ModelNotFound(f"model {name!r} is neither a zoo model, an existing path, nor a hub id")
    config_file = Path(path) / "config.json"
    if not config_file.exists():
        raise ModelNotFound(f"model {name!r}: {config_file} does not exist")
    try:
        config = json.loads(config_file.read_bytes()[:MAX_CONFIG_BYTES])
    except (OSError, ValueError) as exc:   # UnicodeDecodeError and JSONDecodeError included
        raise ModelNotFound(f"model {name!r}: {config_file} is not JSON: "
                            f"{str(exc)[:120]}") from None
    if not isinstance(config, dict) or not isinstance(config.get("architectures") or [], list):
        raise ModelNotFound(f"model {name!r}: {config_file} is not an HF config (a mapping "
                            f"with a list of architectures)")
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    layer_kinds = " ".join(str(x) for x in (config.get("layer_types") or config.get("layers_block_type") or []))
    hybrid = bool(set(archs) & HYBRID_ARCHITECTURES) or "mamba" in layer_kinds or "linear" in layer_kinds
    return ResolvedModel(name, path, local=True, hybrid=hybrid, architecture=arch)


def reference_accuracy(model: ResolvedModel, task: str):
    """The model's accuracy on `task` as its zoo card measured it (eval_vllm.json), or None."""
    from harness.zoo.card import VLLM_EVAL_JSON

    if not model.local:
        return None
    path = Path(model.path) / VLLM_EVAL_JSON
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("task") != task or data.get("strict_match") is None or not data.get("n"):
        return None
    return ReferenceAccuracy(accuracy=float(data["strict_match"]), n=int(data["n"]),
                             source=f"its model card ({data.get('vllm') or 'vLLM'})")
