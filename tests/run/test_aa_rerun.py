"""The baseline's A/A re-run runs in the background (harness.run.evaluation.aa_rerun): it overlaps
the pair's start-up and first look, never another request to the baseline, and a look waits for
it."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.judge.verdict import Policy, fail
from harness.run.evaluation import stages
from harness.run.evaluation.aa_rerun import AAReruns, BaselineFailed, BaselineGate, finished
from harness.run.evaluation.cell_eval import noise_floor_for_look
from harness.run.evaluation.stages import BaselineRound, QuestionOrder, StagedRun
from tests.run.test_runner_flow import FakeDeployment, FakeRun, flow  # noqa: F401 - fixture


def test_the_gate_never_lets_two_baseline_evaluations_overlap():
    gate, inside, overlaps = BaselineGate(), [], []

    def evaluate(name):
        def body():
            inside.append(name)
            if len(inside) > 1:
                overlaps.append(tuple(inside))
            time.sleep(0.05)
            inside.remove(name)
            return name
        return body

    reruns = AAReruns(gate)
    aa = reruns.submit(evaluate("aa"))
    extra = [threading.Thread(target=gate, args=(evaluate(f"look{i}"),)) for i in range(3)]
    for t in extra:
        t.start()
    for t in extra:
        t.join()
    assert aa.result(timeout=5) == "aa"
    reruns.close()
    assert overlaps == []


def test_a_failing_rerun_is_the_baselines_failure():
    reruns = AAReruns(BaselineGate())

    def refused():
        raise ConnectionError("baseline went away")

    future = reruns.submit(refused)
    with pytest.raises(BaselineFailed, match="baseline A/A re-run failed: ConnectionError"):
        future.result(timeout=5)
    reruns.close()


def test_the_rerun_is_asked_while_the_pair_is_still_starting(flow):  # noqa: F811
    runner, events, _, _ = flow
    pair_waited = threading.Event()
    seen: list[bool] = []
    original_wait = FakeDeployment.wait

    def wait(self):
        if self.name != "baseline":
            pair_waited.set()
        return original_wait(self)

    def evaluate(self, endpoint, role, task, data_dir, concurrency=None, sample=None, limit=None):
        events.append(f"evaluate {role}")
        if role == "baseline-aa":   # the old, in-line re-run would make the pair wait for this
            seen.append(pair_waited.wait(timeout=10))
        return FakeRun()

    stages.EndpointAsker.__call__ = evaluate   # restored by the fixture's monkeypatch of it
    FakeDeployment.wait = wait
    try:
        runner.run([Cell(model="tiny", decode_block_size=16, prefill_block_size=16)])
    finally:
        FakeDeployment.wait = original_wait
    assert seen == [True]


class Answers:
    def __init__(self, n: int) -> None:
        self.n, self.wall_s = n, 1.0

    def extended(self, more: "Answers") -> "Answers":
        return Answers(self.n + more.n)

    def first(self, n: int) -> "Answers":
        return Answers(n)


class Progress:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def progress(self, line: str) -> None:
        self.lines.append(line)


def round_with(aa_rerun: "Future | None") -> BaselineRound:
    order = QuestionOrder.for_repeat(400, None, 0)
    return BaselineRound("run", order, StagedRun(lambda d, n: Answers(n), order), aa_rerun, None)


def test_while_the_rerun_runs_the_pair_answers_at_most_two_looks_ahead():
    release, asked = threading.Event(), []
    aa: Future = Future()

    def ask_pd(n):
        asked.append(n)
        if n == 200:
            release.set()

    # the A/A finishes only once the pair was asked two looks ahead; a third is never asked
    threading.Thread(target=lambda: release.wait(10) and time.sleep(0.2) is None
                     and aa.set_result("aa-run")).start()
    assert noise_floor_for_look(Progress().progress, round_with(aa), ask_pd, [100, 200, 400]) == "aa-run"
    assert asked == [100, 200]


def test_asking_ahead_stops_once_the_rerun_is_in():
    aa: Future = Future()
    asked: list[int] = []

    def ask_pd(n):
        asked.append(n)
        aa.set_result("aa-run")   # in while the first look ahead was answered

    assert noise_floor_for_look(Progress().progress, round_with(aa), ask_pd, [100, 200]) == "aa-run"
    assert asked == [100]


def test_a_finished_rerun_asks_nothing_ahead():
    asked: list[int] = []
    assert noise_floor_for_look(Progress().progress, round_with(finished("aa-run")), asked.append,
                                [100, 200]) == "aa-run"
    assert noise_floor_for_look(Progress().progress, round_with(None), asked.append, [100]) is None
    assert asked == []


def test_the_last_look_waits_without_asking_more():
    asked: list[int] = []
    aa: Future = Future()
    threading.Timer(0.05, lambda: aa.set_result("aa-run")).start()
    assert noise_floor_for_look(Progress().progress, round_with(aa), asked.append, []) == "aa-run"
    assert asked == []


def test_only_a_cell_expected_to_pass_is_asked_ahead():
    from harness.run.evaluation.cell_eval import looks_worth_asking_ahead

    clean = Cell(model="tiny")
    assert looks_worth_asking_ahead(clean, [100, 200]) == [100, 200]
    assert looks_worth_asking_ahead(Cell(model="tiny", fault="corrupt-block"), [100, 200]) == ()
    assert looks_worth_asking_ahead(Cell(model="tiny", expected_failure="upstream"), [100]) == ()
