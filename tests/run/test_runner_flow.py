"""Runner's orchestration of one baseline group, on fake deployments and evaluations (no servers):
what is launched when, what every cell's record says, and the progress lines."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.judge.verdict import Policy, fail
from harness.run.evaluation import cell_eval, stages
from harness.run.plan import group_plan, groups_ahead
from harness.run import runner as runner_mod
from harness.serve.launch.models import ResolvedModel
from harness.serve.supervision.process import ServerDiedError


class FakeDeployment:
    def __init__(self, name: str, events: list[str], dies: bool = False):
        self.name, self.events, self.dies = name, events, dies
        self.startup_s: float | None = None

    def launch(self) -> None:
        self.events.append(f"launch {self.name}")

    def wait(self) -> "FakeDeployment":
        self.events.append(f"wait {self.name}")
        if self.dies:
            raise ServerDiedError(self.name, 1, f"/logs/{self.name}.log", ["RuntimeError: boom"])
        self.startup_s = 2.0 if self.name == "baseline" else 3.0
        return self

    def stop(self) -> None:
        self.events.append(f"stop {self.name}")

    def logs(self) -> dict:
        return {self.name: f"/logs/{self.name}.log"}

    def baseline_endpoint(self) -> str:
        return "endpoint"

    def rss_bytes(self) -> int:
        return 1


class FakeRun:
    wall_s = 1.5
    n = 0

    def write_jsonl(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        return path


@pytest.fixture
def flow(tmp_path, monkeypatch):
    """A Runner whose servers and evaluations are fakes; `events` lists what it did."""
    events: list[str] = []
    dying: set[str] = set()
    monkeypatch.setattr(group_plan, "resolve",
                        lambda name: ResolvedModel(name, name, False, False, None))
    monkeypatch.setattr(group_plan, "reference_accuracy", lambda model, task: None)
    monkeypatch.setattr(group_plan, "plan_baseline", lambda cell, ctx, **kw: FakeDeployment(
        "baseline", events, "baseline" in dying))
    monkeypatch.setattr(group_plan, "plan_pair", lambda cell, ctx, **kw: FakeDeployment(
        cell.cell_id, events, cell.cell_id in dying))

    def evaluate(self, endpoint, role, task, data_dir, concurrency=None, sample=None, limit=None):
        events.append(f"evaluate {role}")
        return FakeRun()

    def run_cell(self, cell, pair, rnd, group, *, timings, baseline_logs):
        events.append(f"run {cell.cell_id} on {pair.name}")
        return self.recorder.record(cell, fail("fake verdict", check="fake"), timings=timings,
                                    run_id=rnd.run_id)

    monkeypatch.setattr(stages.EndpointAsker, "__call__", evaluate)
    monkeypatch.setattr(cell_eval.CellEvaluator, "evaluate", run_cell)
    progress: list[str] = []
    options = RunOptions(task="gsm8k_local", dataset_dir=str(tmp_path), limit=5,
                         results_dir=str(tmp_path / "runs"))
    runner = runner_mod.Runner(options, Policy(), placement=object(), run_id="run-1",
                               progress=progress.append)
    return runner, events, progress, dying


def cells() -> list[Cell]:
    """One baseline group of two P/D pairs (decode block 16, prefill blocks 16 and 32)."""
    return [Cell(model="tiny", decode_block_size=16, prefill_block_size=p) for p in (16, 32)]


def test_pairs_start_while_the_previous_one_is_evaluated(flow):
    runner, events, progress, _ = flow
    a, b = cells()
    results = runner.run([a, b])
    # the A/A re-run is asked in the background (harness.run.evaluation.aa_rerun): after the first
    # run, at some point while the pairs start and answer
    assert events.index("evaluate baseline-aa") > events.index("evaluate baseline")
    events.remove("evaluate baseline-aa")
    assert events == [
        "launch baseline", f"launch {a.cell_id}", "wait baseline",
        "evaluate baseline",
        f"wait {a.cell_id}", f"launch {b.cell_id}", f"run {a.cell_id} on {a.cell_id}",
        f"stop {a.cell_id}",
        f"wait {b.cell_id}", f"run {b.cell_id} on {b.cell_id}", f"stop {b.cell_id}",
        "stop baseline", f"stop {a.cell_id}", f"stop {b.cell_id}",
    ]
    assert progress[:3] == [
        "starting baseline for tiny (block 16) and the first P/D pair",
        "evaluating baseline (gsm8k_local, 5 questions)",
        "evaluating baseline again at concurrency 1 (A/A noise floor), in the background",
    ]
    for result in results:
        timings = result.record["timings"]
        assert set(timings) == {"startup_s", "startup_wait_s", "baseline_eval_s", "group_total_s"}
        assert timings["startup_wait_s"] >= 0
        # the first run only: the A/A re-run overlaps the pair (its time is the cell's)
        assert (timings["startup_s"], timings["baseline_eval_s"]) == (3.0, 1.5)
        assert json.loads(result.record_path.read_text())["timings"]["startup_s"] == 3.0


def test_a_baseline_that_does_not_start_is_an_error_for_every_cell(flow):
    runner, events, progress, dying = flow
    dying.add("baseline")
    a, b = cells()
    results = runner.run([a, b])
    assert [r.verdict.outcome for r in results] == ["ERROR", "ERROR"]
    assert all(r.verdict.reason.startswith("baseline failed to start: baseline exited with code 1")
               for r in results)
    assert all(set(r.record["timings"]) == {"startup_s"} for r in results)
    assert events == ["launch baseline", f"launch {a.cell_id}", "wait baseline",
                      "stop baseline", f"stop {a.cell_id}"]
    assert progress[-1].startswith(f"ERROR        {b.cell_id}: baseline failed to start")


def test_a_baseline_evaluation_that_raises_is_an_error_for_every_cell(flow, monkeypatch):
    runner, events, _, _ = flow

    def broken(*args, **kwargs):
        raise ConnectionError("refused")

    monkeypatch.setattr(stages.EndpointAsker, "__call__", broken)
    results = runner.run(cells())
    assert {r.verdict.reason for r in results} == {
        "baseline evaluation failed: ConnectionError: refused"}
    assert all(r.record["timings"] == {} for r in results)
    assert events[-2:] == ["stop baseline", f"stop {cells()[0].cell_id}"]


def test_a_pair_that_does_not_start_fails_its_cells_and_the_next_pair_still_runs(flow):
    runner, events, _, dying = flow
    a, b = cells()
    dying.add(a.cell_id)
    results = runner.run([a, b])
    first, second = results
    assert first.verdict.reason.startswith("P/D pair failed to start while the baseline ran")
    assert first.verdict.checks[0].name == "pd-startup"
    assert set(first.record["artifacts"]["logs"]) == {a.cell_id}
    assert first.record["artifacts"]["baseline_samples"].endswith(".jsonl")
    assert set(first.record["timings"]) == {"startup_s", "group_total_s"}
    assert second.verdict.reason == "fake verdict"
    assert events[5:] == [
        f"wait {a.cell_id}", f"stop {a.cell_id}", f"launch {b.cell_id}",
        f"wait {b.cell_id}", f"run {b.cell_id} on {b.cell_id}", f"stop {b.cell_id}",
        "stop baseline", f"stop {a.cell_id}", f"stop {b.cell_id}",
    ]


# ---- the next group's servers, started during this group's last pair ---------------------------
@pytest.fixture
def two_groups(flow, monkeypatch):
    """`flow` with baselines named by their block size, and the host's memory as asked."""
    runner, events, progress, dying = flow
    monkeypatch.setattr(group_plan, "plan_baseline", lambda cell, ctx, **kw: FakeDeployment(
        f"baseline-{cell.decode_block_size}", events, f"baseline-{cell.decode_block_size}" in dying))
    room = {"free": True}
    monkeypatch.setattr(groups_ahead, "room_for", lambda rss: room["free"])
    first = Cell(model="tiny", decode_block_size=16, prefill_block_size=16)
    second = Cell(model="tiny", decode_block_size=32, prefill_block_size=32)
    return runner, events, progress, room, first, second


