"""The fork-start plugin: after vLLM's CPU platform has chosen `spawn`, the server's engine core
and workers fork (a stand-in platform class, then the real vllm.platforms.cpu where installed)."""
from __future__ import annotations

import os

import pytest

from harness.serve.plugins import fork_start
from harness.serve.server_spec import build_env
from server_specs import make_spec


class SpawningPlatform:
    """What vLLM's CpuPlatform does: a classmethod that forces spawn."""
    calls = 0

    @classmethod
    def check_and_update_config(cls, vllm_config):
        cls.calls += 1
        vllm_config["seen_by"] = cls.__name__
        os.environ[fork_start.METHOD_ENV] = "spawn"
        return "result"


def test_the_platform_still_runs_and_fork_wins(monkeypatch):
    monkeypatch.delenv(fork_start.METHOD_ENV, raising=False)
    platform = type("P", (SpawningPlatform,), {"calls": 0})
    assert fork_start.patch_platform(platform)
    config: dict = {}
    assert platform.check_and_update_config(config) == "result"
    assert platform.calls == 1 and config == {"seen_by": "P"}
    assert os.environ[fork_start.METHOD_ENV] == "fork"
    assert platform().check_and_update_config(config) == "result"   # through an instance too
    assert platform.calls == 2


def test_patching_twice_wraps_once(monkeypatch):
    monkeypatch.delenv(fork_start.METHOD_ENV, raising=False)
    platform = type("P", (SpawningPlatform,), {"calls": 0})
    fork_start.patch_platform(platform)
    first = platform.__dict__["check_and_update_config"]
    assert fork_start.patch_platform(platform)
    assert platform.__dict__["check_and_update_config"] is first
    platform.check_and_update_config({})
    assert platform.calls == 1


def test_a_platform_without_the_hook_is_left_alone():
    platform = type("Bare", (), {})
    assert not fork_start.patch_platform(platform)
    assert not hasattr(platform, "check_and_update_config")


def test_servers_do_not_fork_unless_a_cell_asks():
    inherited = {fork_start.ENV: "1"}          # a parent shell's setting does not leak in
    for role in ("baseline", "prefill", "decode"):
        assert fork_start.ENV not in build_env(make_spec(role, "cpu"), base_env=inherited)
    opted_in = make_spec("decode", "cpu", extra_env=((fork_start.ENV, "1"),))
    assert build_env(opted_in, base_env={})[fork_start.ENV] == "1"


def test_real_vllm_cpu_platform_forks_after_the_patch(monkeypatch):
    cpu = pytest.importorskip("vllm.platforms.cpu")
    source = cpu.CpuPlatform.check_and_update_config.__func__.__code__
    assert fork_start.METHOD_ENV in source.co_consts or "spawn" in source.co_consts, (
        "vLLM's CPU platform no longer forces spawn: the plugin has nothing to undo")
    patched = type("CpuPlatformCopy", (cpu.CpuPlatform,), {})
    assert fork_start.patch_platform(patched)
    inner = patched.check_and_update_config.__func__.__wrapped__
    assert inner is cpu.CpuPlatform.check_and_update_config.__func__
