"""A weather cell's per-request rows, its plan, the load weather's proof that it blew, and the
early-release canary's lease clamp (no servers: the pieces, on synthetic records)."""
from __future__ import annotations

import datetime as dt
from dataclasses import replace

from harness.core.cell import Cell
from harness.weathers import resolved_params
from harness.eval.lmeval import EvalRun, QuestionRecord, _with_failure, prompt_hash
from harness.judge.sequential import SequentialPlan
from harness.judge.weather import DIFFERS, IDENTICAL, MISSING, InjectedEvent
from harness.run.weather.base import WeatherRun
from harness.weathers.load.driver import WEATHER as LOAD, cache_tokens, max_in_flight
from harness.run.weather_eval import client_status, request_rows, weather_plan, with_events
from harness.serve.plugins.faults import early_release
from harness.protocol.faults import (FaultSpec, parse_request_fault, request_tag_for)


def q(doc: int, error: str | None = None, correct: bool = True) -> QuestionRecord:
    return QuestionRecord(doc, prompt_hash(f"Q{doc}"), "4", "#### 4", "4", "4", correct, correct,
                          error=error)


def run(*questions: QuestionRecord) -> EvalRun:
    return EvalRun("pd", "u", "t", len(questions), 1.0, 1.0, 0.0, tuple(questions))


def test_failures_are_kept_per_question_and_never_correct():
    kept = _with_failure(q(1), {prompt_hash("Q1"): "HTTP 500 Internal Server Error"})
    assert kept.error == "HTTP 500 Internal Server Error" and not kept.correct
    assert _with_failure(q(2), {}) == q(2)
    errored = _with_failure(replace(q(3), finish_reason="error"), {})
    assert errored.error == 'finish_reason "error"'
    assert client_status(kept) == 500 and client_status(q(2)) == 200
    assert client_status(errored) == 200        # an error in a 200's body: still loud


def test_rows_join_questions_records_and_digests():
    records = [{"request_id": "pdacc-a", "prompt_hash": prompt_hash("Q1")},
               {"request_id": "pdacc-b", "prompt_hash": prompt_hash("Q2"), "error": "decode: x"},
               {"request_id": "pdacc-c", "prompt_hash": "orphan", "decode_status": None}]
    digests = {"pdacc-a": (IDENTICAL, ""), "pdacc-c": (DIFFERS, "block 1")}
    rows = request_rows(run(q(1), q(2, error="HTTP 500 x")), run(q(1), q(2, correct=False)),
                        records, digests)
    assert [(r.request_id, r.doc_id, r.status, r.digest) for r in rows] == [
        ("pdacc-a", 1, 200, IDENTICAL), ("pdacc-b", 2, 500, MISSING), ("pdacc-c", None, None, DIFFERS)]
    assert rows[0].answered and rows[0].baseline_correct and rows[0].answer == "4"
    assert rows[1].answer is None and rows[1].baseline_correct is False
    assert rows[2].error == "no answer reached the client"
    tagged = with_events(rows, (InjectedEvent("abort", "pdacc-b"),))
    assert [r.events for r in tagged] == [(), ("abort",), ()]


def test_the_first_look_asks_enough_for_the_weather():
    plan = SequentialPlan(stages=(50, 100, 200, 400))
    assert weather_plan(plan, 128).stages == (128, 200, 400)
    assert weather_plan(plan, None) is plan and weather_plan(plan, 50) is plan


def _record(start_s: float, ms: float) -> dict:
    at = dt.datetime(2026, 12, 3, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=start_s)
    return {"started_at": at.isoformat(), "prefill_ms": ms / 2, "decode_ms": ms / 2}


def test_load_proves_it_blew_from_logs_metrics_and_records(tmp_path):
    assert max_in_flight(tuple(_record(0.01 * i, 1000) for i in range(70))) == 70
    assert max_in_flight((_record(0, 100), _record(1, 100))) == 1
    log = "INFO [kv_cache_utils.py:2327] CPU KV cache size: 6,144 tokens, Maximum concurrency"
    assert cache_tokens(log) == 6144
    cell = Cell(model="m", weather="load")
    params = resolved_params("load", {})
    logs = {}
    for name in ("prefill-0", "decode-0"):
        (tmp_path / name).write_text(log)
        logs[name] = str(tmp_path / name)
    before = {s: {"vllm:kv_block_lifetime_seconds_count": 10.0} for s in logs}
    after = {"prefill-0": {"vllm:kv_block_lifetime_seconds_count": 10.0 + 48 * 5},
             "decode-0": {"vllm:kv_block_lifetime_seconds_count": 20.0}}
    records = tuple(_record(0.01 * i, 2000) for i in range(64))
    conds = {c.name: c for c in LOAD.conditions(WeatherRun(cell, params, (), records, before,
                                                            after, logs))}
    assert conds["kv-cache-blocks[prefill-0]"].passed
    assert conds["blocks-recycled[prefill-0]"].passed
    assert not conds["blocks-recycled[decode-0]"].passed
    assert "evicted 10 blocks for reuse = 0.2x" in conds["blocks-recycled[decode-0]"].detail
    assert conds["in-flight"].passed
    changes = LOAD.servers(cell, params)
    assert changes["decode"].num_blocks == 48 and changes["prefill"].prefix_caching
    assert LOAD.workload(cell, params).in_flight == 64