def without_aa(events: list[str]) -> list[str]:
    return [e for e in events if e != "evaluate baseline-aa"]


def test_the_next_group_starts_during_the_last_pair_and_is_not_started_again(two_groups):
    runner, events, progress, _, first, second = two_groups
    results = runner.run([first, second])
    assert [r.cell for r in results] == [first, second]
    assert without_aa(events) == [
        "launch baseline-16", f"launch {first.cell_id}", "wait baseline-16", "evaluate baseline",
        f"wait {first.cell_id}",
        "launch baseline-32", f"launch {second.cell_id}",            # ahead, during the last pair
        f"run {first.cell_id} on {first.cell_id}", f"stop {first.cell_id}",
        "stop baseline-16", f"stop {first.cell_id}",
        "wait baseline-32", "evaluate baseline",                     # taken, not launched again
        f"wait {second.cell_id}", f"run {second.cell_id} on {second.cell_id}",
        f"stop {second.cell_id}", "stop baseline-32", f"stop {second.cell_id}",
    ]
    assert ("starting baseline for tiny (block 32) and its first P/D pair ahead, during this "
            "group's last pair") in progress
    assert "ahead" not in "".join(p for p in progress if "block 16" in p)


def test_a_host_without_the_memory_starts_the_next_group_in_its_turn(two_groups):
    runner, events, progress, room, first, second = two_groups
    room["free"] = False
    runner.run([first, second])
    assert without_aa(events).index("launch baseline-32") > without_aa(events).index("stop baseline-16")
    assert "not starting the next group ahead: the host lacks the memory" in progress


