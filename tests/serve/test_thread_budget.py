"""The CPU thread budget: the env build_env gives CPU servers, and the message-queue spin bound."""
from __future__ import annotations

import os
import time
import types

import pytest

from harness.serve.launch import thread_budget
from harness.serve.launch.server_spec import ServerSpec, build_env
from harness.serve.plugins.idle import mq_spin


def spec(**kw) -> ServerSpec:
    return ServerSpec(**{"role": "decode", "index": 0, "model_path": "/m", "served_model_name": "m",
                         "port": 8000, "backend": "CPU_ATTN", "block_size": 128, "cpu_cores": "1",
                         **kw})


def test_cpu_servers_get_the_budget_gpu_servers_do_not():
    for role in ("baseline", "prefill", "decode"):
        assert build_env(spec(role=role), base_env={})[mq_spin.ENV] == "100"
    gpu = build_env(spec(device="cuda", backend="FLASH_ATTN", gpu_ids=(0,)), base_env={})
    assert mq_spin.ENV not in gpu


def test_a_setting_from_the_parent_shell_wins():
    assert build_env(spec(), base_env={mq_spin.ENV: "500"})[mq_spin.ENV] == "500"
    env = {"X": "y"}
    thread_budget.apply(env)
    assert env == {"X": "y", **thread_budget.CPU_SERVER_ENV}


def test_sleep_parsing():
    assert mq_spin.parse_sleep_us({}) is None
    assert mq_spin.parse_sleep_us({mq_spin.ENV: " 250 "}) == 250
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError):
            mq_spin.parse_sleep_us({mq_spin.ENV: bad})


class FakeSpinCondition:
    """The shape of vLLM 0.32's shm_broadcast.SpinCondition that the patch relies on."""

    def __init__(self, is_reader: bool, busy_loop_s: float = 1) -> None:
        self.is_reader = is_reader
        self.last_read = time.monotonic()
        self.busy_loop_s = busy_loop_s if is_reader else 0
        self.blocked = 0

    def wait(self, timeout_ms=None):
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            os.sched_yield()
            return "yielded"
        self.blocked += 1
        return "blocked"


def fake_module():
    return types.SimpleNamespace(__name__="shm", SpinCondition=type(
        "SpinCondition", (FakeSpinCondition,), {}))


def test_readers_in_their_busy_window_sleep_also_those_built_before_the_patch():
    module = fake_module()
    early = module.SpinCondition(is_reader=True)
    assert mq_spin.patch_spin_condition(module, 2000)
    assert mq_spin.patch_spin_condition(module, 2000)          # idempotent
    late = module.SpinCondition(is_reader=True)
    for reader in (early, late):
        started = time.monotonic()
        assert reader.wait() is None                           # slept, did not yield
        assert time.monotonic() - started >= 0.002


def test_outside_the_busy_window_vllms_own_blocking_wait_runs():
    module = fake_module()
    mq_spin.patch_spin_condition(module, 100)
    idle = module.SpinCondition(is_reader=True, busy_loop_s=0.0)
    idle.last_read -= 1.0
    assert idle.wait() == "blocked" and idle.blocked == 1
    assert not mq_spin.patch_spin_condition(types.SimpleNamespace(__name__="other"), 100)
