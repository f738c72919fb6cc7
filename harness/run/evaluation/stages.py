"""The questions of a sequential evaluation: which documents each look adds, and the baseline's
answers to them, extended on demand while its server stays up.

A cell is first judged on `limit` questions; an undecided cell is asked the next stage's
questions (harness.judge.sequential), both on its P/D pair and, once per baseline group, on the
baseline. Each repeat has one fixed order of the task's documents: the first documents in file
order (repeat 0 without --sample-seed, as a single-look run always was), else a seeded
permutation, so every look adds documents the earlier looks have not seen.
"""
from __future__ import annotations

import random
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.core.options import RunOptions
from harness.eval.lmeval import EvalRun, evaluate_endpoint
from harness.serve.deploy import Endpoint

# evaluate(doc_ids or None for "the first n", n) -> EvalRun
Evaluate = Callable[[list[int] | None, int], EvalRun]


@dataclass(frozen=True)
class QuestionOrder:
    """The order a repeat asks a task's documents in."""

    size: int | None               # documents in the task's test split (None: unknown, hub data)
    permutation: tuple[int, ...] | None = None   # None: file order

    @classmethod
    def for_repeat(cls, size: int | None, sample_seed: int | None, repeat: int) -> "QuestionOrder":
        if size is None or (sample_seed is None and repeat == 0):
            return cls(size)
        rng = random.Random(f"{sample_seed or 0}:{repeat}")
        return cls(size, tuple(rng.sample(range(size), size)))

    def docs(self, start: int, stop: int) -> list[int] | None:
        """Documents [start, stop) of this order; None means "lm-eval's first `stop`" (file
        order from the start, the cheapest request)."""
        if self.permutation is None and start == 0:
            return None
        if self.permutation is None:
            return list(range(start, stop))
        return sorted(self.permutation[start:stop])

    def capped(self, n: int) -> int:
        return n if self.size is None else min(n, self.size)


@dataclass
class StagedRun:
    """One endpoint's answers so far, in this order; `up_to(n)` asks what is missing."""

    evaluate: Evaluate
    order: QuestionOrder
    run: EvalRun | None = None
    asked: int = 0
    wall_s: float = field(default=0.0)

    def up_to(self, n: int) -> EvalRun:
        n = self.order.capped(n)
        if self.run is None or n > self.asked:
            more = self.evaluate(self.order.docs(self.asked, n), n)
            self.run = more if self.run is None else self.run.extended(more)
            self.asked = n
            self.wall_s += more.wall_s
        return self.run if self.run.n <= n else self.run.first(n=n)


@dataclass(frozen=True)
class EndpointAsker:
    """lm-eval on an endpoint with the run's settings (few-shot, seed, logprobs, timeouts)."""

    options: RunOptions

    def __call__(self, endpoint: Endpoint, role: str, task: str, data_dir: str | None,
                 concurrency: int | None = None, sample: list[int] | None = None,
                 limit: int | None = None, keep_failures: bool = False) -> EvalRun:
        """The documents `sample`, or the first `limit` (default the first look's);
        `keep_failures`: failed requests are kept per question, not raised (under weather)."""
        o = self.options
        return evaluate_endpoint(sample_indices=sample,
            role=role, base_url=endpoint.base_url, served_model_name=endpoint.served_model_name,
            task=task, data_dir=data_dir, limit=limit or o.limit, num_fewshot=o.num_fewshot,
            seed=o.seed, concurrency=concurrency or o.concurrency,
            top_logprobs=o.top_logprobs, max_gen_toks=o.max_gen_toks,
            timeout_s=o.request_timeout_s, work_dir=None, keep_failures=keep_failures)


@dataclass(frozen=True)
class BaselineRound:
    """One repeat's baseline: its question order, its answers so far (extended when a cell
    needs more questions; the server stays up) and its A/A re-run on the first look's, which
    may still be running (harness.run.evaluation.aa_rerun)."""

    run_id: str
    order: QuestionOrder
    staged: StagedRun
    aa_rerun: "Future[EvalRun] | None"
    samples_path: Path

    @property
    def run(self) -> EvalRun:
        assert self.staged.run is not None
        return self.staged.run

    @property
    def aa(self) -> EvalRun | None:
        """The A/A re-run, waited for; raises harness.run.evaluation.aa_rerun.BaselineFailed."""
        return None if self.aa_rerun is None else self.aa_rerun.result()

    def aa_pending(self) -> bool:
        return self.aa_rerun is not None and not self.aa_rerun.done()