def test_gpu_groups_are_not_started_ahead(two_groups):
    runner, events, _, _, first, second = two_groups
    first, second = (Cell(model="tiny", device="cuda", kv_buffer_device="cuda",
                          decode_block_size=b, prefill_block_size=b, backend="FLASH_ATTN")
                     for b in (16, 32))
    runner.run([first, second])
    assert without_aa(events).index("launch baseline-32") > without_aa(events).index("stop baseline-16")


def test_a_hinted_group_is_taken_by_the_next_run_or_stopped_by_close(two_groups):
    runner, events, _, _, first, second = two_groups
    runner.run([first], then=[second])
    assert events[-2:] == ["stop baseline-16", f"stop {first.cell_id}"]
    assert "launch baseline-32" in events and "stop baseline-32" not in events
    runner.close()                                   # the caller never ran it
    assert events[-2:] == [f"stop {second.cell_id}", "stop baseline-32"]
    runner.close()                                   # once
    assert events.count("stop baseline-32") == 1


def test_a_hint_with_another_first_pair_keeps_the_baseline_and_replaces_the_pair(two_groups):
    runner, events, _, _, first, second = two_groups
    other = Cell(model="tiny", decode_block_size=32, prefill_block_size=16)  # second's baseline
    runner.run([first], then=[second])
    del events[:]
    runner.run([other])
    assert without_aa(events)[:4] == [f"stop {second.cell_id}", f"launch {other.cell_id}",
                                      "wait baseline-32", "evaluate baseline"]
    assert "launch baseline-32" not in events


def test_a_group_that_raises_stops_the_group_started_ahead(two_groups, monkeypatch):
    runner, events, _, _, first, second = two_groups

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    real_run_group = runner_mod.Runner._run_group
    calls = []

    def run_group(self, cells, next_cells=()):
        calls.append(cells[0])
        if len(calls) == 2:
            interrupted()
        return real_run_group(self, cells, next_cells)

    monkeypatch.setattr(runner_mod.Runner, "_run_group", run_group)
    with pytest.raises(KeyboardInterrupt):
        runner.run([first, second])
    assert "launch baseline-32" in events and events[-1] == "stop baseline-32"
