"""ServerSpec → the exact argv and environment of one vLLM OpenAI server.

Pure functions only: nothing here starts a process, so `--dry-run` and the unit tests can show
every command before anything runs. The vLLM flags that differ between versions are chosen from
`VllmFeatures` (what the installed package accepts), never from a hard-coded version list.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from harness.core.cell import Cell
from harness.connectors import DEFAULT_KV_CONNECTOR, connector_for
from harness.weathers.facts import ServerChanges
from harness.core.spec_decode import (PREFILL_SPEC_TOKENS, ROLES_GENERATING, SPEC_DECODE_CONFIGS,
                                      speculative_expectation)
from harness.serve.launch import thread_budget
from harness.protocol.faults import BY_REQUEST, PREFILL_FAULT_ENV
from harness.protocol.switches import COMPILE_KEY_ENV, FORK_START_ENV
from harness.protocol.faults import FAULT_KINDS as SERVER_FAULTS

ROLES = ("baseline", "prefill", "decode")
KV_ROLE_FOR = {"prefill": "kv_producer", "decode": "kv_consumer"}
# SERVER_FAULTS: the faults that live inside the decode server (the fault plugin's kinds); the
# others are the proxy's (harness.serve.proxy.hops.PROXY_FAULTS)
DEFAULT_CPU_KV_CACHE_BYTES = 256 * 1024 * 1024
# vLLM requires max_num_batched_tokens >= max_num_seqs (CPU's default max_num_seqs is 128 per
# rank): a chunked-prefill budget below it lowers max_num_seqs with it, still far above the
# evaluation's concurrency
MAX_NUM_SEQS_CAP = 128
# CUDA: vLLM 0.26 defaults to 1024 sequences on an H200, and start-up pays for that size twice:
# CUDA graphs are captured for 51 batch sizes up to 512 (2 x max_num_seqs, capped), and the V2
# runner's kernel warm-up runs a batch of max_num_seqs requests through every sampling feature
# (14 s between "Graph capturing finished" and the JIT monitor on every V2 server of
# gpu-h200-engine-axes-20261201). The evaluation sends at most --concurrency requests at once (16 by
# default), so 64 is never reached; batches up to 128 tokens stay CUDA-graphed.
CUDA_MAX_NUM_SEQS = 64


@dataclass(frozen=True)
class Features:
    """The subset of what the installed vLLM accepts that command construction needs.

    `harness.vllm_features.detect()` fills this from the installed package; tests build it by
    hand. Defaults describe vLLM 0.26–0.32."""

    attention_backend_flag: bool = True    # `--attention-backend` (else VLLM_ATTENTION_BACKEND)
    v2_runner_env: bool = True             # VLLM_USE_V2_MODEL_RUNNER exists
    kv_roles: tuple[str, ...] = ("kv_producer", "kv_consumer", "kv_both")
    kv_cache_memory_bytes_flag: bool = True
    # --per-request-spec-decode-metrics (vLLM 0.32 has it; off unless the probe finds it)
    spec_decode_metrics_flag: bool = False

    @classmethod
    def detect(cls) -> "Features":
        """From the installed vLLM (harness.vllm_features.detect, cached per version)."""
        from harness.serve.launch.vllm_features import detect

        vf = detect()
        return cls(attention_backend_flag=vf.attention_backend_flag,
                   v2_runner_env=vf.v2_runner_env,
                   kv_roles=tuple(vf.kv_roles) or cls().kv_roles,
                   spec_decode_metrics_flag=vf.spec_decode_metrics_flag)

    def kv_role(self, role: str) -> str:
        wanted = KV_ROLE_FOR[role]
        return wanted if wanted in self.kv_roles else "kv_both"


@dataclass(frozen=True)
class ServerSpec:
    role: str                      # baseline | prefill | decode
    index: int                     # instance number within its role
    model_path: str
    served_model_name: str
    port: int
    backend: str
    block_size: int
    runner: str = "v1"
    device: str = "cpu"
    dtype: str = "bfloat16"
    tp: int = 1
    max_model_len: int = 2048
    compile: str = "default"                   # "eager": --enforce-eager (no torch.compile/CUDA graphs)
    kv_buffer_device: str = "cpu"
    kv_connector: str = DEFAULT_KV_CONNECTOR   # harness.connectors key (prefill/decode)
    side_channel_port: int | None = None      # the connector's first reserved port (its handshake)
    kv_shared_path: str | None = None         # a directory the pair shares (ExampleConnector's files)
    internal_port: int | None = None          # VLLM_PORT: first of the ports vLLM binds inside
    kv_cache_bytes: int | None = DEFAULT_CPU_KV_CACHE_BYTES
    cpu_cores: str | None = None               # VLLM_CPU_OMP_THREADS_BIND, e.g. "0" or "0-1"
    gpu_ids: tuple[int, ...] = ()
    gpu_memory_utilization: float | None = None
    hybrid: bool = False
    load_format: str | None = None             # "dummy": no weight files, vLLM fills them randomly
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    fault: str | None = None                   # server-side fault (decode; by-request: prefill too)
    fault_block: str = "first"
    # engine settings (harness.core.cell; `engine_settings` says which role runs which)
    async_scheduling: str = "default"          # on: --async-scheduling, off: --no-async-scheduling
    spec_decode: str | None = None             # SPEC_DECODE_CONFIGS key: --speculative-config
    prefix_caching: bool = False               # --enable-prefix-caching (vLLM's default, made explicit)
    max_num_batched_tokens: int | None = None  # chunked prefill at this token budget per step
    cudagraph_mode: str = "default"            # --compilation-config {"cudagraph_mode": ...}
    kv_layout: str = "default"                 # VLLM_KV_CACHE_LAYOUT (HND | NHD)
    kv_cache_dtype: str = "auto"               # --kv-cache-dtype (fp8, fp8_e4m3, fp8_e5m2)
    # what the cell's weather changes in this P/D server (harness.weathers; none when calm)
    weather: ServerChanges = ServerChanges()
    python: str = field(default_factory=lambda: sys.executable)
    # where it runs (harness.serve.net.netns): the address it binds and is reached at, the
    # connector's side-channel address, and what runs it (``ip netns exec NS``); by default this host's loopback
    host: str = "127.0.0.1"
    side_channel_host: str | None = None       # None: `host`
    launch_prefix: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.role if self.role == "baseline" else f"{self.role}-{self.index}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def engine_settings(cell: Cell, role: str) -> dict[str, Any]:
    """The ServerSpec fields that `cell`'s engine settings give its server of `role`.

    Scheduling, prefix caching, the chunked-prefill budget and the CUDA-graph mode apply to every
    server (P/D is compared with a baseline that runs the same engine). Speculative decoding runs
    where tokens are generated: the decode and the baseline, which generates like the decode;
    the prefill produces one token and hands its KV over (a draft model runs there too, with
    the prefill's own count of speculative tokens, so that its KV layers exist on both sides). The KV layout is the decode's alone:
    its prefill keeps the layout its connector picks for P/D, so an NHD decode receives those blocks.
    The KV cache dtype is the prefill's own on the prefill, the decode's on the decode and the
    baseline (a P/D pair whose dtypes differ is expected to be refused at the handshake).
    """
    if role not in ROLES:
        raise ValueError(f"unknown server role {role!r}")
    return {
        "async_scheduling": cell.async_scheduling,
        "spec_decode": (cell.spec_decode if role in ROLES_GENERATING
                        or cell.spec_decode in PREFILL_SPEC_TOKENS else None),
        "prefix_caching": cell.prefix_reuse,
        "max_num_batched_tokens": cell.chunked_prefill,
        "cudagraph_mode": cell.cudagraph_mode,
        "kv_layout": cell.kv_layout if role == "decode" else "default",
        "kv_cache_dtype": cell.prefill_kv_cache_dtype if role == "prefill" else cell.decode_kv_cache_dtype,
    }


def kv_transfer_config(spec: ServerSpec, features: Features) -> dict | None:
    if spec.role == "baseline":
        return None
    connector = connector_for(spec.kv_connector)
    config = connector.kv_transfer_config(
        spec.role, kv_role=features.kv_role(spec.role), kv_buffer_device=spec.kv_buffer_device,
        kv_layout=spec.kv_layout, side_port=spec.side_channel_port)
    if connector.shared_path_key and spec.kv_shared_path:
        config["kv_connector_extra_config"] = {**config.get("kv_connector_extra_config", {}),
                                               connector.shared_path_key: spec.kv_shared_path}
    config.update(dict(spec.weather.kv_transfer))
    if spec.weather.kv_connector_extra:
        config["kv_connector_extra_config"] = {**config.get("kv_connector_extra_config", {}),
                                               **dict(spec.weather.kv_connector_extra)}
    return config


def weather_argv(changes: ServerChanges) -> list[str]:
    """The vLLM flags of what a weather changes in a server (empty when calm)."""
    argv: list[str] = []
    if changes.num_blocks is not None:
        # vLLM 0.32 CPU sizes its cache from VLLM_CPU_KVCACHE_SPACE (GiB, >= 1) over
        # --kv-cache-memory-bytes; the block override is applied after either (kv_cache_utils)
        argv += ["--num-gpu-blocks-override", str(changes.num_blocks)]
    if changes.prefix_caching is not None:
        argv.append("--enable-prefix-caching" if changes.prefix_caching
                    else "--no-enable-prefix-caching")
    if changes.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(changes.max_num_seqs)]
    return argv + list(changes.extra_args)


def max_num_seqs_cap(spec: ServerSpec) -> int:
    """The most sequences a server of ``spec`` batches: far above the evaluation's concurrency."""
    return CUDA_MAX_NUM_SEQS if spec.device == "cuda" else MAX_NUM_SEQS_CAP


def speculative_config(spec_decode: str, role: str) -> dict[str, Any]:
    """vLLM's --speculative-config of ``spec_decode`` on a server of ``role``: a draft model's
    zoo name becomes its checkpoint directory, the prefill takes its own token count."""
    config = dict(SPEC_DECODE_CONFIGS[spec_decode])
    if "model" in config:
        from harness.zoo import registry

        config["model"] = str(registry.checkpoint_dir(config["model"]))
    if role == "prefill":
        config["num_speculative_tokens"] = PREFILL_SPEC_TOKENS[spec_decode]
    return config


def draft_model_path(spec: ServerSpec) -> str | None:
    """The draft model a server of ``spec`` runs (its checkpoint directory), or None."""
    if not spec.spec_decode:
        return None
    return draft_checkpoint(spec.spec_decode, spec.role, spec.model_path)


def draft_checkpoint(spec_decode: str, role: str, model_path: str) -> str | None:
    """The checkpoint a server of ``role`` that serves ``model_path`` reads its drafter from: a
    draft model's or EAGLE head's own; for vLLM's mtp method, which names no model, the served
    checkpoint (its mtp.* weights); None for ngram or a server without a drafter."""
    config = speculative_config(spec_decode, role) if speculative_expectation(
        spec_decode, role) else {}
    if config.get("method") == "mtp":
        return model_path
    return config.get("model")


def engine_argv(spec: ServerSpec) -> list[str]:
    """The vLLM flags of the spec's engine settings (empty when all are vLLM's defaults)."""
    argv: list[str] = []
    if spec.async_scheduling == "on":
        argv.append("--async-scheduling")
    elif spec.async_scheduling == "off":
        argv.append("--no-async-scheduling")
    if spec.spec_decode:
        argv += ["--speculative-config",
                 json.dumps(speculative_config(spec.spec_decode, spec.role), separators=(",", ":"))]
    if spec.prefix_caching:
        argv.append("--enable-prefix-caching")
    if spec.max_num_batched_tokens is not None:
        budget = spec.max_num_batched_tokens
        argv += ["--enable-chunked-prefill", "--max-num-batched-tokens", str(budget),
                 "--max-num-seqs", str(min(budget, max_num_seqs_cap(spec)))]
    if spec.cudagraph_mode != "default":
        argv += ["--compilation-config",
                 json.dumps({"cudagraph_mode": spec.cudagraph_mode}, separators=(",", ":"))]
    if spec.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", spec.kv_cache_dtype]
    return argv


def spec_metrics_argv(spec: ServerSpec, features: Features) -> list[str]:
    """Where tokens are generated with drafts (the decode, the baseline), each answer carries
    its request's draft acceptance, which check spec-acceptance pairs question by question."""
    if not spec.spec_decode or spec.role not in ROLES_GENERATING:
        return []
    return (["--per-request-spec-decode-metrics", "summary"]
            if features.spec_decode_metrics_flag else [])


def build_argv(spec: ServerSpec, features: Features = Features()) -> list[str]:
    if spec.role not in ROLES:
        raise ValueError(f"unknown server role {spec.role!r}")
    argv = [
        *spec.launch_prefix, spec.python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", spec.model_path,
        "--served-model-name", spec.served_model_name,
        "--host", spec.host,
        "--port", str(spec.port),
        "--dtype", spec.dtype,
        "--max-model-len", str(spec.max_model_len),
        "--block-size", str(spec.block_size),
        "--tensor-parallel-size", str(spec.tp),
        "--seed", str(spec.seed),
    ]
    if spec.load_format:
        argv += ["--load-format", spec.load_format]
    if features.attention_backend_flag:
        argv += ["--attention-backend", spec.backend]
    if spec.kv_cache_bytes and features.kv_cache_memory_bytes_flag:
        argv += ["--kv-cache-memory-bytes", str(spec.kv_cache_bytes)]
    if spec.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{spec.gpu_memory_utilization:.4f}"]
    if spec.compile == "eager":
        argv.append("--enforce-eager")
    if spec.device == "cuda" and spec.max_num_batched_tokens is None:
        argv += ["--max-num-seqs", str(CUDA_MAX_NUM_SEQS)]   # a chunk budget caps it itself
    argv += engine_argv(spec) + spec_metrics_argv(spec, features)
    ktc = kv_transfer_config(spec, features)
    if ktc is not None:
        argv += ["--kv-transfer-config", json.dumps(ktc, separators=(",", ":"))]
    argv += weather_argv(spec.weather)
    argv += list(spec.extra_args)
    return argv


def cpu_affinity(spec: ServerSpec) -> frozenset[int] | None:
    """The cores a CPU server's processes are confined to from launch: its
    VLLM_CPU_OMP_THREADS_BIND cores ("0", "0|1", "0-3", "0,2"); None on GPU or unplaced."""
    if spec.device != "cpu" or not spec.cpu_cores:
        return None
    cores: set[int] = set()
    for part in spec.cpu_cores.replace("|", ",").split(","):
        first, _, last = part.strip().partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return frozenset(cores)


def forks_engine(spec: ServerSpec) -> bool:
    """A server whose engine core (and CPU worker) is forked from the API server instead of
    spawned: TP1, and on CPU pinned to its core from launch (the fork-start plugin)."""
    if spec.tp != 1:
        return False
    return spec.device == "cuda" or cpu_affinity(spec) is not None


def cuda_env(spec: ServerSpec, env: Mapping[str, str]) -> dict[str, str]:
    """What a GPU server of ``spec`` adds to ``env`` (its inherited environment)."""
    out: dict[str, str] = {}
    if spec.gpu_ids:
        # gpu_ids index the GPUs this harness may use: a lease or farm job that already set
        # CUDA_VISIBLE_DEVICES=2,3 makes gpu 0 the physical GPU 2
        inherited = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        out["CUDA_VISIBLE_DEVICES"] = ",".join(
            inherited[i] if i < len(inherited) else str(i) for i in spec.gpu_ids)
    # shared H200 hosts: never use NVLink multicast, even if the parent env enables it
    # (a cell that really wants it says so in extra_env, applied last). Besides NCCL, torch
    # and NVSHMEM, vLLM >= 0.26 fuses all-reduce + RMSNorm for TP>1 on Hopper through
    # FlashInfer, whose "auto" backend picks "mnnvl" on one node and calls cuMulticastCreate:
    # on the 2xH200 (2026-11-29/30) every TP2 Llama server that did so died in start-up
    # (CUBLAS_STATUS_INTERNAL_ERROR, illegal memory access). "trtllm" is the same fusion
    # over CUDA IPC buffers, without multicast.
    out.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1", "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm"})
    # Start-up: the harness decodes greedily, so top-k/top-p sampling never runs, but
    # vLLM warms FlashInfer's sampler up anyway, and on a fresh H200 that JIT-compiles it:
    # 80 s between "Graph capturing finished" and "Kernel JIT monitor activated" on every
    # FLASH_ATTN/TRITON_ATTN server of the first wave (gpu-h200-kv-buffer-20261201, 8 s once the
    # cache was warm). PyTorch's sampler instead; the KV path is not involved.
    if "VLLM_USE_FLASHINFER_SAMPLER" not in env:
        out["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    # Start-up: vLLM's CLI entry point sets VLLM_WORKER_MULTIPROC_METHOD=spawn unless it is
    # set (api_utils.cli_env_setup), so the engine core imported vLLM a second time: the
    # H200 py-spy samples of gpu-h200-fork-swa-20261202 show the engine core in spawn_main,
    # 17 s between the API server's config and the engine core alone, 20-47 s with 8
    # servers starting. vLLM's own default is fork (envs.py; the API server never touches
    # CUDA, and vLLM switches to spawn by itself with a warning if it did). TP1 only, like
    # CPU: a TP>1 server's workers keep the CLI's spawn.
    if forks_engine(spec):
        out["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    return out


def build_env(spec: ServerSpec, features: Features = Features(),
              base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base_env is None else base_env)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        # the connector's ports out of torch.compile's cache key: pairs share their baseline's cache
        COMPILE_KEY_ENV: "1",
    })
    if features.v2_runner_env:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if spec.runner == "v2" else "0"
    if not features.attention_backend_flag:
        env["VLLM_ATTENTION_BACKEND"] = spec.backend
    if spec.role != "baseline":
        env.update(connector_for(spec.kv_connector).server_env(
            host=spec.host, side_host=spec.side_channel_host, side_port=spec.side_channel_port))
    if spec.internal_port is not None:
        # vLLM's torch.distributed rendezvous otherwise probes a free ephemeral port, closes it
        # and binds it later: servers starting together can pick the same one (on the H200 a
        # baseline died with "DistNetworkError ... port: 36225 ... EADDRINUSE"). From VLLM_PORT
        # it counts up from a port the harness reserved for this server alone.
        env["VLLM_PORT"] = str(spec.internal_port)
    env.pop(FORK_START_ENV, None)          # a parent shell's setting does not leak in
    if spec.device == "cpu":
        # Forking (harness/serve/plugins/startup/fork_start.py) starts a lone server in 16.7 s instead
        # of 29.4 s. Armed only where the server is pinned to its one core from launch
        # (cpu_affinity, applied by ManagedProcess before exec): a forked worker does not bind
        # its OpenMP threads itself (all 47 allowed on cores 0-1 unpinned), pinned every thread
        # of all three processes sat on the server's core, as spawned. TP>1 keeps spawning:
        # each rank binds its own core, which a forked rank was not seen to do.
        if forks_engine(spec):
            env[FORK_START_ENV] = "1"
        thread_budget.apply(env)    # what each thread may do on the pinned core
        if spec.cpu_cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_cores
        if spec.kv_cache_bytes:
            # also size it the CPU-specific way (whole GiB, rounded up) in case the flag is ignored
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, -(-spec.kv_cache_bytes // 2**30))))
    else:
        env.update(cuda_env(spec, env))
    if spec.hybrid:
        env["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"
    if spec.kv_layout != "default":
        env["VLLM_KV_CACHE_LAYOUT"] = spec.kv_layout
    if spec.fault == BY_REQUEST and spec.role == "prefill":
        env[PREFILL_FAULT_ENV] = BY_REQUEST     # armed for a prefill-side canary's requests
    if spec.fault == BY_REQUEST and spec.role == "decode":
        env["PD_ACCURACY_FAULT"] = BY_REQUEST   # armed; each canary request names its fault
    elif spec.fault in SERVER_FAULTS and spec.role == "decode":
        env["PD_ACCURACY_FAULT"] = spec.fault
        env["PD_ACCURACY_FAULT_BLOCK"] = spec.fault_block
    else:
        env.pop("PD_ACCURACY_FAULT", None)
    env.update(dict(spec.weather.extra_env))
    env.update(dict(spec.extra_env))
    return env


def render_command(spec: ServerSpec, features: Features = Features(),
                   env_keys: Sequence[str] = ("VLLM_", "CUDA_VISIBLE_DEVICES", "PD_ACCURACY_"),
                   env: Mapping[str, str] | None = None) -> str:
    """A copy-pasteable shell line for --dry-run and error messages (`env`: the server's own,
    when the caller adds to build_env's)."""
    env = build_env(spec, features, base_env={}) if env is None else env
    shown = {k: v for k, v in sorted(env.items()) if k.startswith(tuple(env_keys))}
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
    cores = cpu_affinity(spec)
    pin = ["taskset", "-c", ",".join(map(str, sorted(cores)))] if cores else []
    return (prefix + " " if prefix else "") + shlex.join(pin + build_argv(spec, features))
