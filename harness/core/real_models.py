"""The models vLLM's own P/D CI runs, with the GSM8K accuracy that CI expects of each: an
environment guard (a baseline far below it is the environment's fault, not P/D's) and how each
is asked (task, few-shot, chat template).

Source of every number: vLLM's P/D CI accuracy test (tests/v1/kv_connector/*/test_accuracy.py),
EXPECTED_VALUES and RTOL (lm-eval `gsm8k`, filter exact_match,strict-match, local-completions
without a chat template for these five, lm-eval's default 5 shots).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.core.reference import ReferenceAccuracy

VLLM_CI_SOURCE = "vLLM's P/D CI (tests/v1/kv_connector/*/test_accuracy.py)"
GSM8K_TEST_SIZE = 1319   # vLLM's CI asks the whole test split
# the harness's tasks that ask the same GSM8K test split with the same prompt and filter
GSM8K_FAMILY = ("gsm8k", "gsm8k_local")


@dataclass(frozen=True)
class RealModel:
    name: str                 # hub id
    expected: float           # GSM8K strict-match accuracy vLLM's CI expects
    tolerance: float          # vLLM's CI RTOL: |measured - expected| < tolerance
    task: str = "gsm8k"       # lm-eval task vLLM's CI asks
    num_fewshot: int = 5      # lm-eval's gsm8k default, which vLLM's CI keeps
    chat_template: bool = False   # lm-eval apply_chat_template (vLLM's CI: only gemma-4)
    family: str = ""          # what the matrix rules know it as

    def reference(self) -> ReferenceAccuracy:
        return ReferenceAccuracy(accuracy=self.expected, n=GSM8K_TEST_SIZE,
                                 source=VLLM_CI_SOURCE, tolerance=self.tolerance)


# RTOL 0.05 in vLLM's test (widened from 0.03 for granite-4.0-h-tiny's SSM jitter)
REAL_MODELS: dict[str, RealModel] = {m.name: m for m in (
    RealModel("Qwen/Qwen3-0.6B", 0.41, 0.05, family="dense"),
    RealModel("ibm-granite/granite-4.0-h-tiny", 0.77, 0.05, family="hybrid mamba2"),
    RealModel("google/gemma-3-4b-it", 0.74, 0.05, family="sliding window"),
    RealModel("deepseek-ai/DeepSeek-V2-Lite-Chat", 0.65, 0.05, family="MLA"),
    RealModel("Qwen/Qwen3.5-0.8B", 0.33, 0.05, family="hybrid gdn"),
)}


def real_model(name: str) -> RealModel | None:
    """The row for a hub id (or a local copy whose directory is named like it), or None."""
    if name in REAL_MODELS:
        return REAL_MODELS[name]
    tail = name.rstrip("/").rsplit("/", 1)[-1]
    matches = [m for m in REAL_MODELS.values() if m.name.rsplit("/", 1)[-1] == tail]
    return matches[0] if len(matches) == 1 else None


def expected_reference(name: str, task: str) -> ReferenceAccuracy | None:
    """vLLM CI's accuracy for `name` when the run asks the GSM8K test split, else None."""
    row = real_model(name)
    if row is None or task not in GSM8K_FAMILY:
        return None
    return row.reference()
