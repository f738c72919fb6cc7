"""The CPU thread budget: the env build_env gives CPU servers, and the message-queue spin bound."""
from __future__ import annotations

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
        assert build_env(spec(role=role), base_env={})[mq_spin.ENV] == "0"
    gpu = build_env(spec(device="cuda", backend="FLASH_ATTN", gpu_ids=(0,)), base_env={})
    assert mq_spin.ENV not in gpu


def test_a_setting_from_the_parent_shell_wins():
    assert build_env(spec(), base_env={mq_spin.ENV: "1"})[mq_spin.ENV] == "1"
    env = {"X": "y"}
    thread_budget.apply(env)
    assert env == {"X": "y", **thread_budget.CPU_SERVER_ENV}


def test_busy_loop_parsing():
    assert mq_spin.parse_busy_loop_s({}) is None
    assert mq_spin.parse_busy_loop_s({mq_spin.ENV: " 0.05 "}) == 0.05
    for bad in ("-1", "soon"):
        with pytest.raises(ValueError):
            mq_spin.parse_busy_loop_s({mq_spin.ENV: bad})


class FakeSpinCondition:
    """The shape of vLLM 0.32's shm_broadcast.SpinCondition that the patch relies on."""

    def __init__(self, is_reader: bool, busy_loop_s: float = 1) -> None:
        self.is_reader = is_reader
        self.busy_loop_s = busy_loop_s if is_reader else 0
        self.waited = 0

    def wait(self, timeout_ms=None):
        self.waited += 1
        return "spun" if self.busy_loop_s > 0 else "blocked"


def test_readers_stop_spinning_also_those_built_before_the_patch():
    module = types.SimpleNamespace(__name__="shm", SpinCondition=type(
        "SpinCondition", (FakeSpinCondition,), {}))
    early = module.SpinCondition(is_reader=True)
    assert mq_spin.patch_spin_condition(module, 0.0)
    assert mq_spin.patch_spin_condition(module, 0.0)          # idempotent
    late = module.SpinCondition(is_reader=True)
    assert early.wait() == late.wait() == "blocked"
    assert early.busy_loop_s == late.busy_loop_s == 0.0 and early.waited == 1


def test_a_lower_bound_already_there_is_kept_and_an_unknown_module_left_alone():
    module = types.SimpleNamespace(__name__="shm", SpinCondition=type(
        "SpinCondition", (FakeSpinCondition,), {}))
    reader = module.SpinCondition(is_reader=True, busy_loop_s=0.01)
    mq_spin.patch_spin_condition(module, 0.5)
    reader.wait()
    assert reader.busy_loop_s == 0.01
    assert not mq_spin.patch_spin_condition(types.SimpleNamespace(__name__="other"), 0.0)
