"""Measure a zoo model's accuracy through one real vLLM server, the way the harness's baselines run.

    pd-accuracy zoo eval tiny-granite-hybrid-gsm [--limit 200]

The server is planned, started, confined and stopped by the same code as a cell's baseline
(`deploy.plan_baseline`: own process group, pinned core, sized KV cache, stopped on every exit
path) and evaluated by the same lm-eval call (`evaluate.evaluate_endpoint`). The numbers go into
the checkpoint's eval_vllm.json and its model card; the cells' baseline-health check compares
every baseline against them.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from harness.zoo import task

EVAL_KV_CACHE_BYTES = 256 * 2**20
EVAL_MAX_MODEL_LEN = 2048


def eval_cell(name: str):
    """The baseline Cell a zoo model is measured with (CPU_ATTN, V1, its required block)."""
    from harness.core.cell import Cell
    from harness.zoo import registry

    hybrid = registry.is_hybrid(name)
    block = registry.required_block_size(name, "cpu") or 128
    # Granite hybrids crash on CPU with prefix caching on (a known upstream bug, see the matrix)
    extra = ("--no-enable-prefix-caching",) if hybrid else ()
    return Cell(model=name, prefill_block_size=block, decode_block_size=block,
                max_model_len=EVAL_MAX_MODEL_LEN, extra_args=extra)


def measure(name: str, *, limit: int = 200, startup_timeout_s: float = 600.0,
            concurrency: int = 4, progress=print) -> dict:
    """Start the server, run gsm_synth on `limit` test docs, record the result; return it."""
    from harness.serve.deploy import DeployContext, Placement, plan_baseline
    from harness.eval.lmeval import evaluate_endpoint
    from harness.serve.launch.models import resolve
    from harness.serve.host.ports import PortAllocator
    from harness.run.evidence.provenance import versions
    from harness.eval.task_choice import default_data_dir
    from harness.serve.launch.server_spec import Features
    from harness.zoo import card

    model = resolve(name)
    cell = eval_cell(name)
    log_dir = Path(tempfile.mkdtemp(prefix="pd-zoo-eval-"))
    ctx = DeployContext(allocator=PortAllocator(), placement=Placement.detect(),
                        log_dir=log_dir, features=Features.detect(),
                        startup_timeout_s=startup_timeout_s, kv_cache_bytes=EVAL_KV_CACHE_BYTES)
    deployment = plan_baseline(cell, ctx, model_path=model.path, hybrid=model.hybrid)
    command = deployment.commands()[0].replace(model.path, "CKPT")
    progress(f"starting {name} ({command}); logs in {log_dir}")
    with deployment:
        endpoint = deployment.baseline_endpoint()
        progress(f"evaluating {task.TASK_NAME} on {limit} test docs")
        run = evaluate_endpoint(role="baseline", base_url=endpoint.base_url,
                                served_model_name=endpoint.served_model_name,
                                task=task.TASK_NAME, data_dir=default_data_dir(task.TASK_NAME),
                                limit=limit, concurrency=concurrency, work_dir=log_dir)
    vllm = versions().get("vllm")
    return card.record_vllm_accuracy(
        model.path, n=run.n, strict_match=run.accuracy, flexible_extract=run.accuracy_flexible,
        vllm_version=f"vllm {vllm}" if vllm else "",
        command=(f"{command}; lm-eval local-completions {task.TASK_NAME} "
                 f"(harness.evaluate.evaluate_endpoint, concurrency {concurrency}, limit {limit})"))
