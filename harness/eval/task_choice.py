"""Which lm-eval task a model is asked, and where that task's documents live."""
from __future__ import annotations

from harness.eval.lmeval import default_gsm8k_dir
from harness.serve.models import ResolvedModel
from harness.zoo import registry


def default_task(model: ResolvedModel) -> str:
    """The zoo's trained models answer the synthetic task; anything else gets GSM8K."""
    task = registry.task_for(model.name)
    if task:
        return task
    if model.name in registry.zoo_names():
        return "gsm_synth"
    return "gsm8k_local"


def default_data_dir(task: str) -> str | None:
    """Where `task`'s documents live: the local GSM8K copy, else the zoo task's data (KeyError
    for a task that is neither)."""
    if task == "gsm8k_local":
        d = default_gsm8k_dir()
        return str(d) if d else None
    return str(registry.task_data_dir(task))
