"""The machine cells are expanded for: its GPUs and, when probed, what its vLLM accepts.

`PlatformInfo.detect()` answers "how many GPUs, how big" from nvidia-smi (or torch as a fallback)
without importing vLLM; the matrix uses it to exclude cells the machine cannot hold. `VllmFeatures`
is the value the probe in `harness.serve.launch.vllm_features` returns; it lives here because the matrix
rules read it and must not depend on the code that starts servers.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping


# a runner a vLLM release no longer ships -> what its users read (vllm/platforms/interface.py of
# 0.34.0: "VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 has been removed")
RUNNERS_REMOVED = {"v1": "Model Runner V1 was removed in 0.34.0"}
MAX_PRETEND_GPUS = 1024   # more than any host; a pretend machine of more would only cost memory


@dataclass(frozen=True)
class VllmFeatures:
    """Capabilities of the installed vLLM, as read from the package itself."""

    version: str
    platform: str                         # "cpu" | "cuda" (vLLM's current_platform.device_type)
    attention_backend_flag: bool          # EngineArgs has `attention_backend` (--attention-backend)
    attention_backend_env: bool           # vllm.envs knows VLLM_ATTENTION_BACKEND
    v2_runner_env: bool                   # vllm.envs knows VLLM_USE_V2_MODEL_RUNNER
    kv_roles: tuple[str, ...]             # accepted KVTransferConfig.kv_role values
    attention_backends: tuple[str, ...] = ()  # AttentionBackendEnum member names, when known
    # KV connector names vLLM's KVConnectorFactory registers, and the connectors' transports
    # ("module:attribute", harness.connectors) that import; None: not probed
    kv_connectors: tuple[str, ...] | None = None
    kv_transports: tuple[str, ...] | None = None
    # a transport that does not import -> the error it raised (one line), when probed
    kv_transport_errors: Mapping[str, str] | None = None
    # each hook of the compatibility table (harness.serve.plugins.compat) -> what this vLLM
    # lacks for it (None: it attaches); None: not probed
    hooks: Mapping[str, str | None] | None = None
    # each hook -> the alternatives of its needs this vLLM has (an older method, signature)
    hook_shapes: Mapping[str, tuple[str, ...]] | None = None
    # the model runners this release ships ("v1", "v2"); with v2_runner_env the variable picks
    # one, without it the one there runs (0.34: V2 only); None: not probed
    model_runners: tuple[str, ...] | None = None
    # EngineArgs has `per_request_spec_decode_metrics`: each answer carries its request's draft
    # acceptance (--per-request-spec-decode-metrics), which check spec-acceptance pairs
    spec_decode_metrics_flag: bool = False

    def runner_missing(self, runner: str) -> str | None:
        """Why this release cannot run model runner `runner` ("v1" | "v2"), or None: it can.

        Which runners a release has is read from its package (``model_runners``); an older probe
        that did not read them falls back to the variable: V2 needs VLLM_USE_V2_MODEL_RUNNER."""
        if self.model_runners is not None:
            if runner in self.model_runners:
                if len(self.model_runners) > 1 and not self.v2_runner_env:
                    return (f"the installed vLLM {self.version} ships runners "
                            f"{', '.join(self.model_runners)} and no VLLM_USE_V2_MODEL_RUNNER "
                            "to choose one")
                return None
            removed = RUNNERS_REMOVED.get(runner)
            if removed is not None:
                return f"not applicable on vLLM {self.version}: {removed}"
            return (f"not applicable on vLLM {self.version}: it ships model runner(s) "
                    f"{', '.join(self.model_runners) or 'none'}, not {runner}")
        if runner == "v2" and not self.v2_runner_env:
            return f"the installed vLLM {self.version} has no VLLM_USE_V2_MODEL_RUNNER"
        return None

    def hooks_missing(self) -> dict[str, str]:
        """The hooks that do not attach on this vLLM -> what it lacks."""
        return {name: why for name, why in (self.hooks or {}).items() if why is not None}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "VllmFeatures":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("kv_roles", "attention_backends", "kv_connectors", "kv_transports",
                    "model_runners"):
            if kwargs.get(key) is not None:
                kwargs[key] = tuple(kwargs[key])
        if kwargs.get("kv_transport_errors") is not None:
            kwargs["kv_transport_errors"] = dict(kwargs["kv_transport_errors"])
        if kwargs.get("hooks") is not None:
            kwargs["hooks"] = dict(kwargs["hooks"])
        if kwargs.get("hook_shapes") is not None:
            kwargs["hook_shapes"] = {k: tuple(v) for k, v in kwargs["hook_shapes"].items()}
        return cls(**kwargs)

    def attention_backend_setting(self, backend: str) -> tuple[list[str], dict[str, str]]:
        """(argv, env) that select `backend` on this vLLM: the CLI flag where it exists,
        else the legacy environment variable."""
        if self.attention_backend_flag:
            return ["--attention-backend", backend], {}
        if self.attention_backend_env:
            return [], {"VLLM_ATTENTION_BACKEND": backend}
        raise RuntimeError(f"vLLM {self.version} has neither --attention-backend nor VLLM_ATTENTION_BACKEND")


# the vector and matrix extensions that decide how fast a CPU server computes in bf16: on a
# 2-core host with AVX2 only, a bf16 evaluation took 2.4x as long as in float32 (2026-12-02),
# and CPU timings are not comparable across hosts that differ here
CPU_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
# either computes bf16 natively (AMX implies avx512_bf16 on every x86 CPU that has it)
BF16_ISA_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_isa(cpuinfo: str) -> list[str]:
    """The CPU_ISA_FLAGS the first processor of /proc/cpuinfo lists."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in CPU_ISA_FLAGS if f in flags]
    return []


