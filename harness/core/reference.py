"""ReferenceAccuracy: what a model scored on a task when measured elsewhere (a zoo model card's
eval_vllm.json). The judge checks a run's baseline against it (baseline-health)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReferenceAccuracy:
    accuracy: float
    n: int
    source: str
