"""The next baseline group's servers, started while the current group's last pair is evaluated.

Within a group the runner already launches the next P/D pair while the current one answers. Across
groups it did not: each group's baseline and first pair started only after the previous group's
servers had stopped, and on CPU the run waited for them in every group (docs/startup.md).
Started ahead, they come up on the cores the last pair's evaluation leaves idle (the prefill's
core while the decode decodes).

A group is started ahead only on CPU, where a server's memory is host memory that this module can
check: at most the current group's servers again must fit in what the host has available. On a
GPU the servers' memory fractions are planned for the servers of one group at a time, so nothing
is started ahead there.

Whatever was started ahead and is not taken is stopped by `close()` (the runner's close, the
pytest plugin's session teardown): nothing started here outlives the run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import psutil

from harness.core.cell import Cell
from harness.run.plan.group_plan import GroupPlan, GroupPlanner
from harness.serve.deploy import Deployment, pair_key

# the next group must fit next to the current one: its servers use about what the current
# group's use (same models, same KV-cache size), with this much headroom
MEMORY_HEADROOM = 1.25


@dataclass(frozen=True)
class StartedAhead:
    """One group's servers, launched (maybe not yet healthy) before the group's turn."""

    baseline_key: str
    first_pair_key: tuple
    baseline: Deployment
    first_pair: Deployment
    launched_at: float            # time.monotonic() when they were planned and launched


def room_for(current_rss_bytes: int) -> bool:
    """Whether the host can hold another group of about `current_rss_bytes`."""
    return psutil.virtual_memory().available >= MEMORY_HEADROOM * current_rss_bytes


@dataclass(frozen=True)
class GroupServers:
    """A group's baseline and first pair, launched (maybe not yet healthy)."""

    baseline: Deployment
    first_pair: Deployment
    launched_at: float            # time.monotonic() when they began to be planned


class GroupsAhead:
    """Groups started ahead of their turn, by baseline key; each is taken once or closed."""

    def __init__(self, planner: GroupPlanner, progress: Callable[[str], None]) -> None:
        self._planner = planner
        self._progress = progress
        self._ahead: dict[str, StartedAhead] = {}

    def __contains__(self, baseline_key: str) -> bool:
        return baseline_key in self._ahead

    def add(self, started: StartedAhead) -> None:
        if started.baseline_key in self._ahead:
            raise ValueError(f"group {started.baseline_key} was already started ahead")
        self._ahead[started.baseline_key] = started

    def take(self, baseline_key: str) -> StartedAhead | None:
        """The group's servers started ahead, now the caller's to stop; None if none were."""
        return self._ahead.pop(baseline_key, None)

    def close(self) -> None:
        """Stop every group that was started ahead and never taken."""
        while self._ahead:
            _, started = self._ahead.popitem()
            started.first_pair.stop()
            started.baseline.stop()

    def start(self, cells: Sequence[Cell], current_rss_bytes: int) -> None:
        """Launch the baseline and first pair of the group of `cells` now: on CPU, and when the
        host has memory for them next to the current group."""
        if not cells or cells[0].device != "cpu" or cells[0].baseline_key in self:
            return
        if not room_for(current_rss_bytes):
            self._progress("not starting the next group ahead: the host lacks the memory")
            return
        planned = time.monotonic()
        group = self._planner.plan(cells)
        first = group.first
        self._progress(f"starting baseline for {first.model} (block {first.baseline_block_size}) "
                       f"and its first P/D pair ahead, during this group's last pair")
        baseline, first_pair = self._planner.baseline(group), self._planner.pair(group, 0)
        self.add(StartedAhead(first.baseline_key, pair_key(group.pairs[0][0]), baseline,
                              first_pair, planned))
        try:
            baseline.launch()
            first_pair.launch()
        except Exception as exc:  # noqa: BLE001 - the group's own turn starts them and says why
            self.take(first.baseline_key)
            first_pair.stop()
            baseline.stop()
            self._progress(f"could not start the next group ahead ({type(exc).__name__}: "
                           f"{exc}); it starts in its turn")

    def servers_for(self, group: GroupPlan, planned: float,
                    launched: list[Deployment]) -> GroupServers:
        """The group's baseline and first pair, still starting: taken from the servers started
        ahead of its turn, or launched together now (start-up is the long pole on CPU; its
        start-up counts from `planned`). Each is added to `launched`, which the caller stops
        when the group is done."""
        started_ahead = self.take(group.baseline_key)
        if started_ahead is not None:
            launched += [started_ahead.baseline, started_ahead.first_pair]
            if started_ahead.first_pair_key == pair_key(group.pairs[0][0]):
                return GroupServers(started_ahead.baseline, started_ahead.first_pair,
                                    started_ahead.launched_at)
            # another first pair than expected (the caller's hint was not what it ran)
            started_ahead.first_pair.stop()
            first_pair = self._planner.pair(group, 0)
            launched.append(first_pair)
            first_pair.launch()
            return GroupServers(started_ahead.baseline, first_pair, started_ahead.launched_at)
        first = group.first
        self._progress(f"starting baseline for {first.model} (block {first.baseline_block_size}) "
                       f"and the first P/D pair")
        baseline, first_pair = self._planner.baseline(group), self._planner.pair(group, 0)
        launched += [baseline, first_pair]
        baseline.launch()
        first_pair.launch()
        return GroupServers(baseline, first_pair, planned)


def first_group(cells: Sequence[Cell]) -> list[Cell]:
    """The cells of the first baseline group among `cells` ([] for none)."""
    return [c for c in cells if c.baseline_key == cells[0].baseline_key] if cells else []
