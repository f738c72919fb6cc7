"""The configuration a vLLM server really ran, read back from its own log (and, when given, its
`/metrics`): pure functions over text, no process and no vLLM import.

What the harness asked for (the `non-default args` line) is not what a server runs: vLLM raises a
hybrid's block to its Mamba page ("Setting attention block size to N tokens"), forces block 16 on
CPU MLA, picks another backend ("Cannot use X backend on CPU"), turns async scheduling off. Each
field below is what the server ran, with where it was read (`sources`); a field vLLM does not
state is None and listed in `not_exposed` with the reason, never guessed from the request.

vLLM 0.32 CPU states: the logical block (args, raised / forced lines, `vllm:cache_config_info`),
the attention backend (the connector's "Detected attention backend(s)" on P/D servers, the MLA and
"Cannot use" lines), KV cache dtype and layout, the model runner (the file that loads the model),
TP size, eager, prefix caching, chunked prefill and the speculative config (the engine's config
line), the batch-token budget (args). It states neither the kernel block size nor the final
async-scheduling flag (logged only when vLLM turns it off).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

_ARGS_RE = re.compile(r"non-default args: (\{.*\})")
_ENGINE_RE = re.compile(r"Initializing a V\d LLM engine \(v[^)]*\) with config: (.*)")
_RAISED_BLOCK_RE = re.compile(r"Setting attention block size to (\d+) tokens")
FORCED_BLOCK_RE = re.compile(r"requires block_size=(\d+), overriding user-specified block_size")
_LAYOUT_RES = (re.compile(r"Using (\w+) KV cache layout"), re.compile(r"Detected kv cache layout (\w+)"))
_BACKEND_RES = (re.compile(r"Detected attention backend\(s\) \[([^\]]*)\]"),
                re.compile(r"Using (\w+) attention backend out of"),
                re.compile(r"Using (\w+) backend\."))
_STATE_BACKEND_MARKERS = ("MAMBA", "GDN", "LINEAR", "SHORT_CONV", "KDA")
_REFUSED_BACKEND_RE = re.compile(r"Cannot use (?:AttentionBackendEnum\.)?(\w+) backend on CPU")
_RUNNER_RES = ((re.compile(r"\[(?:gpu|cpu)_model_runner\.py:\d+\] Starting to load model"), "v1"),
               (re.compile(r"\[model_runner\.py:\d+\] Loading model from scratch"), "v2"))
_ASYNC_OFF_RE = re.compile(r"Async scheduling (?:is disabled|will be disabled|not supported|is not compatible)")
_CACHE_INFO_RE = re.compile(r"^vllm:cache_config_info\{(.*)\}\s+1(?:\.0)?\s*$", re.M)
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

NOT_EXPOSED = {
    "kernel_block_size": "vLLM 0.32 logs no kernel block size (only XPU does) and /metrics has none",
    "async_scheduling": "vLLM logs async scheduling only when it turns it off",
}


@dataclass(frozen=True)
class EffectiveConfig:
    """What one server ran; None: not stated by this server (see `not_exposed`)."""

    role: str
    block_size: int | None = None           # logical (scheduler) block, tokens
    kernel_block_size: int | None = None
    attention_backend: str | None = None
    kv_cache_dtype: str | None = None
    kv_cache_layout: str | None = None
    runner: str | None = None               # "v1" | "v2" model runner
    tensor_parallel_size: int | None = None
    enforce_eager: bool | None = None
    async_scheduling: bool | None = None
    speculative_config: str | None = None   # "none" or the method ("ngram", "draft_model", ...)
    speculative_tokens: int | None = None   # its num_spec_tokens
    chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool | None = None
    requested_block_size: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    not_exposed: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _arg(args: str, key: str, pattern: str = r"(\d+)") -> str | None:
    m = re.search(rf"'{key}': {pattern}", args)
    return m.group(1) if m else None


def _engine(config: str, key: str, pattern: str = r"([^,\s]+)") -> str | None:
    m = re.search(rf"\b{key}={pattern}", config)
    return m.group(1) if m else None


def _bool(value: str | None) -> bool | None:
    return None if value is None else value == "True"


def cache_config_info(metrics_text: str) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` in a /metrics exposition ({} when absent)."""
    m = _CACHE_INFO_RE.search(metrics_text or "")
    return {k: v for k, v in _LABEL_RE.findall(m.group(1))} if m else {}


def _attention_backend(listed: str) -> str:
    """The attention backend among those a server lists: a hybrid's connector line also names its
    state layers' backend ("['MAMBA2_ATTN', 'CPU_ATTN']", vLLM CPU 0.32)."""
    names = [n.strip(" '\"") for n in listed.split(",") if n.strip(" '\"")]
    attention = [n for n in names if not any(m in n for m in _STATE_BACKEND_MARKERS)]
    return (attention or names or [listed])[0]


def _speculative(config: str) -> str | None:
    if re.search(r"\bspeculative_config=None\b", config):
        return "none"
    m = re.search(r"\bspeculative_config=.{0,400}?method='?(\w+)", config)
    return m.group(1) if m else None


