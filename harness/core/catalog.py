"""Model facts: what the validity rules and the matrix need to know about a model.

The facts are declared in the matrix YAML (`models:` and `hybrid_block_sizes:`); a block-size
provider (the zoo's `required_block_size`) may complete them. This module only holds the types, so
that the rules can take a catalog without depending on the YAML loader.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping

BlockSizeProvider = Callable[[str, str], "int | None"]   # (model, device) -> min block size


@dataclass(frozen=True)
class ModelInfo:
    """What the rules need to know about a model. Unknown facts are None and skip their rule."""

    name: str
    kind: Literal["dense", "hybrid"] = "dense"
    ssm: str | None = None                  # "mamba2" | "gdn" for hybrids
    family: str | None = None               # "granite", "qwen3next", ... (for known-bug rules)
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    sliding_window: int | None = None       # tokens of the local-attention layers' window
    attention: Literal["mha", "mla"] | None = None   # "mla": a latent KV cache (DeepSeek's MLA)
    # smallest attention block vLLM accepts per device for hybrids (it raises smaller ones to
    # this, aligned to the Mamba page): {"cpu": 96}
    min_block_size: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_hybrid(self) -> bool:
        return self.kind == "hybrid"


@dataclass
class ModelCatalog:
    """Model facts by name, optionally completed by a block-size provider (the zoo)."""

    models: dict[str, ModelInfo] = field(default_factory=dict)
    block_size_provider: BlockSizeProvider | None = None

    def get(self, model: str) -> ModelInfo:
        """The facts of `model` (a hub id also matches by its last path part); none known: a
        dense ModelInfo with every fact unknown."""
        if model in self.models:
            return self.models[model]
        short = model.rstrip("/").split("/")[-1]
        return self.models.get(short, ModelInfo(name=model))

    def min_block_size(self, model: str, device: str) -> int | None:
        """Smallest block size vLLM keeps for a hybrid model on `device` (None when unknown)."""
        if self.block_size_provider is not None:
            provided = self.block_size_provider(model, device)
            if provided:
                return int(provided)
        return self.get(model).min_block_size.get(device)
