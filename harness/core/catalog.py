"""Model facts: what the validity rules and the matrix need to know about a model.

The facts come from the model's own config.json (harness.core.model_config) wherever the catalog
can find one: a zoo name's checkpoint, a local path, a hub id in the local cache. The matrix YAML
(`models:` and `hybrid_block_sizes:`) may override any of them and declares the facts of models
whose config is not here; a block-size provider (the zoo's `required_block_size`) may complete
them. This module holds the types and the merge, so that the rules can take a catalog without
depending on the YAML loader or the zoo.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping

from harness.core.model_config import StatePage, raised_block_size, smallest_kept_block

BlockSizeProvider = Callable[[str, str], "int | None"]   # (model, device) -> min block size
ConfigFacts = Callable[[str], "ModelInfo | None"]        # model -> facts from its config.json
# facts only a config.json gives (derived shapes): the matrix YAML does not declare them
CONFIG_ONLY_FACTS = frozenset({"architecture", "attention_layers", "mtp_layers", "kv_lora_rank",
                               "qk_rope_head_dim", "state_page", "source"})


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
    architecture: str | None = None         # config.json's architectures[0]
    attention_layers: int | None = None     # layers holding a KV cache (all of a dense model's)
    mtp_layers: int | None = None           # multi-token-prediction layers (DeepSeek, Qwen3.5)
    kv_lora_rank: int | None = None         # MLA: the latent is kv_lora_rank + qk_rope_head_dim wide
    qk_rope_head_dim: int | None = None
    state_page: StatePage | None = None     # hybrids: one state layer's page (TP1, elements)
    source: str = "matrix"                  # "config.json", "matrix" or "config.json+matrix"

    @property
    def is_hybrid(self) -> bool:
        return self.kind == "hybrid"

    def overridden_by(self, declared: "ModelInfo") -> "ModelInfo":
        """These facts with every fact `declared` (the YAML) states, i.e. differs from the default."""
        defaults = ModelInfo(name=declared.name)
        changes = {f.name: getattr(declared, f.name) for f in dataclasses.fields(self)
                   if f.name not in ("name", "source")
                   and getattr(declared, f.name) != getattr(defaults, f.name)}
        return dataclasses.replace(self, **changes, source="config.json+matrix") if changes else self

    def block_vllm_runs(self, block: int, device: str, dtype: str) -> int | None:
        """The attention block vLLM runs when asked for `block`: raised for a hybrid whose state
        page the asked block cannot hold; None when the facts do not say."""
        if not self.is_hybrid:
            return block
        if self.state_page is None or not self.num_kv_heads or not self.head_dim:
            return None
        return raised_block_size(block, device, dtype, self.num_kv_heads, self.head_dim,
                                 self.state_page)

    def smallest_kept_block(self, device: str, dtype: str) -> int | None:
        """The smallest block vLLM keeps for this hybrid (None: dense, or not computable)."""
        if not self.is_hybrid or self.state_page is None or not self.num_kv_heads or not self.head_dim:
            return None
        return smallest_kept_block(device, dtype, self.num_kv_heads, self.head_dim, self.state_page)


@dataclass(frozen=True)
class ResolvedModel:
    """A cell's `model` resolved on this machine (harness.serve.launch.models.resolve)."""

    name: str            # what the cell said
    path: str            # what vLLM gets as --model
    local: bool          # a directory on this machine (else a hub id)
    hybrid: bool
    architecture: str | None
    facts: ModelInfo | None = None   # from its config.json (None: a hub id not cached here)
    # a local directory with a config.json and no weight file (harness.zoo.shapes): vLLM fills
    # the weights itself (--load-format dummy) and the answers say nothing
    random_weights: bool = False
    kv_cache_bytes: int | None = None   # the KV budget a server needs (harness.zoo.shapes)

    @property
    def load_format(self) -> str | None:
        return "dummy" if self.random_weights else None


@dataclass
class ModelCatalog:
    """Model facts by name: config.json's (via `config_facts`) under the declared ones, optionally
    completed by a block-size provider (the zoo)."""

    models: dict[str, ModelInfo] = field(default_factory=dict)
    block_size_provider: BlockSizeProvider | None = None
    config_facts: ConfigFacts | None = None
    _cache: dict[str, ModelInfo] = field(default_factory=dict, repr=False, compare=False)

    def declared(self, model: str) -> ModelInfo | None:
        """What the matrix declares about `model` (a hub id also matches by its last path part)."""
        if model in self.models:
            return self.models[model]
        return self.models.get(model.rstrip("/").split("/")[-1])

    def get(self, model: str) -> ModelInfo:
        """The facts of `model`: its config.json's, overridden by the declared ones; none known: a
        dense ModelInfo with every fact unknown. A config.json that is no model config raises
        harness.core.model_config.ModelConfigError (one line)."""
        if model not in self._cache:
            declared = self.declared(model)
            found = self.config_facts(model) if self.config_facts is not None else None
            if found is None:
                facts = declared or ModelInfo(name=model)
            else:
                facts = found.overridden_by(declared) if declared is not None else found
            self._cache[model] = facts
        return self._cache[model]

    def min_block_size(self, model: str, device: str) -> int | None:
        """The block `block_size: required` means for a hybrid on `device`: the provider's (the
        zoo's), else the declared one, else the smallest vLLM keeps (None when unknown)."""
        if self.block_size_provider is not None:
            provided = self.block_size_provider(model, device)
            if provided:
                return int(provided)
        facts = self.get(model)
        return facts.min_block_size.get(device) or facts.smallest_kept_block(device, "bfloat16")
