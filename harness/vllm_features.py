"""What the installed vLLM accepts, and what hardware this machine has.

`detect()` reads the *installed* vLLM package (its EngineArgs fields, its `vllm.envs` table, the
Literal type of KVTransferConfig.kv_role) instead of comparing version numbers, so a harness built
against one release still builds valid command lines for the next. Importing vLLM takes 5-10 s and
drags torch into the process, so the probe runs in a child interpreter and its answer is cached as
JSON under ~/.cache/pd-accuracy/, keyed by the vLLM version and the package files' mtimes.

`PlatformInfo.detect()` answers "how many GPUs, how big" from nvidia-smi (or torch as a fallback)
without importing vLLM; the matrix uses it to exclude cells the machine cannot hold.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

_REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE_DIR = Path(os.environ.get("PD_ACCURACY_CACHE_DIR", "~/.cache/pd-accuracy")).expanduser()
PROBE_TIMEOUT_S = 300.0


class VllmNotInstalled(RuntimeError):
    """No importable `vllm` package in this interpreter."""


@dataclass(frozen=True)
class VllmFeatures:
    """Capabilities of the installed vLLM, as read from the package itself."""

    version: str
    platform: str                         # "cpu" | "cuda" (vLLM's current_platform.device_type)
    attention_backend_flag: bool          # EngineArgs has `attention_backend` (--attention-backend)
    attention_backend_env: bool           # vllm.envs knows VLLM_ATTENTION_BACKEND
    v2_runner_env: bool                   # vllm.envs knows VLLM_USE_V2_MODEL_RUNNER
    kv_roles: tuple[str, ...]             # accepted KVTransferConfig.kv_role values
    nixl_available: bool                  # NIXL's python agent imports
    attention_backends: tuple[str, ...] = ()  # AttentionBackendEnum member names, when known

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "VllmFeatures":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("kv_roles", "attention_backends"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    def attention_backend_setting(self, backend: str) -> tuple[list[str], dict[str, str]]:
        """(argv, env) that select `backend` on this vLLM: the CLI flag where it exists,
        else the legacy environment variable."""
        if self.attention_backend_flag:
            return ["--attention-backend", backend], {}
        if self.attention_backend_env:
            return [], {"VLLM_ATTENTION_BACKEND": backend}
        raise RuntimeError(f"vLLM {self.version} has neither --attention-backend nor VLLM_ATTENTION_BACKEND")


# ---- branching logic (pure; unit-tested with fakes) -----------------------------------------

def _literal_values(annotation: Any) -> list[Any]:
    """All Literal values and Enum members reachable in a type (through Optional/Union/nesting)."""
    found: list[Any] = []
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        for arg in typing.get_args(annotation):
            found.extend(_literal_values(arg) if typing.get_origin(arg) is not None else [arg])
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        found.extend(annotation)
    elif origin is not None:
        for arg in typing.get_args(annotation):
            found.extend(_literal_values(arg))
    return found


def _field_type(cls: type, name: str) -> Any:
    """Resolved type annotation of `cls.name`, or None when it cannot be resolved."""
    try:
        return typing.get_type_hints(cls).get(name)
    except Exception:  # noqa: BLE001 - forward refs to optional deps; fall back to raw annotation
        for klass in getattr(cls, "__mro__", (cls,)):
            raw = getattr(klass, "__annotations__", {}).get(name)
            if raw is not None and not isinstance(raw, str):
                return raw
        return None


def _has_field(cls: type, name: str) -> bool:
    if dataclasses.is_dataclass(cls):
        return any(f.name == name for f in dataclasses.fields(cls))
    return hasattr(cls, name) or any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__)


def _known_env_names(envs_module: Any) -> set[str]:
    names = set(getattr(envs_module, "environment_variables", {}) or {})
    try:
        names.update(n for n in dir(envs_module) if n.startswith("VLLM_"))
    except Exception:  # noqa: BLE001 - a module-level __dir__ could raise
        pass
    return names


def features_from_modules(
    *,
    version: str,
    device_type: str,
    engine_args_cls: type,
    envs_module: Any,
    kv_transfer_config_cls: type,
    kv_transfer_module: Any = None,
    nixl_available: bool,
) -> VllmFeatures:
    """Derive VllmFeatures from vLLM's objects (real ones in the probe, fakes in tests)."""
    env_names = _known_env_names(envs_module)
    role_type = getattr(kv_transfer_module, "KVRole", None) if kv_transfer_module else None
    if role_type is None:
        role_type = _field_type(kv_transfer_config_cls, "kv_role")
    kv_roles = tuple(dict.fromkeys(v for v in _literal_values(role_type) if isinstance(v, str)))
    backend_type = _field_type(engine_args_cls, "attention_backend")
    backends = tuple(m.name for m in _literal_values(backend_type) if isinstance(m, enum.Enum))
    return VllmFeatures(
        version=version,
        platform="cuda" if device_type == "cuda" else device_type,
        attention_backend_flag=_has_field(engine_args_cls, "attention_backend"),
        attention_backend_env="VLLM_ATTENTION_BACKEND" in env_names,
        v2_runner_env="VLLM_USE_V2_MODEL_RUNNER" in env_names,
        kv_roles=kv_roles,
        nixl_available=nixl_available,
        attention_backends=backends,
    )


