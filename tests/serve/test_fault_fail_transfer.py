"""The fail-transfer canary: on the interface's ``arrived`` event, through the NIXL module's read
poll (fake workers for the harness's own logic, and one run of vLLM 0.32's real
get_transfer_results, no server, no NIXL agent, to see its failure path take the request)."""
from __future__ import annotations

import logging
import queue
import types

import pytest

from harness.run.evidence.transfer_evidence import count_fault_lines
from harness.serve.plugins.faults import fail_transfer, wrong_drafts
from harness.protocol import faults as fault_spec
from harness.serve.plugins.faults import decode as faults
from harness.protocol.faults import (BY_REQUEST, FAIL_TRANSFER, FaultSpec,
                                     request_tag_for)
from harness.serve.plugins.kv_events import interface
from harness.connectors.nixl.in_server import kv_events as nixl
from harness.serve.plugins.kv_events.interface import Received
from harness.serve.proxy.hops import new_request_id, tag_for

BY_REQUEST_SPEC = FaultSpec(BY_REQUEST)


def engine_id(proxy_id: str) -> str:
    """What vLLM's worker calls the request: the proxy's X-Request-Id inside its own id."""
    return f"cmpl-{proxy_id}-0"


TAGGED_PROXY_ID = new_request_id(request_tag_for(FAIL_TRANSFER))   # the proxy's record
CLEAN_PROXY_ID = new_request_id()
TAGGED, CLEAN = engine_id(TAGGED_PROXY_ID), engine_id(CLEAN_PROXY_ID)
OTHER_CANARY = engine_id(new_request_id(request_tag_for("corrupt-block")))


# ---------------------------------------------------------------- the fault's name and tag

def test_fail_transfer_is_a_server_fault_with_a_request_tag():
    from harness.core.cell import FAULTS
    from harness.serve.launch.server_spec import SERVER_FAULTS

    assert FAIL_TRANSFER in fault_spec.FAULT_KINDS and FAIL_TRANSFER in FAULTS
    assert FAIL_TRANSFER in SERVER_FAULTS and FAIL_TRANSFER not in fault_spec.KV_FAULT_KINDS
    assert fault_spec.parse_fault_env({fault_spec.FAULT_ENV: FAIL_TRANSFER}).kind == FAIL_TRANSFER
    tag = request_tag_for(FAIL_TRANSFER, ((fault_spec.SHARE_ENV, "0.15"),))
    tagged = [t for t in (tag_for(tag, {"prompt": f"q{i}"}) for i in range(400)) if t]
    assert 0.08 < len(tagged) / 400 < 0.22
    assert fault_spec.parse_request_fault(engine_id(new_request_id(tagged[0]))).kind == FAIL_TRANSFER


@pytest.mark.parametrize("request_id,spec,wanted", [
    (TAGGED, BY_REQUEST_SPEC, True),
    (CLEAN, BY_REQUEST_SPEC, False),
    (OTHER_CANARY, BY_REQUEST_SPEC, False),          # a KV canary's request: not this hook's
    (CLEAN, FaultSpec(FAIL_TRANSFER), True),         # per-server mode: every request
    (TAGGED, FaultSpec("corrupt-block"), False),
], ids=["tagged-by-request", "clean-by-request", "other-canary-by-request", "clean-per-server",
        "tagged-kv-fault"])   # stable ids: the request ids are random, pytest-xdist compares ids
def test_which_requests_fail(request_id, spec, wanted):
    assert fail_transfer.wants_failure(request_id, spec) is wanted


# ---------------------------------------------------------------- a fake worker

class FakeStats:
    def __init__(self):
        self.failed = 0

    def record_failed_transfer(self):
        self.failed += 1


@pytest.fixture(autouse=True)
def no_listeners(monkeypatch):
    monkeypatch.setattr(interface, "_listeners", {event: [] for event in interface.EVENTS})


def make_worker_class(with_vllm_failure_path: bool = True, spec: FaultSpec = BY_REQUEST_SPEC):
    """A class like vLLM 0.32's NIXL worker: every handle of `_recving_transfers` is DONE; its
    read poll wrapped by the NIXL module, fail-transfer listening on ``arrived``."""
    class NixlBaseConnectorWorker:
        def __init__(self, transfers: dict):
            self._recving_transfers = transfers
            self.xfer_stats = FakeStats()
            self.logged: list[str] = []

        def _pop_done_transfers(self, transfers):
            done, failed = set(), set()
            for req_id, handles in list(transfers.items()):
                if "ERR" in handles:
                    failed.add(req_id)
                done.add(req_id)
                del transfers[req_id]
            return done, failed

    if with_vllm_failure_path:
        def _log_failure(self, failure_type, req_id, msg="", **context):
            self.logged.append(f"{failure_type} {req_id} {msg}")

        def _handle_failed_transfer(self, req_id, handle, failed_req_ids=None,
                                    record_failed_transfer=True):
            assert handle is None
            if record_failed_transfer:
                self.xfer_stats.record_failed_transfer()
            failed_req_ids.add(req_id)
            return True

        NixlBaseConnectorWorker._log_failure = _log_failure
        NixlBaseConnectorWorker._handle_failed_transfer = _handle_failed_transfer
    assert nixl.patch_worker_class(NixlBaseConnectorWorker, interface.arrived)
    assert not nixl.patch_worker_class(NixlBaseConnectorWorker, interface.arrived)  # once
    interface.subscribe("arrived", fail_transfer.make_on_arrived(spec))
    return NixlBaseConnectorWorker


