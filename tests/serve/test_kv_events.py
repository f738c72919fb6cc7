"""The connector interface's events and the table of what each connector does its own way, on
stand-in connectors (no vLLM): which module serves which class, what the scheduler side hands
the worker, when ``sent`` / ``arrived`` / ``received`` fire and in which order."""
from __future__ import annotations

import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness.serve.plugins.kv_events import interface
from harness.connectors.example import in_server as example
from harness.connectors.mooncake import in_server as mooncake
from harness.connectors.nixl.in_server import kv_events as nixl
from harness.serve.plugins.kv_events.interface import KVView, Received, Sent

PLUGINS = Path(interface.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def events(monkeypatch):
    """Fresh listeners; each records (event, connector class, request id)."""
    monkeypatch.setattr(interface, "_listeners", {event: [] for event in interface.EVENTS})
    monkeypatch.setattr(interface, "build_view", lambda connector, caches: KVView(
        caches=caches, groups=[], layer_specs={}, kernel_block_size=16))
    seen: list[tuple] = []
    interface.subscribe("sent", lambda c, v, s: seen.append(("sent", s)))
    interface.subscribe("arrived", lambda c, v, r, fail: seen.append(("arrived", r.request_id)))
    interface.subscribe("received", lambda c, v, r: seen.append(("received", r)))
    return seen


def connector_class(name: str = "SomeConnector", **methods):
    """A class with KVConnectorBase_V1's methods only (``name`` picks its table entry)."""
    def request_finished(self, request, block_ids):
        return self.finish_result

    def get_transfer_results(self, finished_req_ids):   # as KVConnectorBase_V1's default
        sending, recving = self.get_finished(finished_req_ids)
        return types.SimpleNamespace(finished_sending=set(sending or ()),
                                     finished_recving=set(recving or ()), failed_recving=set())

    body = {
        "request_finished": request_finished,
        "get_num_new_matched_tokens": lambda self, request, n: (self.matched, True),
        "update_state_after_alloc": lambda self, request, blocks, n: None,
        "build_connector_meta": lambda self, scheduler_output: types.SimpleNamespace(
            **getattr(self, "meta_fields", {})),
        "register_kv_caches": lambda self, kv_caches: None,
        "bind_connector_metadata": lambda self, metadata: None,
        "get_finished": lambda self, ids: (set(), set(self.done)),
        "get_transfer_results": get_transfer_results,
        **methods}
    cls = type(name, (), body)
    interface.patch_connector_class(cls)
    return cls


def request(request_id, **fields):
    return types.SimpleNamespace(request_id=request_id, **fields)


# ---------------------------------------------------------------- the table

def test_the_table_serves_each_nixl_class_and_its_subclasses_and_nothing_else():
    for name in ("NixlConnector", "NixlPullConnector", "NixlPushConnector"):
        assert interface.specifics_for(type(name, (), {})) is nixl
    subclass = type("MyConnector", (type("NixlPushConnector", (), {}),), {})
    assert interface.specifics_for(subclass) is nixl
    assert interface.specifics_for(type("LMCacheConnectorV1", (), {})) is None
    assert interface.specifics_for(type("ExampleConnector", (), {})) is example
    assert interface.specifics_for(type("MooncakeConnector", (), {})) is mooncake


def test_generic_modules_do_not_name_a_connector():
    """Only a connector package's in_server may name one (grep -il nixl)."""
    found = subprocess.run(["grep", "-ril", "--include=*.py", "nixl", str(PLUGINS / "kv_events"),
                            str(PLUGINS / "kv_digest"), str(PLUGINS / "faults")],
                           capture_output=True, text=True).stdout.split()
    assert found == []


def test_the_per_server_ports_come_from_the_connector_modules():
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" in interface.per_server_env()


def test_importing_the_interface_imports_no_vllm():
    code = ("import sys, harness.serve.plugins.kv_events.interface as i; "
            "i.specifics_for(type('NixlConnector', (), {})); "
            "print(any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- the generic hooks

def test_a_send_rides_the_metadata_to_the_worker_bind(events):
    scheduler, worker = connector_class()(), None
    scheduler.finish_result = (True, None)
    scheduler.request_finished(request("p1", num_computed_tokens=40), [3, 4])
    scheduler.finish_result = (False, None)             # freed now: nothing to send
    scheduler.request_finished(request("p2", num_computed_tokens=40), [5])
    meta = scheduler.build_connector_meta(None)
    assert events == []                                 # nothing hashed on the scheduler
    worker = type(scheduler)()
    worker.register_kv_caches({})
    worker.bind_connector_metadata(meta)
    assert events == [("sent", Sent("p1", ((3, 4),), 40))]
    worker.bind_connector_metadata(scheduler.build_connector_meta(None))
    assert len(events) == 1                             # handed on once


def test_a_receive_is_announced_once_when_the_completion_reports_it(events):
    cls = connector_class()
    scheduler, worker = cls(), cls()
    scheduler.matched = 64
    decode = request("d1", kv_transfer_params={"remote_request_id": "p1"})
    scheduler.get_num_new_matched_tokens(decode, 32)     # a 32-token local prefix hit
    blocks = types.SimpleNamespace(get_unhashed_block_ids_all_groups=lambda: ([7, 8], [2]))
    scheduler.update_state_after_alloc(decode, blocks, 64)
    worker.register_kv_caches({})
    worker.bind_connector_metadata(scheduler.build_connector_meta(None))
    worker.done = set()
    worker.get_transfer_results(set())
    assert events == []
    worker.done = {"d1"}
    worker.get_transfer_results(set())   # its get_finished inside: announced once, not twice
    worker.get_transfer_results(set())
    assert events == [("received", Received("d1", "p1", ((7, 8), (2,)), 32, 64))]


def test_a_failed_receive_is_never_announced(events):
    def get_transfer_results(self, finished_req_ids):
        return types.SimpleNamespace(finished_sending=set(), finished_recving={"d1"},
                                     failed_recving={"d1"})

    cls = connector_class(get_transfer_results=get_transfer_results)
    scheduler, worker = cls(), cls()
    scheduler.matched = 16
    decode = request("d1", kv_transfer_params={})
    scheduler.get_num_new_matched_tokens(decode, 0)
    scheduler.update_state_after_alloc(
        decode, types.SimpleNamespace(get_block_ids=lambda: ([1],)), 16)
    worker.register_kv_caches({})
    worker.bind_connector_metadata(scheduler.build_connector_meta(None))
    assert worker.get_transfer_results(set()).failed_recving == {"d1"}
    assert events == [] and interface.state(worker)["plans"] == {}


def test_listeners_run_in_order_and_one_failing_stops_neither_the_next_nor_vllm(events, caplog):
    calls = []
    interface.subscribe("received", lambda c, v, r: calls.append("digest"), 90)
    interface.subscribe("received", lambda c, v, r: 1 / 0, 20)
    interface.subscribe("received", lambda c, v, r: calls.append("fault"), 10)
    cls = connector_class()
    scheduler, worker = cls(), cls()
    scheduler.matched = 16
    decode = request("d1", kv_transfer_params={})
    scheduler.get_num_new_matched_tokens(decode, 0)
    scheduler.update_state_after_alloc(decode, types.SimpleNamespace(get_block_ids=lambda: [4]), 16)
    worker.register_kv_caches({})
    worker.bind_connector_metadata(scheduler.build_connector_meta(None))
    worker.done = {"d1"}
    with caplog.at_level(logging.ERROR, logger="vllm.pd_accuracy"):
        assert worker.get_transfer_results(set()).finished_recving == {"d1"}
    assert calls == ["fault", "digest"] and "ZeroDivisionError" in caplog.text


def test_a_broken_hook_returns_the_connectors_own_result(caplog):
    cls = connector_class()
    scheduler = cls()
    scheduler.finish_result = ("not", "a", "pair")       # unpacking fails inside the hook
    with caplog.at_level(logging.ERROR, logger="vllm.pd_accuracy"):
        assert scheduler.request_finished(request("p1", num_computed_tokens=1), [1]) == (
            "not", "a", "pair")
    assert "request_finished hook failed" in caplog.text


def test_the_factory_hands_out_patched_classes_once():
    plain = type("SomeConnector", (), {"register_kv_caches": lambda self, kv_caches: None})

    class KVConnectorFactory:
        @classmethod
        def get_connector_class(cls, kv_transfer_config):
            return plain

    module = types.SimpleNamespace(KVConnectorFactory=KVConnectorFactory)
    interface._patch_factory(module)
    interface._patch_factory(module)
    assert KVConnectorFactory.get_connector_class(None) is plain
    wrapped = plain.register_kv_caches
    assert getattr(wrapped, "__pd_accuracy_kv_events__", False)
    KVConnectorFactory.get_connector_class(None)
    assert plain.register_kv_caches is wrapped


# ---------------------------------------------------------------- NIXL's own ways

def test_nixl_blocks_are_its_clipped_lists_from_its_params_and_metadata(events):
    """The prefill's blocks come from request_finished's kv_transfer_params, the decode's from
    its metadata's reqs_to_recv, not from the interface's (unclipped) arguments."""
    cls = connector_class("NixlPushConnector")
    scheduler = cls()
    scheduler.finish_result = (True, {"do_remote_prefill": True, "remote_block_ids": [[4]],
                                      "remote_num_tokens": 20})
    scheduler.request_finished(request("p1", num_computed_tokens=99), [[0, 4]])
    scheduler.matched = 32
    decode = request("d1", kv_transfer_params={"remote_request_id": "p1"})
    scheduler.get_num_new_matched_tokens(decode, 0)
    scheduler.update_state_after_alloc(
        decode, types.SimpleNamespace(get_block_ids=lambda: ([0, 9],)), 32)
    first = scheduler.build_connector_meta(None)
    assert first.pd_accuracy_recv == {}                 # not in reqs_to_recv yet: kept
    read = types.SimpleNamespace(local_block_ids=[[9]],
                                 remote=types.SimpleNamespace(request_id="p1-engine"))
    scheduler.meta_fields = {"reqs_to_recv": {"d1": read}}
    meta = scheduler.build_connector_meta(None)
    worker = cls()
    worker.connector_worker = types.SimpleNamespace()
    worker.register_kv_caches({})
    assert worker.connector_worker._pd_accuracy_connector is worker     # the read poll's link
    worker.bind_connector_metadata(first)
    worker.bind_connector_metadata(meta)
    worker.done = {"d1"}
    worker.get_transfer_results(set())
    assert events == [("sent", Sent("p1", ((4,),), 20)),
                      ("received", Received("d1", "p1-engine", ((9,),), 0, 32))]


def test_nixls_read_poll_announces_arrival_before_the_completion(events):
    class NixlBaseConnectorWorker:
        def __init__(self):
            self._recving_transfers = {"d1": [], "d2": []}

        def _pop_done_transfers(self, transfers):
            return set(transfers), set()

    nixl.patch_worker_class(NixlBaseConnectorWorker, interface.arrived)
    worker = NixlBaseConnectorWorker()
    connector = types.SimpleNamespace(connector_worker=worker)
    interface.state(connector)["plans"]["d1"] = Received("d1", None, ((1,),), 0, 16)
    nixl.link_worker(connector)
    assert worker._pop_done_transfers(worker._recving_transfers) == ({"d1", "d2"}, set())
    assert events == [("arrived", "d1")]            # d2: no plan, not the interface's
    worker._pop_done_transfers({"d1": []})          # a producer's sends: not an arrival
    assert events == [("arrived", "d1")]


def test_mooncake_gets_counters_over_its_own_statistics_and_a_class_with_its_own_keeps_them():
    base = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.base")
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    class MooncakeConnector(base.KVConnectorBase_V1):
        pass

    mooncake.extend(MooncakeConnector)
    registry = CollectorRegistry()

    def counter(**kw):
        return Counter(registry=registry, **kw)

    metrics = MooncakeConnector.build_prom_metrics(
        type("Cfg", (), {"kv_transfer_config": None})(),
        {Counter: counter, Gauge: Gauge, Histogram: Histogram}, ["engine"], {0: ["0"]})
    metrics.observe({"bytes_transferred": [100, 28], "transfer_duration": [0.1, 0.2],
                     "num_failed_recvs": [1]}, 0)
    sample = registry.get_sample_value
    assert sample("vllm:mooncake_bytes_transferred_total", {"engine": "0"}) == 128
    assert sample("vllm:mooncake_transfers_total", {"engine": "0"}) == 2
    assert sample("vllm:mooncake_num_failed_recvs_total", {"engine": "0"}) == 1

    class WithOwn(base.KVConnectorBase_V1):
        @classmethod
        def build_prom_metrics(cls, *args):
            return "own"

    mooncake.extend(WithOwn)
    assert WithOwn.build_prom_metrics() == "own"


def test_nixls_read_poll_of_vllm_026_returns_its_set_and_fails_the_026_way(events):
    """vLLM 0.26's poll returns only the done set and its ``_handle_failed_transfer`` takes
    (req_id, handle): on the H200 (2026-12-03) the 0.32-shaped unpack killed every engine core."""
    failed_calls = []

    class NixlBaseConnectorWorker:
        def __init__(self):
            self._recving_transfers = {"d1": []}

        def _pop_done_transfers(self, transfers):
            return set(transfers)

        def _handle_failed_transfer(self, req_id, handle):
            failed_calls.append((req_id, handle))

    nixl.patch_worker_class(NixlBaseConnectorWorker, interface.arrived)
    worker = NixlBaseConnectorWorker()
    connector = types.SimpleNamespace(connector_worker=worker)
    interface.state(connector)["plans"]["d1"] = Received("d1", None, ((1,),), 0, 16)
    nixl.link_worker(connector)
    assert worker._pop_done_transfers(worker._recving_transfers) == {"d1"}
    assert events == [("arrived", "d1")]
    nixl.report_failed(worker, "d1", None)
    assert failed_calls == [("d1", None)]


@pytest.mark.parametrize("name", ["MultiConnector", "OffloadingConnector",
                                  "SimpleCPUOffloadConnector"])
def test_a_wrapper_or_an_offloader_is_left_unhooked(name):
    """MultiConnector's children are hooked themselves; an offloader beside NIXL would report a
    second send of the same request's KV."""
    cls = type(name, (), {"request_finished": lambda self, *a: (False, None)})
    original = cls.request_finished
    interface.patch_connector_class(cls)
    assert cls.request_finished is original
    assert interface.specifics_for(cls).UNHOOKED


# ---------------------------------------------------------------- ExampleConnector (files)

def example_class():
    """A stand-in ExampleConnector: its step's metadata is vLLM's own ExampleConnectorMetadata,
    bound on the worker and read back through ``_get_connector_metadata``."""
    def bind(self, metadata):
        self.bound = metadata

    return connector_class(
        "ExampleConnector", bind_connector_metadata=bind,
        _get_connector_metadata=lambda self: self.bound,
        build_connector_meta=lambda self, scheduler_output: self.next_meta,
        get_num_new_matched_tokens=lambda self, request, n: (self.matched, False),
        wait_for_save=lambda self: None,
        start_load_kv=lambda self, forward_context, **kw: None)


def new_req(req_id, tokens, blocks):
    return types.SimpleNamespace(req_id=req_id, prompt_token_ids=tokens, block_ids=(blocks,))


def test_example_saves_are_announced_after_the_forward_with_the_requests_they_save(events):
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
        ExampleConnectorMetadata)

    cls = example_class()
    scheduler, worker = cls(), cls()
    scheduler._kv_transfer_config = types.SimpleNamespace(is_kv_producer=True)
    meta = ExampleConnectorMetadata()
    # vLLM's build_connector_meta: p1 saved, p2 found already (nothing added), p3 saved
    first, third = list(range(300)), list(range(1000, 1130))
    meta.add_request(first, [4, 5, 6], 128, is_store=True, mm_hashes=[])
    meta.add_request(third, [9, 10], 128, is_store=True, mm_hashes=[])
    scheduler.next_meta = meta
    bound = scheduler.build_connector_meta(types.SimpleNamespace(scheduled_new_reqs=[
        new_req("p1", first, [4, 5, 6]), new_req("p2", list(range(500, 700)), [7, 8]),
        new_req("p3", third, [9, 10])]))
    worker.register_kv_caches({})
    worker.bind_connector_metadata(bound)
    worker.start_load_kv(types.SimpleNamespace(attn_metadata={}))
    assert events == []                                 # not before the forward wrote them
    worker.wait_for_save()
    assert events == [("sent", Sent("p1", ((4, 5, 6),), 256)),   # whole blocks of the prompt
                      ("sent", Sent("p3", ((9, 10),), 128))]


def test_example_saves_on_a_consumer_are_not_sends(events):
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
        ExampleConnectorMetadata)

    cls = example_class()
    decode = cls()
    decode._kv_transfer_config = types.SimpleNamespace(is_kv_producer=False)
    meta = ExampleConnectorMetadata()
    meta.add_request(list(range(300)), [1, 2, 3], 128, is_store=True, mm_hashes=[])
    decode.next_meta = meta
    decode.bind_connector_metadata(decode.build_connector_meta(types.SimpleNamespace(
        scheduled_new_reqs=[new_req("d1", list(range(300)), [1, 2, 3])])))
    decode.register_kv_caches({})
    decode.wait_for_save()
    assert events == []


