"""vLLM general plugin: a CPU server forks its engine core and worker instead of spawning them.

A vLLM CPU server is three Python processes: the API server, the engine core and one worker per
rank. vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unconditionally
(``CpuPlatform.check_and_update_config``), so the engine core and each worker start a fresh
interpreter and import torch and vLLM again. Measured on the 2-core machine (vLLM CPU 0.32.0,
tiny-llama-gsm, eager, one server alone): ready after 29.4 s and 30.8 s spawned, 16.7 s forked;
the engine core printed "Initializing a V1 LLM engine" 8 s after the API server's banner when
spawned and in the same second when forked, and the worker loaded its model 2 s later instead of
9 s. Three servers starting together on 2 cores pay those imports three times over.

vLLM's CUDA platform forks by default. On CPU forking alone is not the same run: the forked
worker's OpenMP threads were not bound to the server's cores (all 47 allowed on cores 0-1 with
``VLLM_CPU_OMP_THREADS_BIND=1``; spawned, all on core 1). Pinned to its core from launch, every
thread of all three processes sat on that core (results/benchmarks/cpu-smoke-fork-pinned-20261202).
So the harness arms this plugin (``build_env`` sets the variable) exactly where it pins: a CPU
server of TP1 with its core placed (``server_spec.forks_engine``; ``ManagedProcess`` applies the
affinity before exec). The plugin then restores ``fork`` right after vLLM's CPU platform has
chosen ``spawn``. Nothing else in the platform's config changes.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any
from harness.protocol.switches import FORK_START_ENV as ENV
from harness.serve.plugins.entry import vllm_plugin

logger = logging.getLogger("vllm.pd_accuracy.fork_start")

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
_MARK = "_pd_accuracy_fork_start"


def patch_platform(platform_cls: Any) -> bool:
    """Wrap ``platform_cls.check_and_update_config`` (a classmethod) so that vLLM's processes
    fork afterwards; idempotent. False when the class has no such method."""
    original = getattr(platform_cls, "check_and_update_config", None)
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True
    func = getattr(original, "__func__", original)

    @functools.wraps(func)
    def check_and_update_config(cls: Any, vllm_config: Any) -> Any:
        result = func(cls, vllm_config)
        if os.environ.get(METHOD_ENV) != "fork":
            os.environ[METHOD_ENV] = "fork"
        return result

    setattr(check_and_update_config, _MARK, True)
    platform_cls.check_and_update_config = classmethod(check_and_update_config)
    return True


@vllm_plugin(logger, "pd-accuracy fork-start: patch failed; vLLM spawns as usual",
             wanted=lambda: os.environ.get(ENV) == "1")
def register() -> None:
    """vLLM ``general_plugins`` entry point (harness.serve.plugins.entry)."""
    from vllm.platforms.cpu import CpuPlatform

    from harness.serve.plugins import compat

    if not compat.attach("fork-start"):
        return
    if patch_platform(CpuPlatform):
        logger.info("pd-accuracy fork-start: engine core and workers fork (CPU platform)")


__all__ = ["ENV", "METHOD_ENV", "patch_platform", "register"]
