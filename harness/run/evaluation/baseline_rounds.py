"""A group's baseline rounds: each repeat's first look asked of the baseline server, its samples
written, and its A/A re-run handed to the background (harness.run.evaluation.aa_rerun).

Every request to the baseline passes the group's `BaselineGate`, so the first run, the A/A
re-run and a later look's extra questions never share the server's batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.core.options import RunOptions
from harness.eval.lmeval import EvalRun, split_size
from harness.run.evaluation.aa_rerun import AAReruns, BaselineGate
from harness.run.plan.group_plan import GroupPlan
from harness.run.evaluation.stages import BaselineRound, EndpointAsker, QuestionOrder, StagedRun
from harness.serve.deploy import Endpoint


@dataclass(frozen=True)
class BaselineRounds:
    """Asks a group's baseline each repeat's first look, with the run's settings."""

    options: RunOptions
    ask: EndpointAsker
    results_root: Path
    run_id: str
    progress: Callable[[str], None]

    def evaluate(self, group: GroupPlan, endpoint: Endpoint, gate: BaselineGate,
                 aa_reruns: AAReruns) -> list[BaselineRound]:
        """Every repeat's round; raises what the baseline raised."""
        repeats, limit = self.options.repeats, self.options.limit
        size = split_size(group.task, group.data_dir)
        rounds: list[BaselineRound] = []
        for r in range(repeats):
            order = QuestionOrder.for_repeat(size, self.options.sample_seed, r)
            staged = StagedRun(lambda docs, n: gate(lambda: self.ask(
                endpoint, "baseline", group.task, group.data_dir, sample=docs, limit=n)), order)
            tag = f" (repeat {r + 1}/{repeats})" if repeats > 1 else ""
            self.progress(f"evaluating baseline ({group.task}, {limit} questions){tag}")
            base_run = staged.up_to(limit)
            run_id = self.run_id if repeats == 1 else f"{self.run_id}-r{r:02d}"
            base_dir = self.results_root / run_id / "baselines"
            samples_path = base_run.write_jsonl(base_dir / f"{group.baseline_key}.jsonl")
            aa_rerun = None
            # random weights (--load-format dummy): the answers are not judged, so neither is
            # their A/A noise floor (on CPU it took 728 s at concurrency 1 for 20 questions)
            if self.options.noise_floor and group.load_format != "dummy":
                self.progress("evaluating baseline again at concurrency 1 (A/A noise floor), "
                              "in the background")
                aa_rerun = aa_reruns.submit(self._aa_job(
                    group, endpoint, order.docs(0, limit),
                    base_dir / f"{group.baseline_key}-aa.jsonl"))
            rounds.append(BaselineRound(run_id, order, staged, aa_rerun, samples_path))
        return rounds

    def _aa_job(self, group: GroupPlan, endpoint: Endpoint, sample: list[int] | None,
                samples_path: Path) -> Callable[[], EvalRun]:
        def job() -> EvalRun:
            aa = self.ask(endpoint, "baseline-aa", group.task, group.data_dir, concurrency=1,
                          sample=sample, limit=self.options.limit)
            aa.write_jsonl(samples_path)
            return aa
        return job
