"""vLLM general plugin: every server process asks Linux for AMX tile state on a host that has it.

An upstream crash (vLLM CPU 0.32.0). It was measured on 2026-12-03 on a 2-core Intel
Xeon VM that has amx_bf16/amx_tile, under Linux 6.18:
- Every P/D decode server died at its first step. The worker exited with SIGILL ("Worker proc
  VllmWorker-0 died unexpectedly (exit code: -4)"). Python's faulthandler put the illegal
  instruction in `cpu_attention_with_kv_cache`.
- Baselines and prefills on the same host answered every request.
- It happened with the engine spawned (vLLM's default) and forked (the fork-start plugin) alike.

vLLM's CPU_ATTN backend picks its "amx" kernels whenever `torch.cpu._is_amx_tile_supported()`.
Linux (5.16 and later) gives a process AMX tile state only after the process asks for it
(`arch_prctl(ARCH_REQ_XCOMP_PERM)`); `torch.cpu._init_amx()` asks. Nothing in vLLM's CPU
worker asks. A server whose first step is a prefill has asked by then (presumably oneDNN, for
its first large GEMM). A P/D decode's first step is a decode step on received KV. The harness
sizes the KV cache (`--kv-cache-memory-bytes`), so no profiling forward runs before it.

With this plugin the same decode answered; the p32 smoke cell PASSed, 100 % vs 100 %. So every
server process asks once, at plugin load, before its first step; a host without AMX is left
alone. `PD_ACCURACY_AMX_PERMISSION=0` leaves it to vLLM, to see the upstream crash.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from harness.protocol.switches import AMX_PERMISSION_ENV as ENV
from harness.serve.plugins.entry import vllm_plugin

logger = logging.getLogger("vllm.pd_accuracy.cpu_amx")



def wanted(env: Mapping[str, str]) -> bool:
    """On unless PD_ACCURACY_AMX_PERMISSION is 0 (or false/off/no)."""
    return env.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def ask_for_amx(cpu: Any) -> bool:
    """Ask for AMX tile state through `cpu` (the `torch.cpu` module); False where the CPU has
    no AMX tiles or the kernel refused."""
    supported: Callable[[], bool] | None = getattr(cpu, "_is_amx_tile_supported", None)
    init: Callable[[], bool] | None = getattr(cpu, "_init_amx", None)
    if supported is None or init is None or not supported():
        return False
    return bool(init())


@vllm_plugin(logger, "pd-accuracy: could not ask for AMX tile state; vLLM left as is",
             wanted=lambda: wanted(os.environ))
def register() -> None:
    """vLLM ``general_plugins`` entry point (harness.serve.plugins.entry)."""
    import torch

    from harness.serve.plugins import compat

    if not compat.attach("cpu-amx"):
        return
    if ask_for_amx(torch.cpu):   # a warning: vLLM's INFO handler is not set up yet
        logger.warning("pd-accuracy cpu_amx: AMX tile state granted to process %d", os.getpid())
