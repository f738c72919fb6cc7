"""Which lm-eval task a model is asked, and where that task's documents live."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from harness.core.catalog import ResolvedModel
from harness.core.real_models import real_model
from harness.eval.lmeval import default_gsm8k_dir
from harness.zoo import boundary, registry, shared_prefix

# a task -> its shared-prefix variant (the matrix's prefix_reuse cells: every prompt opens with
# the same long prefix, so the P/D decode holds it in its own prefix cache)
SHARED_PREFIX_TASKS = {"gsm_synth": shared_prefix.SHARED_TASK_NAME, "gsm8k_local": "gsm8k_local_shared"}
GSM8K_TASKS = ("gsm8k_local", "gsm8k_local_shared")
HUB_TASKS = ("gsm8k",)   # lm-eval's own task definitions (its dataset from the hub)
HUB_URL = "https://huggingface.co"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskChoice:
    task: str
    why: str        # one line, logged: which copy of the questions and why


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """False under HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, else whether the hub answers."""
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes")
           for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(HUB_URL, method="HEAD"),
                                    timeout=timeout_s):
            return True
    except OSError:
        return False


def choose_task(model: ResolvedModel, prefix_reuse: bool = False, hub=hub_reachable) -> TaskChoice:
    """default_task with its reason. A model vLLM's P/D CI runs (harness.core.real_models) asks
    lm-eval's own `gsm8k` as that CI does when the hub answers, else the local copy of the same
    test split (gsm8k_local: same prompt, shots and filter); every other model as before."""
    row = real_model(model.name) if not model.random_weights else None
    if row is None or prefix_reuse:
        return TaskChoice(default_task(model, prefix_reuse), "")
    if hub():
        return TaskChoice(row.task, f"{model.name}: lm-eval's own {row.task} from the hub, "
                                    f"as vLLM's P/D CI asks it")
    where = default_gsm8k_dir()
    return TaskChoice("gsm8k_local", f"{model.name}: the hub is not reachable, GSM8K from the "
                                     f"local copy ({where or '$PD_ACCURACY_GSM8K_DIR unset'})")


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
    """Where `task`'s documents live: the local GSM8K copy, None for lm-eval's own (hub) tasks,
    else the zoo task's data (KeyError for a task that is none of these)."""
    if task in HUB_TASKS:
        return None
    if task in GSM8K_TASKS:
        d = default_gsm8k_dir()
        return str(d) if d else None
    if task == shared_prefix.SHARED_TASK_NAME:
        return str(shared_prefix.write_shared_splits())
    if task == boundary.BOUNDARY_TASK_NAME:
        return str(boundary.write_boundary_splits())
    return str(registry.task_data_dir(task))
