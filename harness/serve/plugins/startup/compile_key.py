"""vLLM general plugin: a P/D server's torch.compile cache key leaves out its NIXL port.

vLLM keys its torch.compile caches (the AOT-compiled model, the Inductor artifacts) with a hash
of the vLLM environment variables that may change the compiled graph: ``vllm.envs.
compile_factors()``, every known variable minus an ignore list. vLLM 0.26 and 0.32 ignore
``VLLM_PORT`` and ``VLLM_NIXL_SIDE_CHANNEL_HOST`` but not ``VLLM_NIXL_SIDE_CHANNEL_PORT``, and the
harness gives every prefill and decode server its own side-channel port. So no P/D server ever
finds a cache: on the H200 (gpu-h200-20261201-s9, third run on a warm machine, 27 servers) every
baseline logged "Directly load AOT compilation" and spent 5 s in the compile phase, while every
prefill and decode compiled afresh into its own cache directory (20 s), then spent 14 s more
before its JIT monitor came up: 67 s median start-up for baselines, 97-100 s for P/D servers.

The port is where the NIXL handshake listens; it cannot change a compiled graph. With
``PD_ACCURACY_SHARED_COMPILE_CACHE=1`` (the harness sets it on every server it starts) this
plugin drops it from the factors, so a pair shares the cache of its baseline and of every
earlier server with the same configuration. Everything else in the key stays vLLM's.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Mapping

logger = logging.getLogger("vllm.pd_accuracy.compile_key")

ENV = "PD_ACCURACY_SHARED_COMPILE_CACHE"
# vLLM variables the harness sets per server that never reach a compiled graph
PER_SERVER_FACTORS = ("VLLM_NIXL_SIDE_CHANNEL_PORT",)
_MARK = "_pd_accuracy_compile_key"
_registered = False


def without_per_server(factors: Mapping[str, Any]) -> dict[str, Any]:
    """``factors`` without the variables the harness sets differently on every server."""
    return {name: value for name, value in factors.items() if name not in PER_SERVER_FACTORS}


def patch_envs(envs_module: Any) -> bool:
    """Wrap ``envs_module.compile_factors`` (vllm.envs); idempotent. False when it has none."""
    original: Callable[[], Mapping[str, Any]] | None = getattr(envs_module, "compile_factors", None)
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def compile_factors() -> dict[str, Any]:
        return without_per_server(original())

    setattr(compile_factors, _MARK, True)
    envs_module.compile_factors = compile_factors
    return True


def register() -> None:
    """vLLM ``general_plugins`` entry point: cheap, idempotent, never raises."""
    global _registered
    if _registered or os.environ.get(ENV) != "1":
        return
    _registered = True
    try:
        import vllm.envs

        if patch_envs(vllm.envs):
            logger.info("pd-accuracy compile-key: %s left out of the torch.compile cache key",
                        ", ".join(PER_SERVER_FACTORS))
        else:
            logger.warning("pd-accuracy compile-key: vllm.envs has no compile_factors; "
                           "cache key unchanged")
    except Exception:  # noqa: BLE001 - never stop vLLM from starting
        logger.exception("pd-accuracy compile-key: patch failed; cache key unchanged")


__all__ = ["ENV", "PER_SERVER_FACTORS", "patch_envs", "register", "without_per_server"]
