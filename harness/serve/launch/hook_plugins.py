"""Which in-server module attaches each hook of the compatibility table (harness.core.vllm_hooks):
named, never imported here (they run inside vLLM), for ``pd-accuracy doctor`` to say where a hook
lives. Each module asks ``harness.serve.plugins.compat.attach(<hook>)`` before it patches; a hook
resting on another (``requires``) attaches with it. A connector or weather package names the
modules of its own hooks (its ``HOOK_PLUGINS``, relative to the package)."""
from __future__ import annotations

from typing import Mapping

from harness import connectors, weathers

# the harness's own plugins' hooks
PLUGIN_MODULES: Mapping[str, str] = {
    "kv-events": "harness.serve.plugins.kv_events.interface",
    "kv-digest": "harness.serve.plugins.kv_digest.hook",
    "kv-faults": "harness.serve.plugins.faults.decode",
    "wrong-drafts": "harness.serve.plugins.faults.wrong_drafts",
    "compile-key": "harness.serve.plugins.startup.compile_key",
    "fork-start": "harness.serve.plugins.startup.fork_start",
    "cpu-amx": "harness.serve.plugins.startup.cpu_amx",
    "mq-spin": "harness.serve.plugins.idle.mq_spin",
    "gloo-groups": "harness.serve.plugins.idle.gloo_groups",
}


def hook_plugins() -> dict[str, str]:
    """Every hook -> the dotted name of the module that attaches it."""
    found = dict(PLUGIN_MODULES)
    for package, hook in connectors.package_hooks() + weathers.package_hooks():
        found[hook.name] = f"{package.__name__}.{package.HOOK_PLUGINS[hook.name]}"
    return found


__all__ = ["PLUGIN_MODULES", "hook_plugins"]
