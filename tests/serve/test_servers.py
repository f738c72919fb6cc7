"""Server command construction: argv and environment for baseline/prefill/decode, cpu and cuda."""
from __future__ import annotations

import json
import shlex

import pytest

from harness.serve.launch.server_spec import Features, ServerSpec, build_argv, build_env, render_command
from tests.server_specs import flag, make_spec

OLD_VLLM = Features(attention_backend_flag=False, v2_runner_env=False,
                    kv_roles=("kv_both",), kv_cache_memory_bytes_flag=False)


def spec(role: str = "baseline", device: str = "cpu", **kw) -> ServerSpec:
    return make_spec(role, device, gpu_backend="FLASHINFER", **kw)


def kv_config(argv: list[str]) -> dict | None:
    value = flag(argv, "--kv-transfer-config")
    return None if value is None else json.loads(value)


# ---- argv -----------------------------------------------------------------------------------
def test_baseline_argv_has_core_flags_and_no_connector():
    argv = build_argv(spec("baseline"))
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--model") == "/models/tiny"
    assert flag(argv, "--served-model-name") == "tiny"
    assert flag(argv, "--port") == "8100"
    assert flag(argv, "--block-size") == "128"
    assert flag(argv, "--host") == "127.0.0.1"
    assert kv_config(argv) is None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("role,kv_role", [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_pd_roles_and_buffer_device_in_kv_transfer_config(role, kv_role, device):
    argv = build_argv(spec(role, device, kv_buffer_device=device))
    assert kv_config(argv) == {"kv_connector": "NixlConnector", "kv_role": kv_role,
                               "kv_buffer_device": device}


def test_kv_buffer_device_can_differ_from_compute_device():
    cfg = kv_config(build_argv(spec("decode", "cuda", kv_buffer_device="cpu")))
    assert cfg["kv_buffer_device"] == "cpu"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_kv_both_fallback_when_directional_roles_are_unknown(role):
    features = Features(kv_roles=("kv_both",))
    assert kv_config(build_argv(spec(role), features))["kv_role"] == "kv_both"
    # one direction known, the other not
    partial = Features(kv_roles=("kv_producer", "kv_both"))
    expected = "kv_producer" if role == "prefill" else "kv_both"
    assert kv_config(build_argv(spec(role), partial))["kv_role"] == expected


def test_attention_backend_flag_or_env_per_features():
    s = spec("decode", "cuda")
    argv, env = build_argv(s), build_env(s, base_env={})
    assert flag(argv, "--attention-backend") == "FLASHINFER"
    assert "VLLM_ATTENTION_BACKEND" not in env

    argv, env = build_argv(s, OLD_VLLM), build_env(s, OLD_VLLM, base_env={})
    assert "--attention-backend" not in argv
    assert env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"


def test_kv_cache_bytes_flag_per_features():
    s = spec("baseline", kv_cache_bytes=512 * 2**20)
    assert flag(build_argv(s), "--kv-cache-memory-bytes") == str(512 * 2**20)
    assert "--kv-cache-memory-bytes" not in build_argv(s, OLD_VLLM)
    assert "--kv-cache-memory-bytes" not in build_argv(spec("baseline", kv_cache_bytes=None))


def test_gpu_memory_utilization_only_when_set():
    assert "--gpu-memory-utilization" not in build_argv(spec("baseline", "cuda"))
    argv = build_argv(spec("baseline", "cuda", gpu_memory_utilization=0.3))
    assert flag(argv, "--gpu-memory-utilization") == "0.3000"


def test_extra_args_are_appended_last():
    argv = build_argv(spec("decode", extra_args=("--enforce-eager", "--max-num-seqs", "4")))
    assert argv[-3:] == ["--enforce-eager", "--max-num-seqs", "4"]


def test_unknown_role_is_rejected():
    with pytest.raises(ValueError, match="unknown server role"):
        build_argv(spec("router"))


# ---- environment ----------------------------------------------------------------------------
@pytest.mark.parametrize("runner,value", [("v1", "0"), ("v2", "1")])
def test_v2_runner_env(runner, value):
    assert build_env(spec(runner=runner), base_env={})["VLLM_USE_V2_MODEL_RUNNER"] == value
    assert "VLLM_USE_V2_MODEL_RUNNER" not in build_env(spec(runner=runner), OLD_VLLM, base_env={})


def test_side_channel_port_only_on_pd_servers():
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in build_env(spec("baseline"), base_env={})
    for role in ("prefill", "decode"):
        env = build_env(spec(role, side_channel_port=5601), base_env={})
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"


def test_cpu_env_binds_threads_and_has_no_cuda_settings():
    env = build_env(spec("decode", cpu_cores="0-1"), base_env={})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    # a shape model's 1.5 GiB: 2 on CPU (whole GiB, rounded up: 1 preempted 16 requests)
    assert build_env(spec("decode", cpu_cores="0", kv_cache_bytes=3 << 29),
                     base_env={})["VLLM_CPU_KVCACHE_SPACE"] == "2"
    for key in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE"):
        assert key not in env
    assert "VLLM_CPU_OMP_THREADS_BIND" not in build_env(spec("decode"), base_env={})


def test_cuda_env_pins_gpus_and_turns_nvlink_multicast_off():
    env = build_env(spec("prefill", "cuda", gpu_ids=(2, 3), tp=2), base_env={})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"   # "auto" = mnnvl = multicast
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env


def test_cuda_env_keeps_nvlink_multicast_off_even_if_the_parent_turned_it_on():
    parent = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0",
              "NVSHMEM_DISABLE_NVLS": "0", "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "mnnvl"}
    env = build_env(spec("decode", "cuda", gpu_ids=(0,)), base_env=parent)
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"


def test_cpu_env_leaves_gpu_collectives_alone():
    env = build_env(spec("decode", "cpu"), base_env={})
    assert "VLLM_FLASHINFER_ALLREDUCE_BACKEND" not in env and "NCCL_NVLS_ENABLE" not in env


def test_hybrid_models_get_the_ds_conv_state_layout():
    assert build_env(spec("decode", hybrid=True), base_env={})["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in build_env(spec("decode"), base_env={})


@pytest.mark.parametrize("fault", ["corrupt-block", "swap-blocks"])
def test_server_fault_only_on_decode(fault):
    env = build_env(spec("decode", fault=fault, fault_block="last"), base_env={})
    assert env["PD_ACCURACY_FAULT"] == fault
    assert env["PD_ACCURACY_FAULT_BLOCK"] == "last"
    for role in ("prefill", "baseline"):
        assert "PD_ACCURACY_FAULT" not in build_env(spec(role, fault=fault), base_env={})


@pytest.mark.parametrize("role,fault", [
    ("baseline", None), ("prefill", "corrupt-block"), ("decode", None),
    ("decode", "drop-transfer"),   # a proxy fault: the decode server must run clean
])
def test_inherited_fault_env_is_removed(role, fault):
    parent = {"PD_ACCURACY_FAULT": "corrupt-block", "PD_ACCURACY_FAULT_BLOCK": "first",
              "PATH": "/usr/bin"}
    env = build_env(spec(role, fault=fault), base_env=parent)
    assert "PD_ACCURACY_FAULT" not in env
    assert env["PATH"] == "/usr/bin"          # the rest of the parent env is kept


def test_offline_env_and_extra_env_last():
    env = build_env(spec("decode", extra_env=(("VLLM_USE_V2_MODEL_RUNNER", "1"), ("X", "y"))),
                    base_env={})
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    # extra_env is applied after everything the harness sets, so it can override
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert env["X"] == "y"


def test_build_env_does_not_mutate_base_env():
    parent = {"PD_ACCURACY_FAULT": "swap-blocks"}
    build_env(spec("baseline"), base_env=parent)
    assert parent == {"PD_ACCURACY_FAULT": "swap-blocks"}


# ---- render_command -------------------------------------------------------------------------
@pytest.mark.parametrize("s", [
    spec("baseline"),
    spec("decode", "cuda", gpu_ids=(1,), kv_buffer_device="cuda", fault="corrupt-block",
         extra_args=("--override-generation-config", '{"a": "b c"}'),
         extra_env=(("VLLM_WEIRD", "a b'c"),)),
])
def test_render_command_is_a_valid_shell_line(s):
    line = render_command(s)
    words = shlex.split(line)
    argv = build_argv(s)
    assignments = words[:len(words) - len(argv)]
    assert words[len(assignments):] == argv
    env = dict(a.split("=", 1) for a in assignments)
    expected = build_env(s, base_env={})
    assert env and all(expected[k] == v for k, v in env.items())
    assert all(k.startswith(("VLLM_", "CUDA_VISIBLE_DEVICES", "PD_ACCURACY_")) for k in env)
    if s.role == "decode":
        assert env["PD_ACCURACY_FAULT"] == "corrupt-block"
        assert env["VLLM_WEIRD"] == "a b'c"
        assert json.loads(flag(words, "--kv-transfer-config"))["kv_role"] == "kv_consumer"


def test_internal_port_becomes_vllm_port_only_when_planned():
    assert build_env(spec("prefill", internal_port=25010), base_env={})["VLLM_PORT"] == "25010"
    assert "VLLM_PORT" not in build_env(spec("prefill"), base_env={})
    # a cell's own extra_env still wins
    env = build_env(spec("prefill", internal_port=25010, extra_env=(("VLLM_PORT", "30000"),)),
                    base_env={})
    assert env["VLLM_PORT"] == "30000"


def test_cuda_env_skips_the_flashinfer_sampler_unless_the_user_asks_for_it():
    # greedy decoding never samples; its warm-up JIT cost 80 s per cold server on the H200
    assert build_env(spec("decode", "cuda", gpu_ids=(0,)), base_env={})[
        "VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    env = build_env(spec("decode", "cuda", gpu_ids=(0,)),
                    base_env={"VLLM_USE_FLASHINFER_SAMPLER": "1"})
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in build_env(spec("decode", "cpu"), base_env={})
