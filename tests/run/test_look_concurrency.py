"""A look asks the P/D pair and the baseline at the same time
(harness.run.evaluation.cell_eval.both_up_to): each side's evaluation waits for the other to have
started, which only a concurrent look passes."""
from __future__ import annotations

import threading

import pytest

from harness.run.evaluation.cell_eval import both_up_to
from harness.run.evaluation.stages import QuestionOrder, StagedRun


class Answers:
    def __init__(self, n: int, wall_s: float = 1.0) -> None:
        self.n, self.wall_s = n, wall_s

    def extended(self, more: "Answers") -> "Answers":
        return Answers(self.n + more.n, self.wall_s + more.wall_s)

    def first(self, n: int) -> "Answers":
        return Answers(n, self.wall_s)


def staged(evaluate) -> StagedRun:
    return StagedRun(evaluate, QuestionOrder.for_repeat(400, None, 0))


def test_pd_and_baseline_questions_are_asked_together():
    both_started = threading.Barrier(2, timeout=10)
    asked = []

    def ask(role):
        def evaluate(docs, n):
            both_started.wait()           # BrokenBarrierError if the other side never starts
            asked.append((role, n))
            return Answers(n)
        return evaluate

    pd_run, base_run = both_up_to(staged(ask("pd")), staged(ask("baseline")), 50)
    assert (pd_run.n, base_run.n) == (50, 50)
    assert sorted(asked) == [("baseline", 50), ("pd", 50)]


def test_a_baseline_that_already_has_the_answers_is_not_asked_again():
    calls = []
    baseline = staged(lambda docs, n: calls.append(n) or Answers(n))
    both_up_to(staged(lambda docs, n: Answers(n)), baseline, 100)
    both_up_to(staged(lambda docs, n: Answers(n)), baseline, 100)   # the next cell of the group
    assert calls == [100]


def test_a_pd_failure_is_raised_after_the_baseline_finished():
    finished = []

    def pd_fails(docs, n):
        raise RuntimeError("decode died")

    def baseline(docs, n):
        finished.append(n)
        return Answers(n)

    with pytest.raises(RuntimeError, match="decode died"):
        both_up_to(staged(pd_fails), staged(baseline), 50)
    assert finished == [50]
