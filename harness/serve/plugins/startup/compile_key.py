"""vLLM general plugin: a P/D server's torch.compile cache key leaves out its per-server ports.

vLLM keys its torch.compile caches (the AOT-compiled model, the Inductor artifacts) with a hash
of the vLLM environment variables that may change the compiled graph: ``vllm.envs.
compile_factors()``, every known variable minus an ignore list. A KV connector may take a port
per server from such a variable (its handshake's side channel) that vLLM does not ignore, and
the harness gives every prefill and decode server its own: then no P/D server ever finds a
cache, and each compiles afresh (docs/startup.md has the measured cost).

A handshake port cannot change a compiled graph. With ``PD_ACCURACY_SHARED_COMPILE_CACHE=1``
(the harness sets it on every server it starts) this plugin drops the variables the connector
modules name (``PER_SERVER_ENV`` in a connector package's ``in_server``), so a
pair shares the cache of its baseline and of every earlier server with the same configuration.
Everything else in the key stays vLLM's.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Mapping

from harness.protocol.switches import COMPILE_KEY_ENV as ENV
from harness.serve.plugins.kv_events.interface import per_server_env
from harness.serve.plugins.entry import vllm_plugin

logger = logging.getLogger("vllm.pd_accuracy.compile_key")

# vLLM variables the harness sets per server that never reach a compiled graph
PER_SERVER_FACTORS = per_server_env()
_MARK = "_pd_accuracy_compile_key"


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


@vllm_plugin(logger, "pd-accuracy compile-key: patch failed; cache key unchanged",
             wanted=lambda: os.environ.get(ENV) == "1")
def register() -> None:
    """vLLM ``general_plugins`` entry point (harness.serve.plugins.entry)."""
    import vllm.envs

    from harness.serve.plugins import compat

    if not compat.attach("compile-key"):
        return
    if patch_envs(vllm.envs):
        logger.info("pd-accuracy compile-key: %s left out of the torch.compile cache key",
                    ", ".join(PER_SERVER_FACTORS))
    else:
        logger.warning("pd-accuracy compile-key: vllm.envs has no compile_factors; "
                       "cache key unchanged")


__all__ = ["ENV", "PER_SERVER_FACTORS", "patch_envs", "register", "without_per_server"]
