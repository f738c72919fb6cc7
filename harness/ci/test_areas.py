"""The pipeline's command steps in vLLM's ``.buildkite/test_areas`` format (vLLM ci-infra).

vllm-project/ci-infra generates vLLM's pipeline from ``.buildkite/test_areas/*.yaml``; these
steps run the same ``pd-accuracy run`` commands as `harness.ci.pipeline.generate_pipeline`, with
the agent chosen by ``device``/``num_devices`` instead of a queue.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from harness.ci.pipeline import (DEFAULT_JUNIT_DIR, DEFAULT_QUEUES, DEFAULT_RESULTS_DIR,
                                 DEFAULT_TIMEOUT_MINUTES, layout_of, normalize_queues, plan_batches,
                                 run_command, step_timeout)
from harness.core.cell import Cell

# Fields of one step in vLLM's `.buildkite/test_areas/*.yaml`, as read by vllm-project/ci-infra
# `buildkite/pipeline_generator/step.py` (class Step). Only this subset is ever emitted.
TEST_AREA_FIELDS = frozenset({
    "label", "group", "working_dir", "key", "depends_on", "commands", "device", "num_devices",
    "num_nodes", "source_file_dependencies", "soft_fail", "parallelism",
    "mount_buildkite_agent", "env", "retry", "optional", "no_plugin", "mirror",
    "timeout_in_minutes",
})
DEFAULT_SOURCE_FILE_DEPENDENCIES = (
    "vllm/distributed/kv_transfer/",
    "vllm/v1/attention/",
    "vllm/v1/worker/",
    "vllm/v1/core/",
)


def export_test_areas(cells: Iterable[Cell], *, profile: str,
                      queues: Mapping[int, str] | None = None,
                      results_dir: str = DEFAULT_RESULTS_DIR,
                      timeout_minutes: int = DEFAULT_TIMEOUT_MINUTES,
                      parallelism: int = 1,
                      device: str | None = None,
                      source_file_dependencies: Sequence[str] = DEFAULT_SOURCE_FILE_DEPENDENCIES,
                      setup_commands: Sequence[str] = (),
                      junit_dir: str = DEFAULT_JUNIT_DIR,
                      matrix_path: str | None = None,
                      run_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The same command steps as `generate_pipeline`, as vLLM ``.buildkite/test_areas`` steps.

    ci-infra picks the agent from ``device`` and ``num_devices``: CPU steps get
    ``device: cpu``; GPU steps get ``num_devices`` and, when given, `device` (e.g. ``h200``).
    `setup_commands` run first in every step (e.g. installing pd-accuracy in the CI image).
    """
    queues = normalize_queues(queues or DEFAULT_QUEUES)
    steps = []
    for batch in plan_batches(cells, queues, parallelism, layout_of(run_args)):
        step: dict[str, Any] = {
            "label": f"PD accuracy: {batch.label}",
            "key": batch.key,
            "timeout_in_minutes": step_timeout(batch, timeout_minutes),
        }
        if batch.gpus == 0:
            step["device"] = "cpu"
        else:
            step["num_devices"] = batch.gpus
            if device:
                step["device"] = device
        if batch.parallelism > 1:
            step["parallelism"] = batch.parallelism
        if batch.expected_failure:
            step["soft_fail"] = True   # ci-infra's test_areas soft_fail is a plain boolean
        step["source_file_dependencies"] = list(source_file_dependencies)
        step["commands"] = list(setup_commands) + [
            run_command(batch, profile=profile, results_dir=results_dir, junit_dir=junit_dir,
                        matrix_path=matrix_path, extra_args=run_args)]
        steps.append(step)
    return steps


def vllm_test_areas_document(steps: Sequence[Mapping[str, Any]], *, group: str = "PD Accuracy",
                             depends_on: Sequence[str] = ("image-build",)) -> dict[str, Any]:
    """A whole ``.buildkite/test_areas/<name>.yaml`` document holding `steps`."""
    doc: dict[str, Any] = {"group": group}
    if depends_on:
        doc["depends_on"] = list(depends_on)
    doc["steps"] = [dict(s) for s in steps]
    return doc


__all__ = ["DEFAULT_SOURCE_FILE_DEPENDENCIES", "TEST_AREA_FIELDS", "export_test_areas",
           "vllm_test_areas_document"]
