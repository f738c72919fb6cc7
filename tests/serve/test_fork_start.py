"""The fork-start plugin: after vLLM's CPU platform has chosen `spawn`, the server's engine core
and workers fork (a stand-in platform class, then the real vllm.platforms.cpu where installed)."""
from __future__ import annotations

import os

import pytest

from harness.serve.plugins.startup import fork_start
from harness.serve.launch.server_spec import build_env, cpu_affinity
from tests.server_specs import make_spec


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


def test_pinned_tp1_cpu_servers_fork_and_nothing_else_does():
    inherited = {fork_start.ENV: "1"}          # a parent shell's setting does not leak in
    for role in ("baseline", "prefill", "decode"):
        pinned = make_spec(role, "cpu", cpu_cores="1")
        assert cpu_affinity(pinned) == {1}
        assert build_env(pinned, base_env={})[fork_start.ENV] == "1"
        unplaced = make_spec(role, "cpu")           # no core: nothing would pin its workers
        assert fork_start.ENV not in build_env(unplaced, base_env=inherited)
        tp2 = make_spec(role, "cpu", tp=2, cpu_cores="0|1")   # each rank binds its own core
        assert cpu_affinity(tp2) == {0, 1}
        assert fork_start.ENV not in build_env(tp2, base_env=inherited)
        gpu = make_spec(role, "cuda")
        assert cpu_affinity(gpu) is None and fork_start.ENV not in build_env(gpu, base_env=inherited)


def test_core_lists_parse_like_vllm_binds_them():
    assert cpu_affinity(make_spec("decode", "cpu", cpu_cores="0-3")) == {0, 1, 2, 3}
    assert cpu_affinity(make_spec("decode", "cpu", cpu_cores="0,2|5")) == {0, 2, 5}


def test_a_pinned_server_is_started_on_its_cores_only(tmp_path):
    # the real launch path: ManagedProcess applies the spec's affinity before exec, so the
    # child and a grandchild it forks (vLLM's engine core and worker) are confined
    import sys

    from harness.serve.supervision.process import ManagedProcess

    core = sorted(os.sched_getaffinity(0))[-1]
    script = tmp_path / "fork_and_report.py"
    script.write_text("import os\npid = os.fork()\n"
                      "if pid == 0: print(sorted(os.sched_getaffinity(0)), flush=True); os._exit(0)\n"
                      "os.waitpid(pid, 0); print(sorted(os.sched_getaffinity(0)), flush=True)\n")
    log = tmp_path / "child.log"
    spec = make_spec("decode", "cpu", cpu_cores=str(core))
    with ManagedProcess("pinned", [sys.executable, str(script)], log,
                        cpu_affinity=cpu_affinity(spec)) as proc:
        proc._popen.wait(30)
    lines = [ln for ln in log.read_text().splitlines() if not ln.startswith("===")]
    assert lines == [str([core])] * 2, lines


def test_real_vllm_cpu_platform_forks_after_the_patch(monkeypatch):
    cpu = pytest.importorskip("vllm.platforms.cpu")
    source = cpu.CpuPlatform.check_and_update_config.__func__.__code__
    assert fork_start.METHOD_ENV in source.co_consts or "spawn" in source.co_consts, (
        "vLLM's CPU platform no longer forces spawn: the plugin has nothing to undo")
    patched = type("CpuPlatformCopy", (cpu.CpuPlatform,), {})
    assert fork_start.patch_platform(patched)
    inner = patched.check_and_update_config.__func__.__wrapped__
    assert inner is cpu.CpuPlatform.check_and_update_config.__func__


def test_cuda_tp1_servers_fork_their_engine_core_and_tp2_keep_spawn():
    # vLLM's CLI sets spawn unless the variable is set: the harness sets fork for TP1 on CUDA
    method = fork_start.METHOD_ENV
    for role in ("baseline", "prefill", "decode"):
        assert build_env(make_spec(role, "cuda"), base_env={})[method] == "fork"
        tp2 = build_env(make_spec(role, "cuda", tp=2), base_env={})
        assert method not in tp2
    # on CPU the platform overrides the variable anyway; the plugin restores fork there
    assert method not in build_env(make_spec("decode", "cpu", cpu_cores="1"), base_env={})