def detect_cpu_isa() -> tuple[str, ...] | None:
    """This machine's CPU_ISA_FLAGS; None where /proc/cpuinfo cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return tuple(cpu_isa(f.read()))
    except OSError:
        return None


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    memory_bytes: int


def query_nvidia_smi(smi: str | None = None) -> list[GpuDevice] | None:
    """GPUs as nvidia-smi lists them (physical indices), or None when nvidia-smi is unusable."""
    smi = smi or shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi_csv(out)


def query_gpu_used_bytes(smi: str | None = None) -> dict[int, int]:
    """Memory in use now per physical GPU index, as nvidia-smi says ({} when it cannot)."""
    smi = smi or shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    used = {}
    for line in out.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                used[int(parts[0])] = int(float(parts[1])) * 1024 * 1024
            except ValueError:
                continue
    return used


def parse_nvidia_smi_csv(text: str) -> list[GpuDevice]:
    """Parse `index, name, memory.total [MiB]` rows."""
    devices = []
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue  # header or an error line
        try:
            mib = float(parts[-1])
        except ValueError:
            mib = 0.0  # "[N/A]": count the GPU, memory unknown
        devices.append(GpuDevice(int(parts[0]), ", ".join(parts[1:-1]), int(mib) * 1024 * 1024))
    return devices


def query_torch() -> list[GpuDevice]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append(GpuDevice(i, props.name, int(props.total_memory)))
    return out


def visible_devices(devices: Iterable[GpuDevice], cuda_visible: str | None) -> list[GpuDevice]:
    """Apply CUDA_VISIBLE_DEVICES (numeric form only; UUIDs leave the list as is)."""
    devices = list(devices)
    if cuda_visible is None:
        return devices
    wanted = [p.strip() for p in cuda_visible.split(",") if p.strip()]
    if not all(p.lstrip("-").isdigit() for p in wanted):
        return devices
    by_index = {d.index: d for d in devices}
    chosen = []
    for p in wanted:
        if int(p) < 0:
            break  # CUDA stops enumerating at the first invalid index
        if int(p) in by_index:
            chosen.append(by_index[int(p)])
    return chosen


def netns_unavailable_reason() -> str | None:
    """Why this machine cannot make the two-host topology (harness.serve.net.netns), or None: network
    namespaces and veth links need Linux, root and iproute2's `ip`."""
    if not sys.platform.startswith("linux"):
        return "network namespaces (network: netns) are Linux only"
    if os.geteuid() != 0:
        return f"network: netns needs root to create network namespaces (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "network: netns needs iproute2's `ip`, not found on PATH"
    return None


def detect_gpus() -> list[GpuDevice]:
    """The one home of GPU detection: nvidia-smi (physical indices, honouring
    CUDA_VISIBLE_DEVICES), torch as a fallback; [] on a machine without GPUs."""
    found = query_nvidia_smi()
    if found is None:
        return query_torch()
    return visible_devices(found, os.environ.get("CUDA_VISIBLE_DEVICES"))


