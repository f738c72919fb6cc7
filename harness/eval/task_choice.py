"""Which lm-eval task a model is asked, and where that task's documents live."""
from __future__ import annotations

from harness.eval.lmeval import default_gsm8k_dir
from harness.serve.launch.models import ResolvedModel
from harness.zoo import boundary, registry, shared_prefix

# a task -> its shared-prefix variant (the matrix's prefix_reuse cells: every prompt opens with
# the same long prefix, so the P/D decode holds it in its own prefix cache)
SHARED_PREFIX_TASKS = {"gsm_synth": shared_prefix.SHARED_TASK_NAME, "gsm8k_local": "gsm8k_local_shared"}
GSM8K_TASKS = ("gsm8k_local", "gsm8k_local_shared")


def default_task(model: ResolvedModel, prefix_reuse: bool = False) -> str:
    """The zoo's trained models answer the synthetic task, and so do the real-shape random-weight
    models (the zoo tokenizer: GSM8K's few-shot prompts would exceed max_model_len in its
    tokens); anything else gets GSM8K; with `prefix_reuse`, the task's shared-prefix variant."""
    task = registry.task_for(model.name)
    if not task:
        zoo = model.name in registry.zoo_names() or model.name in registry.shape_names()
        task = "gsm_synth" if zoo else "gsm8k_local"
    return SHARED_PREFIX_TASKS.get(task, task) if prefix_reuse else task


def default_data_dir(task: str) -> str | None:
    """Where `task`'s documents live: the local GSM8K copy, else the zoo task's data (KeyError
    for a task that is neither)."""
    if task in GSM8K_TASKS:
        d = default_gsm8k_dir()
        return str(d) if d else None
    if task == shared_prefix.SHARED_TASK_NAME:
        return str(shared_prefix.write_shared_splits())
    if task == boundary.BOUNDARY_TASK_NAME:
        return str(boundary.write_boundary_splits())
    return str(registry.task_data_dir(task))
