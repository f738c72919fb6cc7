"""A group's plan (harness.run.plan.group_plan): its pairs, their order, which pair is armed, and
that every server is planned from the run's one DeployContext (no server starts)."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.run.plan import group_plan
from harness.run.plan.group_plan import GroupPlanner
from harness.serve.deploy import DeployContext
from harness.serve.launch.models import ResolvedModel


@pytest.fixture
def planned(monkeypatch):
    """A planner whose plan_baseline / plan_pair record what they were asked."""
    calls: list[tuple] = []
    monkeypatch.setattr(group_plan, "resolve",
                        lambda name: ResolvedModel(name, f"/models/{name}", True, False, None))
    monkeypatch.setattr(group_plan, "reference_accuracy", lambda model, task: None)
    monkeypatch.setattr(group_plan, "plan_baseline",
                        lambda cell, ctx, **kw: calls.append(("baseline", cell, ctx, kw)))
    monkeypatch.setattr(group_plan, "plan_pair",
                        lambda cell, ctx, **kw: calls.append(("pair", cell, ctx, kw)))
    ctx = DeployContext(allocator=object(), placement=object(), log_dir=Path("/logs"))
    planner = GroupPlanner(RunOptions(task="gsm_synth", dataset_dir="/data"), ctx,
                           frozenset({"tiny-hybrid"}))
    return planner, ctx, calls


def test_cells_sharing_a_pair_are_one_pair_clean_cells_first(planned):
    planner, _, _ = planned
    clean = Cell(model="tiny", prefill_block_size=16, decode_block_size=16)
    canary = Cell(model="tiny", prefill_block_size=16, decode_block_size=16, fault="corrupt-block")
    other = Cell(model="tiny", prefill_block_size=32, decode_block_size=16)
    plan = planner.plan([canary, other, clean])
    assert plan.pairs == ((clean, canary), (other,))
    assert (plan.task, plan.data_dir, plan.model_path) == ("gsm_synth", "/data", "/models/tiny")
    assert not plan.hybrid and planner.plan([Cell(model="tiny-hybrid")]).hybrid


def test_a_pair_is_armed_only_for_a_server_side_canary(planned):
    planner, ctx, calls = planned
    clean = Cell(model="tiny")
    plan = planner.plan([clean, Cell(model="tiny", fault="corrupt-block")])
    planner.pair(plan, 0)
    planner.pair(planner.plan([clean, Cell(model="tiny", fault="drop-transfer")]), 0)
    planner.pair(plan, 0, arm_faults=False)     # the pytest fixture's pair: never armed
    planner.baseline(plan)
    assert [(kind, kw.get("arm_faults")) for kind, _, _, kw in calls] == [
        ("pair", True), ("pair", False), ("pair", False), ("baseline", None)]
    assert all(c == ctx and kw["model_path"] == "/models/tiny" for _, _, c, kw in calls)