def test_example_loads_are_announced_when_start_load_kv_wrote_them(events):
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
        ExampleConnectorMetadata)

    cls = example_class()
    scheduler, worker = cls(), cls()
    scheduler._block_size, scheduler.matched = 128, 256
    decode = request("d1")                               # no params: it matched by prompt hash
    scheduler.get_num_new_matched_tokens(decode, 128)    # a one-block local prefix hit
    # a synchronous load: vLLM hashed the loaded full blocks on allocation, the tail's is not
    scheduler.update_state_after_alloc(decode, types.SimpleNamespace(
        get_block_ids=lambda: ([3, 4, 5, 6],),
        get_unhashed_block_ids_all_groups=lambda: ([6],)), 256)
    scheduler.next_meta = ExampleConnectorMetadata()
    bound = scheduler.build_connector_meta(types.SimpleNamespace(scheduled_new_reqs=[]))
    worker.register_kv_caches({})
    worker.bind_connector_metadata(bound)
    worker.start_load_kv(types.SimpleNamespace(attn_metadata=None))   # vLLM loads nothing then
    assert events == []
    worker.start_load_kv(types.SimpleNamespace(attn_metadata={}))
    worker.start_load_kv(types.SimpleNamespace(attn_metadata={}))     # once
    assert events == [("received", Received("d1", None, ((4, 5, 6),), 128, 256))]


def test_example_reads_what_vllms_example_connector_has():
    """The names the example package's in_server reads exist in the installed vLLM's connector."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_connector as upstream

    for name in ("wait_for_save", "start_load_kv", "build_connector_meta",
                 "_get_connector_metadata"):
        assert callable(getattr(upstream.ExampleConnector, name)), name
    meta = upstream.ReqMeta.make_meta(list(range(300)), [1, 2, 3], 128, True, [])
    assert (len(meta.token_ids), len(meta.slot_mapping), meta.is_store) == (256, 256, True)
    assert interface.gives_arrival(type("ExampleConnector", (), {})()) is False
