"""Resolve a cell's `model` to something vLLM can load, and read the facts the run needs from its
config.json (harness.core.model_config: hybrid or dense, shape), without importing vLLM."""
from __future__ import annotations

import json
from pathlib import Path

from harness.core.catalog import ModelInfo, ResolvedModel
from harness.core.model_config import ModelConfigError, facts_from_config, hub_cache_config, read_config
from harness.core.real_models import expected_reference
from harness.core.reference import ReferenceAccuracy
from harness.zoo import shapes


class ModelNotFound(ValueError):
    """A model that is neither a zoo name, a loadable local path nor a hub id; str() is one line."""


def _zoo_path(name: str) -> str | None:
    from harness.zoo import random_llama, registry

    if name == random_llama.NAME:
        return str(random_llama.build())
    if name in registry.zoo_names() or name in registry.shape_names():
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
            cached = hub_cache_config(name)
            facts = _facts(name, cached) if cached else None
            return ResolvedModel(name, name, local=False, hybrid=bool(facts and facts.is_hybrid),
                                 architecture=facts.architecture if facts else None, facts=facts)
        else:
            raise ModelNotFound(f"model {name!r} is neither a zoo model, an existing path, nor a hub id")
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ModelNotFound(f"model {name!r}: {config_file} does not exist")
    facts = _facts(name, config_file)
    return ResolvedModel(name, path, local=True, hybrid=facts.is_hybrid,
                         architecture=facts.architecture, facts=facts,
                         random_weights=not shapes.has_weights(path),
                         kv_cache_bytes=shapes.kv_cache_bytes(name))


def _facts(name: str, config_file: Path) -> ModelInfo:
    try:
        return ModelInfo(**facts_from_config(name, read_config(config_file, name)))
    except ModelConfigError as exc:
        raise ModelNotFound(str(exc)) from None


def reference_accuracy(model: ResolvedModel, task: str):
    """The model's accuracy on `task` as its zoo card measured it (eval_vllm.json), else what
    vLLM's P/D CI expects of it (harness.core.real_models), or None; never for random weights."""
    from harness.zoo.card import VLLM_EVAL_JSON

    if model.random_weights:
        return None
    path = Path(model.path) / VLLM_EVAL_JSON if model.local else None
    if path is None or not path.exists():
        return expected_reference(model.name, task)
    data = json.loads(path.read_text())
    if data.get("task") != task or data.get("strict_match") is None or not data.get("n"):
        return None
    return ReferenceAccuracy(accuracy=float(data["strict_match"]), n=int(data["n"]),
                             source=f"its model card ({data.get('vllm') or 'vLLM'})")