def connect(worker, plans: dict):
    """The worker's connector, holding the plans of the reads it awaits (block ids per group)."""
    connector = types.SimpleNamespace(connector_worker=worker)
    for request_id, groups in plans.items():
        interface.state(connector)["plans"][request_id] = Received(
            request_id, None, tuple(tuple(g) for g in groups), 0, 8)
    nixl.link_worker(connector)
    return worker


def test_tagged_reads_are_reported_failed_and_counted_once_each(caplog, tmp_path):
    broken = engine_id(new_request_id(request_tag_for(FAIL_TRANSFER)))
    transfers = {TAGGED: [1], CLEAN: [2], OTHER_CANARY: [3], broken: ["ERR"]}
    worker = connect(make_worker_class()(transfers), {
        TAGGED: [[4, 5]], CLEAN: [[6]], OTHER_CANARY: [[7]], broken: [[8]]})
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        done, failed = worker._pop_done_transfers(worker._recving_transfers)
    assert done == {TAGGED, CLEAN, OTHER_CANARY, broken}
    assert failed == {TAGGED, broken}            # the really failed one stays failed, once
    assert worker.xfer_stats.failed == 1         # what vLLM counts into nixl_num_failed_transfers
    assert worker.logged == [f"transfer_failed {TAGGED} {nixl.FAIL_REASON}"]
    [line] = fault_spec.parse_fault_log(caplog.text)
    assert (line.applied, line.kind, line.request_id, line.block_ids, line.num_layers) == (
        True, FAIL_TRANSFER, TAGGED, ((4, 5),), 0)
    log = tmp_path / "decode-0.log"
    log.write_text(caplog.text)
    # what the harness counts: the canary's own requests, and 0 for the clean cell's
    assert count_fault_lines([str(log)], [TAGGED_PROXY_ID]) == 1
    assert count_fault_lines([str(log)], [CLEAN_PROXY_ID]) == 0


def test_only_the_receive_side_is_touched():
    worker = connect(make_worker_class(spec=FaultSpec(FAIL_TRANSFER))({}), {TAGGED: [[1]]})
    sending = {TAGGED: [1]}                      # a push-mode producer polls another dict
    assert worker._pop_done_transfers(sending) == ({TAGGED}, set())
    assert worker.xfer_stats.failed == 0


def test_without_vllms_failure_helper_the_stat_is_still_counted(caplog):
    worker = connect(make_worker_class(False, FaultSpec(FAIL_TRANSFER))({CLEAN: [1]}),
                     {CLEAN: [[3]]})
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        assert worker._pop_done_transfers(worker._recving_transfers) == ({CLEAN}, {CLEAN})
    assert worker.xfer_stats.failed == 1
    assert [line.applied for line in fault_spec.parse_fault_log(caplog.text)] == [True]


def test_a_broken_worker_gives_a_skipped_line_never_an_exception(caplog):
    worker = connect(make_worker_class(False, FaultSpec(FAIL_TRANSFER))({CLEAN: [1]}),
                     {CLEAN: [[3]]})
    worker.xfer_stats = None                     # record_failed_transfer raises AttributeError
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        assert worker._pop_done_transfers(worker._recving_transfers) == ({CLEAN}, set())
    [line] = fault_spec.parse_fault_log(caplog.text)
    assert not line.applied and line.reason == "AttributeError"


def test_a_connector_without_a_read_moment_is_reported_not_armed(caplog):
    generic = type("SomeOtherConnector", (), {})()
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        fail_transfer.on_registered(generic, None)
    assert "connector SomeOtherConnector has no read moment" in caplog.text
    assert "fail-transfer NOT armed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        fail_transfer.on_registered(type("NixlPushConnector", (), {})(), None)
    assert "NOT armed" not in caplog.text and "connector=NixlPushConnector" in caplog.text


def test_the_kv_hook_leaves_fail_transfer_requests_alone(monkeypatch):
    """By-request arms both; the KV fault must never corrupt (or swap) a fail-transfer request,
    even one whose failure a broken fail-transfer hook did not report."""
    applied = []
    monkeypatch.setattr(faults, "apply_fault", lambda *args: applied.append(args))
    faults.make_on_received(BY_REQUEST_SPEC)(None, object(), Received(TAGGED, None, ((1,),), 0, 8))
    assert applied == []