@dataclass(frozen=True)
class PlatformInfo:
    """The machine cells are expanded for. `vllm` is filled only when the caller probed it."""

    device: str = "cpu"                       # "cpu" | "cuda"
    gpu_count: int = 0
    gpu_names: tuple[str, ...] = ()
    gpu_memory_bytes: tuple[int, ...] = ()
    gpu_indices: tuple[int, ...] = ()         # physical indices (for CUDA_VISIBLE_DEVICES)
    vllm: VllmFeatures | None = None
    # why this machine cannot run network=netns cells (None: it can, or a pretend machine)
    netns_unavailable: str | None = None
    cpu_isa: tuple[str, ...] | None = None    # CPU_ISA_FLAGS present; None: not known

    @classmethod
    def detect(cls, vllm: VllmFeatures | None = None) -> "PlatformInfo":
        """This machine's GPUs (`detect_gpus`); `vllm` is what the caller probed, if anything
        (`harness.serve.launch.vllm_features.detect_platform` probes it)."""
        return dataclasses.replace(cls.from_devices(detect_gpus(), vllm=vllm),
                                   netns_unavailable=netns_unavailable_reason(),
                                   cpu_isa=detect_cpu_isa())

    @classmethod
    def from_devices(cls, devices: Iterable[GpuDevice], vllm: VllmFeatures | None = None) -> "PlatformInfo":
        devices = list(devices)
        return cls(
            device="cuda" if devices else "cpu",
            gpu_count=len(devices),
            gpu_names=tuple(d.name for d in devices),
            gpu_memory_bytes=tuple(d.memory_bytes for d in devices),
            gpu_indices=tuple(d.index for d in devices),
            vllm=vllm,
        )

    @property
    def computes_bf16(self) -> bool:
        """The CPU has bf16 instructions (True when its ISA is not known)."""
        return self.cpu_isa is None or any(f in self.cpu_isa for f in BF16_ISA_FLAGS)

    @classmethod
    def from_spec(cls, spec: str) -> "PlatformInfo":
        """A pretend machine for listing: "cpu", "cpu:avx2" (its ISA flags, "+"-joined, e.g.
        "cpu:avx2+avx512f+avx512_bf16"), "cuda:8" or "cuda:8:141" (GiB per GPU)."""
        parts = spec.strip().lower().split(":")
        if parts == ["cpu"]:
            return cls()
        if parts[0] == "cpu" and len(parts) == 2 and parts[1]:
            flags = tuple(parts[1].split("+"))
            unknown = [f[:20] for f in flags if f not in CPU_ISA_FLAGS][:3]
            if unknown:
                raise ValueError(f"platform spec {spec[:40]!r}: unknown ISA flag(s) {unknown}; "
                                 f"known: {'+'.join(CPU_ISA_FLAGS)}")
            return cls(cpu_isa=flags)
        shown = spec if len(spec) <= 40 else spec[:37] + "..."
        if (parts[0] != "cuda" or len(parts) not in (2, 3)
                or not re.fullmatch(r"[0-9]{1,30}", parts[1])):
            raise ValueError(f"platform spec {shown!r}: expected 'cpu', 'cpu:ISA+ISA', 'cuda:N' "
                             f"or 'cuda:N:GiB'")
        count = int(parts[1])
        if not 1 <= count <= MAX_PRETEND_GPUS:   # each pretend GPU is an object: bound them
            raise ValueError(f"platform spec {shown!r}: N must be 1 to {MAX_PRETEND_GPUS} GPUs")
        try:
            gib = float(parts[2]) if len(parts) == 3 else 80.0
        except ValueError:
            gib = math.nan
        if not (math.isfinite(gib) and 0 < gib <= 1 << 20):
            raise ValueError(f"platform spec {shown!r}: GiB per GPU must be a number in (0, 1048576]")
        return cls.from_devices(GpuDevice(i, "pretend", int(gib * 1024**3)) for i in range(count))

    def describe(self) -> str:
        if self.device == "cpu":
            return "cpu (no GPU)"
        names = sorted(set(self.gpu_names))
        return f"cuda: {self.gpu_count} GPU(s) {', '.join(names)}"