def parse_server_log(role: str, log_text: str, metrics_text: str = "") -> EffectiveConfig:
    """`role`'s server as its log (and optional /metrics text) say it ran."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(name: str, value: Any, source: str) -> None:
        if value is not None:
            values[name] = value
            sources[name] = source

    args_m = _ARGS_RE.search(log_text)
    args = args_m.group(1) if args_m else ""
    requested = _arg(args, "block_size")
    put("block_size", int(requested) if requested else None, "asked (non-default args)")
    put("max_num_batched_tokens", int(n) if (n := _arg(args, "max_num_batched_tokens")) else None,
        "asked (non-default args)")
    put("attention_backend", _arg(args, "attention_backend", r"'(\w+)'"), "asked (non-default args)")
    put("async_scheduling", _bool(_arg(args, "async_scheduling", r"(True|False)")),
        "asked (non-default args)")
    engine_m = _ENGINE_RE.search(log_text)
    if engine_m:
        config = engine_m.group(1)
        put("tensor_parallel_size", int(v) if (v := _engine(config, "tensor_parallel_size", r"(\d+)")) else None,
            "engine config line")
        put("enforce_eager", _bool(_engine(config, "enforce_eager", r"(True|False)")), "engine config line")
        put("prefix_caching", _bool(_engine(config, "enable_prefix_caching", r"(True|False)")),
            "engine config line")
        put("chunked_prefill", _bool(_engine(config, "enable_chunked_prefill", r"(True|False)")),
            "engine config line")
        put("speculative_config", _speculative(config), "engine config line")
        put("speculative_tokens", int(v) if (v := _engine(config, "num_spec_tokens", r"(\d+)")) else None,
            "engine config line")
        cache_dtype = _engine(config, "kv_cache_dtype", r"(\w+)")
        model_dtype = _engine(config, "dtype", r"torch\.(\w+)")
        if cache_dtype == "auto" and model_dtype:
            put("kv_cache_dtype", model_dtype, "engine config line (kv_cache_dtype=auto: the model dtype)")
        else:
            put("kv_cache_dtype", cache_dtype, "engine config line")
    if requested and engine_m:   # vLLM logs each change below before its engine starts
        put("block_size", int(requested), "log: the block asked for, no change logged")
    for pattern, source in ((_RAISED_BLOCK_RE, "log: vLLM raised it to the Mamba page"),
                            (FORCED_BLOCK_RE, "log: the backend forced it")):
        m = pattern.search(log_text)
        if m:
            put("block_size", int(m.group(1)), source)
    for pattern in _LAYOUT_RES:
        if (m := pattern.search(log_text)):
            put("kv_cache_layout", m.group(1), "log")
            break
    refused = _REFUSED_BACKEND_RE.search(log_text)
    for pattern in _BACKEND_RES:
        if (m := pattern.search(log_text)):
            put("attention_backend", _attention_backend(m.group(1)), "log")
            break
    else:
        if refused:   # vLLM CPU falls back to its one non-MLA backend, without a line of its own
            put("attention_backend", "CPU_ATTN", f"log: 'Cannot use {refused.group(1)} backend on CPU'")
    for pattern, runner in _RUNNER_RES:
        if pattern.search(log_text):
            put("runner", runner, "log: the model runner that loaded the model")
            break
    if _ASYNC_OFF_RE.search(log_text):
        put("async_scheduling", False, "log: vLLM turned it off")
    info = cache_config_info(metrics_text)
    if info.get("block_size", "").isdigit():
        put("block_size", int(info["block_size"]), "/metrics vllm:cache_config_info")
    if info.get("cache_dtype") and info["cache_dtype"] != "auto":
        put("kv_cache_dtype", info["cache_dtype"], "/metrics vllm:cache_config_info")
    if info.get("kv_cache_layout") not in (None, "", "None"):
        put("kv_cache_layout", info["kv_cache_layout"], "/metrics vllm:cache_config_info")
    not_exposed = {k: why for k, why in NOT_EXPOSED.items() if k not in values}
    if "attention_backend" in sources and sources["attention_backend"].startswith("asked"):
        not_exposed["attention_backend"] = ("this server logged no backend line (only P/D servers "
                                            "log the connector's); the value is the one asked for")
    return EffectiveConfig(role=role, requested_block_size=int(requested) if requested else None,
                           sources=sources, not_exposed=not_exposed, **values)


def summary(effective: dict[str, Any] | None) -> str:
    """One line for tables: what each server ran ("decode: block 128, CPU_ATTN, bfloat16, LBHNC,
    v1"), a value only asked for marked "?"; "-" without a read-back."""
    if not effective:
        return "-"
    parts = []
    for role, c in effective.items():
        sources = c.get("sources") or {}

        def shown(name: str, fmt: str = "{}") -> str | None:
            value = c.get(name)
            if value is None:
                return None
            asked = str(sources.get(name, "")).startswith("asked")
            return fmt.format(value) + ("?" if asked else "")

        bits = [shown("block_size", "block {}"), shown("attention_backend"), shown("kv_cache_dtype"),
                shown("kv_cache_layout"), shown("runner"),
                None if c.get("speculative_config") in (None, "none") else shown("speculative_config", "spec {}")]
        parts.append(f"{role[:-2] if role.endswith('-0') else role}: " + ", ".join(b for b in bits if b))
    return "; ".join(parts)
