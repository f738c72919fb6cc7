"""Cell: one point of the matrix, the unit the harness runs and judges.

A Cell is a frozen value. Everything downstream (Deployment, EvalRun, Comparison, Verdict, Record)
receives it and never mutates it. `cell_id` is the readable, stable name used for pytest ids,
file names and history rows; `baseline_key` names the non-disaggregated server the cell is
compared against, so cells that differ only in P/D settings share one baseline.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from harness.connectors import DEFAULT_KV_CONNECTOR
from harness.weathers import DEFAULT_WEATHER, WEATHERS, params_token

RUNNERS = ("v1", "v2")
# MLA (latent KV) models take their own backends on CUDA (vLLM AttentionBackendEnum names)
MLA_BACKENDS = ("FLASHMLA", "TRITON_MLA")
GPU_BACKENDS = ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN") + MLA_BACKENDS
CPU_BACKENDS = ("CPU_ATTN",)
BACKENDS = GPU_BACKENDS + CPU_BACKENDS
DEVICES = ("cpu", "cuda")
KV_BUFFER_DEVICES = ("cpu", "cuda")
FAULTS = ("drop-transfer", "foreign-params", "corrupt-block", "swap-blocks", "fail-transfer",
          "perturb-kv", "early-release", "corrupt-draft-kv", "wrong-drafts", "idle-instance")
# "default": what vLLM does unasked (torch.compile; CUDA graphs on GPU); "eager": --enforce-eager
# (neither). The KV connector, the attention kernels and the block handling are the same code
# in both; bugs can live in either (a CUDA-graph capture of a 1-token prefill, say).
COMPILE_MODES = ("default", "eager")
# Where prefill and decode live: "local" (one host: the transport may use shared memory / CUDA IPC) or
# "netns" (two simulated hosts: prefill and decode in their own network namespaces joined by a
# veth link, UCX restricted to TCP, so the KV must cross a real network path). The baseline is
# the same either way, so the network is in the cell id but not in the baseline key.
NETWORKS = ("local", "netns")
# Engine settings behind the P/D bugs of 2026 (docs/matrix.md names the bug class of each). The
# default of each is what vLLM does unasked; a cell's id names the ones it sets, and its baseline
# key those the baseline server runs too (every one but kv_layout, which only the decode sets).
ASYNC_SCHEDULING = ("default", "on", "off")     # --async-scheduling / --no-async-scheduling
# --speculative-config on decode and baseline; a draft-model value names each side's count of
# speculative tokens (draft_p1_d3: P 1, D 3, as vLLM's P/D CI runs it): the prefill runs the
# draft too, so that both sides hold the draft's KV layers (harness.serve.launch.server_spec);
# draft_p0_d3: the draft on the decode only, the prefill without it; eagle_p1_d3: the zoo's
# EAGLE head for tiny-llama-gsm, on both sides like draft_p1_d3 (eagle_p0_d3: decode only);
# mtp_p1_d3, mtp_p3_d3: the MTP head in tiny-qwen3next-hybrid-gsm-mtp's checkpoint, on both
# sides too (the prefill with 1 or 3 tokens)
DRAFT_MODEL_SPEC_DECODE = ("draft_p1_d3", "draft_p0_d3")
EAGLE_SPEC_DECODE = ("eagle_p1_d3", "eagle_p0_d3")
MTP_SPEC_DECODE = ("mtp_p1_d3", "mtp_p3_d3")
SPEC_DECODE_METHODS = ("ngram",) + DRAFT_MODEL_SPEC_DECODE + EAGLE_SPEC_DECODE + MTP_SPEC_DECODE
CUDAGRAPH_MODES = ("default", "FULL", "PIECEWISE", "NONE")   # --compilation-config cudagraph_mode
KV_LAYOUTS = ("default", "HND", "NHD")          # VLLM_KV_CACHE_LAYOUT of the decode server
# --kv-cache-dtype of the prefill and of the decode (the baseline runs the decode's); "fp8" is
# fp8_e4m3 on every backend of vLLM 0.32. Scales are vLLM's defaults (1.0; none are transferred).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
FAULT_ENV_PREFIX = "PD_ACCURACY_FAULT"   # extra_env keys that tune a fault (block, value)


@dataclass(frozen=True)
class Cell:
    """One P/D configuration plus its baseline. Defaults are the CPU smoke cell's."""

    model: str                      # zoo name (e.g. "tiny-llama-gsm"), local path, or hub id
    runner: str = "v1"              # "v1" | "v2" (VLLM_USE_V2_MODEL_RUNNER); see prefill_runner
    backend: str = "CPU_ATTN"
    prefill_block_size: int = 128
    decode_block_size: int = 128
    device: str = "cpu"             # where the servers compute: "cpu" | "cuda"
    kv_buffer_device: str = "cpu"   # the connector's buffer: "cpu" | "cuda"
    prefill_tp: int = 1
    decode_tp: int = 1
    num_prefill: int = 1
    num_decode: int = 1
    dtype: str = "bfloat16"        # in the id when not bfloat16 (a CPU without bf16: float32)
    max_model_len: int = 2048
    compile: str = "default"        # see COMPILE_MODES; in the id (and the baseline) when not default
    network: str = "local"          # see NETWORKS; in the id when not local
    async_scheduling: str = "default"   # see ASYNC_SCHEDULING; every server
    spec_decode: str | None = None      # see SPEC_DECODE_METHODS; decode and baseline
    prefix_reuse: bool = False          # prompts share a prefix the decode holds in its own cache
    chunked_prefill: int | None = None  # token budget per step (--max-num-batched-tokens); every server
    cudagraph_mode: str = "default"     # see CUDAGRAPH_MODES; every server
    kv_layout: str = "default"          # see KV_LAYOUTS; the decode server only
    # harness.connectors key: what moves the KV; in the id (not the baseline) when not default
    kv_connector: str = DEFAULT_KV_CONNECTOR
    prefill_kv_cache_dtype: str = "auto"    # see KV_CACHE_DTYPES; the prefill server
    decode_kv_cache_dtype: str = "auto"     # see KV_CACHE_DTYPES; the decode and the baseline
    prefill_runner: str | None = None   # the prefill's runner when not `runner` (mixed runners)
    # harness.weathers key: the workload and environment the pair is judged in; in the id
    # ("w_<name>", then its explicitly set parameters), not the baseline key (it runs calm)
    weather: str = DEFAULT_WEATHER
    weather_params: tuple[tuple[str, Any], ...] = ()   # sorted (name, number): the row's params
    extra_args: tuple[str, ...] = ()                 # appended to every server's argv
    extra_env: tuple[tuple[str, str], ...] = ()      # added to every server's env
    fault: str | None = None        # canary fault mode (see FAULTS); None for a real cell
    expected_failure: str | None = None  # reason, when the cell is known to fail upstream
    expected_failure_match: str | None = None  # regex its verdict's reason must match to XFAIL
    model_tag: str | None = None    # short name for ids when `model` is a path

    # ---- identity -------------------------------------------------------------------------
    @property
    def model_short(self) -> str:
        if self.model_tag:
            return self.model_tag
        return self.model.rstrip("/").split("/")[-1]

    @property
    def cell_id(self) -> str:
        """Readable id, e.g. ``v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1``."""
        parts = [
            self.runner,
            self.backend,
            f"p{self.prefill_block_size}d{self.decode_block_size}",
            self.model_short,
            f"tp{self.prefill_tp}x{self.decode_tp}",
        ]
        if (self.num_prefill, self.num_decode) != (1, 1):
            parts.append(f"n{self.num_prefill}x{self.num_decode}")
        if self.device == "cuda" and self.kv_buffer_device != "cuda":
            parts.append(f"kvbuf-{self.kv_buffer_device}")
        if self.compile != "default":
            parts.append(self.compile)
        if self.dtype != "bfloat16":
            parts.append(self.dtype)
        if self.network != "local":
            parts.append(self.network)
        if self.kv_connector != DEFAULT_KV_CONNECTOR:
            parts.append("kvc_" + self.kv_connector.replace("-", "_"))
        parts += self._engine_parts()
        if self.weather != DEFAULT_WEATHER:
            parts.append("w_" + self.weather.replace("-", "_") + params_token(self.weather_params))
        if self.extra_args or self.plain_env:
            parts.append(self._extras_hash(self.plain_env))
        if self.fault:
            parts.append(f"fault-{self.fault}")
            # PD_ACCURACY_FAULT_BLOCK=last -> "...-fault-corrupt-block-last"; a late start
            # says so ("after400"), not a bare count a block position could be read as
            parts += [f"after{v}" if k == FAULT_ENV_PREFIX + "_AFTER" else v
                      for k, v in self.fault_env]
        return "-".join(parts)

    def _engine_parts(self) -> list[str]:
        """One id token per engine setting the cell sets (no "-" inside: one token each)."""
        parts = []
        if self.async_scheduling != "default":
            parts.append(f"async_{self.async_scheduling}")
        if self.spec_decode:
            parts.append(f"spec_{self.spec_decode}")
        if self.prefix_reuse:
            parts.append("prefix_reuse")
        if self.chunked_prefill is not None:
            parts.append(f"chunk{self.chunked_prefill}")
        if self.cudagraph_mode != "default":
            parts.append(f"cg_{self.cudagraph_mode}")
        if self.kv_layout != "default":
            parts.append(f"dlayout_{self.kv_layout}")
        kv_p, kv_d = self.prefill_kv_cache_dtype, self.decode_kv_cache_dtype
        if kv_p != kv_d:
            parts.append(f"kv_p_{kv_p}_d_{kv_d}")
        elif kv_d != "auto":
            parts.append(f"kv_{kv_d}")
        if self.prefill_runner is not None:
            parts.append(f"prunner_{self.prefill_runner}")
        return parts

    def _baseline_engine_settings(self) -> dict[str, Any]:
        """The engine settings the baseline server runs too (absent when default, so cells that
        set none keep the keys they always had)."""
        settings = {"async_scheduling": self.async_scheduling, "spec_decode": self.spec_decode,
                    "prefix_reuse": self.prefix_reuse, "chunked_prefill": self.chunked_prefill,
                    "cudagraph_mode": self.cudagraph_mode}
        defaults = {name: Cell.__dataclass_fields__[name].default for name in settings}
        return {k: v for k, v in settings.items() if v != defaults[k]}

    def _extras_hash(self, env: tuple[tuple[str, str], ...]) -> str:
        blob = json.dumps([list(self.extra_args), [list(e) for e in env]])
        return "x" + hashlib.sha256(blob.encode()).hexdigest()[:6]

    @property
    def baseline_block_size(self) -> int:
        # The baseline generates like the decode side does.
        return self.decode_block_size

    @property
    def baseline_tp(self) -> int:
        return self.decode_tp

    @property
    def baseline_key(self) -> str:
        """Cells with equal baseline_key are compared against the same baseline server."""
        key = {
            "model": self.model,
            "runner": self.runner,
            "backend": self.backend,
            "block": self.baseline_block_size,
            "device": self.device,
            "tp": self.baseline_tp,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            **({"compile": self.compile} if self.compile != "default" else {}),
            # kv_layout and kv_connector are the pair's alone: the baseline (no connector) keeps
            # vLLM's own; it generates like the decode: its KV cache dtype (and its runner)
            **({"kv_cache_dtype": self.decode_kv_cache_dtype}
               if self.decode_kv_cache_dtype != "auto" else {}),
            **self._baseline_engine_settings(),
            # a weather that asks its own prompts (its row's task_variants) needs their baseline
            **({"prompts": self.weather} if self.weather_task_variants else {}),
            "extra_args": list(self.extra_args),
            # the fault switches only act on a decode server: a canary shares the real baseline
            "extra_env": [list(e) for e in self.plain_env],
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def weather_task_variants(self) -> dict[str, str]:
        """task -> the variant this cell's weather asks instead (empty: the cell's own task)."""
        row = WEATHERS.get(self.weather)
        return dict(row.task_variants) if row is not None else {}

    @property
    def fault_env(self) -> tuple[tuple[str, str], ...]:
        """extra_env entries that steer a server-side fault (e.g. PD_ACCURACY_FAULT_BLOCK=last)."""
        return tuple(e for e in self.extra_env if e[0].startswith(FAULT_ENV_PREFIX))

    @property
    def plain_env(self) -> tuple[tuple[str, str], ...]:
        """extra_env without the fault switches: what every server of the cell runs with."""
        return tuple(e for e in self.extra_env if not e[0].startswith(FAULT_ENV_PREFIX))

    @property
    def is_canary(self) -> bool:
        return self.fault is not None

    # ---- resources ------------------------------------------------------------------------
    @property
    def gpus_needed(self) -> dict[str, int]:
        """GPUs per role when every server has its own GPUs (cpu cells need 0).

        ``total`` assumes the baseline server is not up at the same time as the P/D pair
        (max of the two sets); ``all_at_once`` is the count when all three run together;
        ``min_shared`` is the fewest GPUs the cell runs on when its servers share GPUs (tiny
        models with explicit memory budgets): its widest tensor-parallel server.
        """
        if self.device != "cuda":
            return {"prefill": 0, "decode": 0, "baseline": 0, "total": 0, "all_at_once": 0,
                    "min_shared": 0}
        prefill = self.prefill_tp * self.num_prefill
        decode = self.decode_tp * self.num_decode
        baseline = self.baseline_tp
        return {
            "prefill": prefill, "decode": decode, "baseline": baseline,
            "total": max(prefill + decode, baseline), "all_at_once": prefill + decode + baseline,
            "min_shared": max(self.prefill_tp, self.decode_tp, baseline),
        }

    # ---- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra_args"] = list(self.extra_args)
        d["extra_env"] = {k: v for k, v in self.extra_env}
        d["weather_params"] = {k: v for k, v in self.weather_params}
        d["id"] = self.cell_id
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Cell":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if "extra_args" in kwargs:
            kwargs["extra_args"] = tuple(kwargs["extra_args"])
        if "extra_env" in kwargs:
            env = kwargs["extra_env"]
            items = env.items() if isinstance(env, Mapping) else env
            kwargs["extra_env"] = tuple(sorted((str(k), str(v)) for k, v in items))
        if "weather_params" in kwargs:
            kwargs["weather_params"] = weather_items(kwargs["weather_params"])
        return cls(**kwargs)

    @property
    def weather_settings(self) -> dict[str, Any]:
        """The weather's explicitly set parameters as a mapping."""
        return dict(self.weather_params)

    def replace(self, **changes: Any) -> "Cell":
        return dataclasses.replace(self, **changes)


def weather_items(params: Mapping[str, Any] | Any) -> tuple[tuple[str, Any], ...]:
    """Weather parameters as Cell.weather_params holds them: sorted (name, value) pairs."""
    items = params.items() if isinstance(params, Mapping) else params
    return tuple(sorted((str(k), v) for k, v in items))