@pytest.mark.parametrize("mode,kv_hooks,fail_hook", [
    (BY_REQUEST, True, True), (FAIL_TRANSFER, False, True), ("corrupt-block", True, False)])
def test_register_arms_the_hooks_of_the_mode(monkeypatch, mode, kv_hooks, fail_hook):
    import wrapt

    hooks: list[str] = []
    monkeypatch.setattr(wrapt, "register_post_import_hook", lambda hook, name: hooks.append(name))
    monkeypatch.setattr(interface, "_installed", False)
    monkeypatch.setattr(faults.register, "done", False)
    monkeypatch.setenv(fault_spec.FAULT_ENV, mode)
    faults.register()
    # by-request also arms wrong-drafts on either model runner's proposer (tagged requests)
    runner = ([wrong_drafts.RUNNER_MODULE, wrong_drafts.RUNNER_V2_MODULE] if mode == BY_REQUEST
              else [])
    assert hooks == [interface.FACTORY_MODULE, *runner]
    assert len(interface._listeners["received"]) == int(kv_hooks)
    assert len(interface._listeners["arrived"]) == int(fail_hook)


# ---------------------------------------------------------------- vLLM 0.32's own failure path

def test_vllms_get_transfer_results_fails_the_tagged_request():
    """vLLM's real _pop_done_transfers, _handle_failed_transfer, get_transfer_results and
    get_block_ids_with_load_errors on a worker without NIXL: the tagged request comes out in
    failed_recving with its blocks invalid and one failed transfer counted; the clean one is
    received normally."""
    base_worker = pytest.importorskip(nixl.WORKER_MODULE)
    stats_module = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats")
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import ReqMeta, RemoteMeta

    class Nixl:
        def check_xfer_state(self, handle):
            return "DONE"

        def get_xfer_telemetry(self, handle):
            return None

        def release_xfer_handle(self, handle):
            pass

        def check_remote_metadata(self, agent):
            return True

    real_poll = base_worker.NixlBaseConnectorWorker._pop_done_transfers

    class Worker(base_worker.NixlBaseConnectorWorker):
        # vLLM's own poll, also when an earlier test of this process patched vLLM's class
        _pop_done_transfers = getattr(real_poll, "__wrapped__", real_poll)

        def __init__(self, metadata):
            self.engine_id, self.tp_rank, self.nixl_wrapper = "decode", 0, Nixl()
            self.transfer_topo = object()
            self.xfer_stats = stats_module.NixlKVConnectorStats()
            self._recving_metadata = metadata
            self._recving_transfers = {req_id: [i] for i, req_id in enumerate(metadata)}
            self._recv_failures, self._replicated_pcp_done_sending = set(), set()
            self._failed_recv_reqs, self._invalid_block_ids = queue.Queue(), queue.Queue()
            self._pending_recv_notifs, self._failed_remote_engines = {}, set()
            self._is_hma_required, self.use_host_buffer = False, False
            self.notified: list[str] = []

        def _get_new_notifs(self):
            return set()

        def _send_pending_recv_notifs(self, req_id):
            self.notified.append(req_id)

        def _zero_region_blocks(self, block_ids):
            pass

        def _sync_device_after_direct_recv(self, done_recving):
            pass

        def _reap_expired_send_leases(self, done_sending):
            pass

        def _cleanup_remote_engines(self):
            pass

        def shutdown(self):
            pass

        def __del__(self):  # vLLM's calls shutdown() through contextlib, gone at exit
            pass

    def req_meta(blocks):
        remote = RemoteMeta(block_ids=[blocks], host="127.0.0.1", port=1, engine_id="prefill",
                            request_id="r")
        return ReqMeta(local_block_ids=[blocks], local_physical_block_ids=[blocks], tp_size=1,
                       remote=remote, region_blocks_to_zero=[])

    assert nixl.patch_worker_class(Worker, interface.arrived)  # the subclass only
    interface.subscribe("arrived", fail_transfer.make_on_arrived(BY_REQUEST_SPEC))
    worker = connect(Worker({TAGGED: req_meta([4, 5]), CLEAN: req_meta([6])}),
                     {TAGGED: [[4, 5]], CLEAN: [[6]]})
    results = worker.get_transfer_results()
    assert results.finished_recving == {TAGGED, CLEAN}
    assert results.failed_recving == {TAGGED}
    assert worker.get_block_ids_with_load_errors() == {4, 5}
    assert len(worker.xfer_stats.data["num_failed_transfers"]) == 1
    assert worker.notified == [CLEAN]            # the clean request's KV post-processing ran
    assert worker._failed_remote_engines == {"prefill"}   # vLLM's own bookkeeping, as for ERR