def _probe() -> dict[str, Any]:
    """Runs inside the child interpreter: import vLLM and read its capabilities."""
    import vllm.envs as envs
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    try:
        import importlib

        nixl_available = hasattr(importlib.import_module("nixl._api"), "nixl_agent")
    except Exception:  # noqa: BLE001 - any failure to load the agent means "not usable"
        nixl_available = False
    features = features_from_modules(
        version=_installed_vllm_version() or getattr(sys.modules["vllm"], "__version__", "unknown"),
        device_type=str(current_platform.device_type),
        engine_args_cls=EngineArgs,
        envs_module=envs,
        kv_transfer_config_cls=KVTransferConfig,
        kv_transfer_module=sys.modules.get(KVTransferConfig.__module__),
        nixl_available=nixl_available,
    )
    return features.to_dict()


# ---- cache + subprocess -------------------------------------------------------------------

def _installed_vllm_version() -> str | None:
    for dist in importlib.metadata.packages_distributions().get("vllm", []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _mtime_ns(module: str) -> int:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return 0
    origin = Path(spec.origin)
    return max(origin.stat().st_mtime_ns, origin.parent.stat().st_mtime_ns)


def cache_key() -> str:
    """Identity of the installed vLLM (+NIXL) without importing it."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmNotInstalled(f"no `vllm` package importable from {sys.executable}")
    ident = {
        "python": sys.executable,
        "vllm": _installed_vllm_version(),
        "vllm_mtime": _mtime_ns("vllm"),
        "nixl_mtime": _mtime_ns("nixl") if importlib.util.find_spec("nixl") else 0,
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return f"{ident['vllm']}-{digest}"


def _run_probe() -> dict[str, Any]:
    code = (
        "import json, sys; sys.path.insert(0, %r); "
        "from harness.vllm_features import _probe; "
        "print('PD_ACCURACY_FEATURES=' + json.dumps(_probe()))" % str(_REPO_ROOT)
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    for line in proc.stdout.splitlines():
        if line.startswith("PD_ACCURACY_FEATURES="):
            return json.loads(line.split("=", 1)[1])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
    raise RuntimeError(f"vLLM feature probe failed (rc={proc.returncode}): {tail[0]}")


def detect(use_cache: bool = True, cache_dir: str | os.PathLike[str] | None = None) -> VllmFeatures:
    """Capabilities of the vLLM installed in this interpreter (cached per version + mtime)."""
    key = cache_key()
    path = Path(cache_dir or DEFAULT_CACHE_DIR) / f"vllm-features-{key}.json"
    if use_cache and path.is_file():
        try:
            return VllmFeatures.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a corrupt or older-format cache file: probe again and overwrite it
    features = VllmFeatures.from_dict(_run_probe())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(features.to_dict(), indent=1, sort_keys=True))
    os.replace(tmp, path)
    return features


# ---- hardware -------------------------------------------------------------------------------

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


def _query_torch() -> list[GpuDevice]:
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


@dataclass(frozen=True)
class PlatformInfo:
    """The machine cells are expanded for. `vllm` is filled only when the caller probed it."""

    device: str = "cpu"                       # "cpu" | "cuda"
    gpu_count: int = 0
    gpu_names: tuple[str, ...] = ()
    gpu_memory_bytes: tuple[int, ...] = ()
    gpu_indices: tuple[int, ...] = ()         # physical indices (for CUDA_VISIBLE_DEVICES)
    vllm: VllmFeatures | None = None

    @classmethod
    def detect(cls, with_vllm: bool = False) -> "PlatformInfo":
        """GPUs from nvidia-smi (torch as fallback), honouring CUDA_VISIBLE_DEVICES."""
        found = query_nvidia_smi()
        if found is None:
            found = _query_torch()
        else:
            found = visible_devices(found, os.environ.get("CUDA_VISIBLE_DEVICES"))
        features = detect() if with_vllm else None
        return cls.from_devices(found, vllm=features)

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

    @classmethod
    def from_spec(cls, spec: str) -> "PlatformInfo":
        """A pretend machine for listing: "cpu", "cuda:8" or "cuda:8:141" (GiB per GPU)."""
        parts = spec.strip().lower().split(":")
        if parts == ["cpu"]:
            return cls()
        if parts[0] != "cuda" or len(parts) not in (2, 3) or not parts[1].isdigit():
            raise ValueError(f"platform spec {spec!r}: expected 'cpu', 'cuda:N' or 'cuda:N:GiB'")
        gib = float(parts[2]) if len(parts) == 3 else 80.0
        count = int(parts[1])
        return cls.from_devices(GpuDevice(i, "pretend", int(gib * 1024**3)) for i in range(count))

    def describe(self) -> str:
        if self.device == "cpu":
            return "cpu (no GPU)"
        names = sorted(set(self.gpu_names))
        return f"cuda: {self.gpu_count} GPU(s) {', '.join(names)}"
