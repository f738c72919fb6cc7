"""The compile-key plugin: a P/D server's NIXL side-channel port leaves vLLM's torch.compile
cache key, nothing else does (real vllm.envs where installed, a stand-in module otherwise)."""
from __future__ import annotations

import types

import pytest

from harness.serve.plugins.startup import compile_key
from harness.serve.launch.server_spec import build_env
from tests.server_specs import make_spec


def fake_envs(factors: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(compile_factors=lambda: dict(factors))


def test_only_the_side_channel_port_leaves_the_factors():
    envs = fake_envs({"VLLM_NIXL_SIDE_CHANNEL_PORT": 5601, "VLLM_KV_CACHE_LAYOUT": "NHD",
                      "VLLM_USE_V2_MODEL_RUNNER": True})
    assert compile_key.patch_envs(envs)
    assert envs.compile_factors() == {"VLLM_KV_CACHE_LAYOUT": "NHD",
                                      "VLLM_USE_V2_MODEL_RUNNER": True}


def test_patching_twice_wraps_once():
    envs = fake_envs({"VLLM_NIXL_SIDE_CHANNEL_PORT": 1, "A": 2})
    compile_key.patch_envs(envs)
    first = envs.compile_factors
    assert compile_key.patch_envs(envs) and envs.compile_factors is first


def test_a_vllm_without_compile_factors_is_left_alone():
    envs = types.SimpleNamespace()
    assert not compile_key.patch_envs(envs) and not hasattr(envs, "compile_factors")


def test_every_server_the_harness_starts_arms_it():
    for role in ("baseline", "prefill", "decode"):
        assert build_env(make_spec(role, "cpu"), base_env={})[compile_key.ENV] == "1"


def test_real_vllm_key_no_longer_depends_on_the_port(monkeypatch):
    envs = pytest.importorskip("vllm.envs")
    if not hasattr(envs, "compile_factors"):
        pytest.fail("this vLLM has no vllm.envs.compile_factors: the plugin does nothing here")
    monkeypatch.setattr(envs, "compile_factors", envs.compile_factors)  # undone after the test
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "5601")
    a = envs.compile_factors()
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "5602")
    assert envs.compile_factors() != a            # vLLM's own key: one per port
    compile_key.patch_envs(envs)
    b = envs.compile_factors()
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "5601")
    assert envs.compile_factors() == b and set(a) - set(b) == {
        "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_MOONCAKE_BOOTSTRAP_PORT"}   # each server's own port
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "NHD")   # a real factor still counts
    assert envs.compile_factors() != b
