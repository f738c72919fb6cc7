"""Validity rules about this machine: its GPU count, network namespaces and the installed vLLM. They stay silent
when the cell is checked for any machine (no platform); their kind is "unavailable".

Registered in the order they are checked (harness.matrix.rules runs these last).
"""
from __future__ import annotations

from harness.core.cell import DEVICES, Cell
from harness.core.kv_connectors import KV_CONNECTORS
from harness.matrix.rule_types import RuleContext, RuleList

RULES = RuleList()
rule = RULES.rule


@rule("gpu-count", "unavailable")
def _gpu_count(cell: Cell, ctx: RuleContext) -> str | None:
    """A cuda cell needs at least as many GPUs as its widest server (servers may share GPUs)."""
    if cell.device != "cuda" or ctx.platform is None:
        return None
    need = cell.gpus_needed["min_shared"]
    if need > ctx.platform.gpu_count:
        return f"needs {need} GPU(s), this machine has {ctx.platform.gpu_count}"
    return None


@rule("netns-host", "unavailable")
def _netns_host(cell: Cell, ctx: RuleContext) -> str | None:
    """A network: netns cell needs a machine that can make network namespaces (root, `ip`)."""
    if cell.network == "netns" and ctx.platform is not None and ctx.platform.netns_unavailable:
        return ctx.platform.netns_unavailable
    return None


@rule("vllm-device", "unavailable")
def _vllm_device(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM is built for the cell's device."""
    features = ctx.platform and ctx.platform.vllm
    if features is not None and cell.device in DEVICES and features.platform != cell.device:
        return f"the installed vLLM {features.version} is a {features.platform} build; this cell needs {cell.device}"
    return None


@rule("vllm-v2-runner", "unavailable")
def _vllm_v2(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM knows VLLM_USE_V2_MODEL_RUNNER when a v2 cell asks for it."""
    features = ctx.platform and ctx.platform.vllm
    if features is not None and cell.runner == "v2" and not features.v2_runner_env:
        return f"the installed vLLM {features.version} has no VLLM_USE_V2_MODEL_RUNNER"
    return None


@rule("vllm-backend", "unavailable")
def _vllm_backend(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM knows the cell's attention backend and a way to select it."""
    features = ctx.platform and ctx.platform.vllm
    if features is None:
        return None
    if not (features.attention_backend_flag or features.attention_backend_env):
        return f"the installed vLLM {features.version} offers no way to select an attention backend"
    if features.attention_backends and cell.backend not in features.attention_backends:
        return f"the installed vLLM {features.version} has no attention backend {cell.backend}"
    return None


@rule("vllm-kv-connector", "unavailable")
def _vllm_kv_connector(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM registers the cell's KV connector, and its transport imports."""
    features = ctx.platform and ctx.platform.vllm
    row = KV_CONNECTORS.get(cell.kv_connector)
    if features is None or row is None:
        return None
    if features.kv_connectors is not None and row.vllm_name not in features.kv_connectors:
        return f"the installed vLLM {features.version} registers no {row.vllm_name} (kv_connector {cell.kv_connector})"
    if features.kv_transports is not None and row.transport not in features.kv_transports:
        return (f"{row.vllm_name}'s transport {row.transport} does not import next to vLLM "
                f"{features.version} — P/D transfer cannot run")
    return None