class FakeWorker:
    pass


def test_early_release_cuts_tagged_leases_and_undoes_extensions():
    tag = request_tag_for("early-release")
    assert parse_request_fault(f"cmpl-pdacc-{tag}abc") == FaultSpec("early-release")
    tagged, plain = f"cmpl-pdacc-{tag}abc-0", "cmpl-pdacc-def-0"
    worker, leases = FakeWorker(), {tagged: 130.0, plain: 130.0}
    assert early_release.clamp_leases(worker, leases, 0.5, now=100.0) == [tagged]
    assert leases == {tagged: 100.5, plain: 130.0}
    leases[tagged] = 120.0          # a heartbeat's extension
    assert early_release.clamp_leases(worker, leases, 0.5, now=100.2) == []
    assert leases[tagged] == 100.5
    del leases[tagged]              # released by vLLM's expiry path
    early_release.clamp_leases(worker, leases, 0.5, now=101.0)
    assert tagged not in worker._pd_accuracy_first_held


def test_the_lease_hook_wraps_the_reaper_once(monkeypatch):
    import sys
    import types

    from harness.connectors.nixl.in_server import kv_events as nixl

    calls = []

    class Worker:
        def _reap_expired_send_leases(self, done):
            calls.append(dict(self._reqs_to_send))

    module = types.ModuleType(nixl.WORKER_MODULE)
    setattr(module, nixl.WORKER_CLASS, Worker)
    monkeypatch.setitem(sys.modules, nixl.WORKER_MODULE, module)
    cut = early_release.make_cut(0.25)
    assert nixl.hold_leases(cut) and nixl.hold_leases(cut)    # the second: already wrapped
    tag = request_tag_for("early-release")
    w = Worker()
    w._reqs_to_send = {f"x-pdacc-{tag}1": 1e12}
    w._reap_expired_send_leases(set())
    assert len(calls) == 1 and list(calls[0].values())[0] < 1e12
    assert not early_release.arm({})


def test_on_vllm_026_the_lease_hook_wraps_get_finished_and_puts_cut_leases_first(monkeypatch):
    import sys
    import types

    from harness.connectors.nixl.in_server import kv_events as nixl

    class Worker:       # vLLM 0.26: the leases are reaped inline, oldest first, up to a live one
        def get_finished(self):
            import time
            done, now = set(), time.perf_counter()
            while self._reqs_to_send:
                req_id, expires = next(iter(self._reqs_to_send.items()))
                if now < expires:
                    break
                del self._reqs_to_send[req_id]
                done.add(req_id)
            return done, set()

    module = types.ModuleType(nixl.WORKER_MODULE)
    setattr(module, nixl.WORKER_CLASS, Worker)
    monkeypatch.setitem(sys.modules, nixl.WORKER_MODULE, module)
    assert nixl.hold_leases(early_release.make_cut(0.0))
    tag = request_tag_for("early-release")
    w = Worker()
    w._reqs_to_send = {"x-pdacc-plain": 1e12, f"x-pdacc-{tag}1": 1e12}   # a live lease first
    assert w.get_finished() == ({f"x-pdacc-{tag}1"}, set())
    assert list(w._reqs_to_send) == ["x-pdacc-plain"]


def test_preemption_shrinks_the_decode_only_and_proves_preemptions():
    from harness.weathers.preemption.driver import WEATHER as PREEMPTION

    cell = Cell(model="m", weather="preemption")
    params = resolved_params("preemption", {})
    assert set(PREEMPTION.servers(cell, params)) == {"decode"}
    before = {"decode-0": {"vllm:num_preemptions_total": 2.0}, "prefill-0": {}}
    for after, passed in ((5.0, True), (2.0, False)):
        run = WeatherRun(cell, params, (), (), before,
                         {"decode-0": {"vllm:num_preemptions_total": after}, "prefill-0": {}})
        (cond,) = PREEMPTION.conditions(run)
        assert cond.kind == "happened" and cond.passed is passed
    assert PREEMPTION.accounted_checks(params) == {}     # nothing waived: it injects nothing
