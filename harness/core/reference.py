"""ReferenceAccuracy: what a model scored on a task when measured elsewhere (a zoo model card's
eval_vllm.json, or vLLM CI's expected value: harness.core.real_models). The judge checks a run's
baseline against it (baseline-health)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReferenceAccuracy:
    accuracy: float
    n: int
    source: str
    # how far below it a baseline may be (vLLM CI's RTOL); None: the judge's baseline_tolerance
    tolerance: float | None = None
