"""A baseline group's plan: its model, task and P/D pairs, and the servers planned for it.

Every cell of a group shares one baseline server (`Cell.baseline_key`); cells that differ only in
a fault share one P/D pair (`pair_key`). The planner plans each server from the run's one
`DeployContext`, so the runner, the groups started ahead and the pytest fixtures plan alike.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.eval.task_choice import choose_task, default_data_dir
from harness.judge.verdict import ReferenceAccuracy
from harness.serve.deploy import DeployContext, Deployment, pair_key, plan_baseline, plan_pair
from harness.serve.launch.models import reference_accuracy, resolve
from harness.serve.launch.server_spec import SERVER_FAULTS
from harness.protocol.faults import PREFILL_FAULT_KINDS
from harness.weathers import resolved_params
from harness.weathers.facts import ServerChanges
from harness.run.weather import weather_for


def weather_servers(cell: Cell) -> dict[str, ServerChanges]:
    """role -> what `cell`'s weather changes in its P/D servers (nothing when calm)."""
    return weather_for(cell.weather).servers(cell, resolved_params(cell.weather,
                                                                   cell.weather_settings))


@dataclass(frozen=True)
class GroupPlan:
    """What every cell of one baseline group shares."""

    cells: tuple[Cell, ...]
    pairs: tuple[tuple[Cell, ...], ...]   # the group's cells by P/D pair, first-seen order
    task: str
    data_dir: str | None
    model_path: str
    hybrid: bool
    reference: ReferenceAccuracy | None   # the model card's accuracy on `task`
    load_format: str | None = None        # "dummy": random weights, the answers say nothing
    kv_cache_bytes: int | None = None     # what a server of this model needs (real shapes)

    @property
    def first(self) -> Cell:
        return self.cells[0]

    @property
    def baseline_key(self) -> str:
        return self.first.baseline_key


def weather_task(cell: Cell, task: str) -> str:
    """The task `cell`'s weather asks instead of `task` (the weather's baseline_key keeps such
    cells in a group of their own); ValueError when it has no variant of `task`."""
    variants = cell.weather_task_variants
    if not variants:
        return task
    if task not in variants:
        raise ValueError(f"weather {cell.weather} pads the prompts of {', '.join(variants)} only; "
                         f"cell {cell.cell_id} asks {task}")
    return variants[task]


@dataclass(frozen=True)
class GroupPlanner:
    """Plans groups and their servers (planned, not launched) for one run."""

    options: RunOptions
    deploy: DeployContext
    hybrid_models: frozenset[str] = frozenset()

    def plan(self, cells: Sequence[Cell]) -> GroupPlan:
        first = cells[0]
        model = resolve(first.model)
        # prefix_reuse is in the baseline key: the whole group asks the shared-prefix variant
        task = self.options.task
        if task == "auto":
            choice = choose_task(model, prefix_reuse=first.prefix_reuse)
            task = choice.task
            if choice.why:
                logging.getLogger(__name__).info("task: %s", choice.why)
        task = weather_task(first, task)
        pairs: dict[tuple, list[Cell]] = {}
        for cell in cells:
            pairs.setdefault(pair_key(cell), []).append(cell)
        for members in pairs.values():   # clean cells first: they meet the pair fresh
            members.sort(key=lambda c: c.fault is not None)
        return GroupPlan(cells=tuple(cells), pairs=tuple(tuple(m) for m in pairs.values()),
                         task=task, data_dir=self.options.dataset_dir or default_data_dir(task),
                         model_path=model.path,
                         hybrid=model.hybrid or first.model in self.hybrid_models,
                         reference=reference_accuracy(model, task),
                         load_format=model.load_format, kv_cache_bytes=model.kv_cache_bytes)

    def baseline(self, group: GroupPlan) -> Deployment:
        return plan_baseline(group.first, self.deploy, model_path=group.model_path,
                             hybrid=group.hybrid, load_format=group.load_format,
                             model_kv_cache_bytes=group.kv_cache_bytes)

    def pair(self, group: GroupPlan, index: int, *, arm_faults: bool | None = None) -> Deployment:
        """The group's pair number `index`; its decode armed (by default) when one of its cells
        is a server-side canary."""
        cells = group.pairs[index]
        arm = any(c.fault in SERVER_FAULTS for c in cells) if arm_faults is None else arm_faults
        return plan_pair(cells[0], self.deploy, model_path=group.model_path, hybrid=group.hybrid,
                         arm_faults=arm, load_format=group.load_format,
                         model_kv_cache_bytes=group.kv_cache_bytes,
                         weather=weather_servers(cells[0]),
                         arm_prefill=arm and any(c.fault in PREFILL_FAULT_KINDS for c in cells))
