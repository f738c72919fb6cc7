"""Which in-server module attaches each hook of the compatibility table (harness.core.vllm_hooks):
named, never imported here (they run inside vLLM), for ``pd-accuracy doctor`` to say where a hook
lives. Each module asks ``harness.serve.plugins.compat.attach(<hook>)`` before it patches; a hook
resting on another (``requires``) attaches with it."""
from __future__ import annotations

from typing import Mapping

HOOK_PLUGINS: Mapping[str, str] = {
    "kv-events": "harness.serve.plugins.kv_events.interface",
    "kv-digest": "harness.serve.plugins.kv_digest.hook",
    "kv-faults": "harness.serve.plugins.faults.decode",
    "nixl-read-poll": "harness.serve.plugins.kv_events.by_connector.nixl",
    "nixl-leases": "harness.serve.plugins.kv_events.by_connector.nixl",
    "late-read": "harness.serve.plugins.faults.late_read",
    "compile-key": "harness.serve.plugins.startup.compile_key",
    "fork-start": "harness.serve.plugins.startup.fork_start",
    "cpu-amx": "harness.serve.plugins.startup.cpu_amx",
    "mq-spin": "harness.serve.plugins.idle.mq_spin",
    "gloo-groups": "harness.serve.plugins.idle.gloo_groups",
    "nixl-idle": "harness.serve.connectors.nixl_idle",
    "mooncake-counters": "harness.serve.plugins.kv_events.by_connector.mooncake",
}
