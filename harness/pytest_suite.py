"""The P/D accuracy suite: one test per matrix cell, each a REAL vLLM P/D pair (its KV connector) against a
REAL non-disaggregated baseline, scored by real lm-eval. A test file brings it in with

    from harness.pytest_suite import *  # noqa: F401,F403

and runs it with `pytest -m pd_accuracy --pd-profile smoke [-n 2]`. Each cell's baseline group
(the selected cells sharing `baseline_key`, one xdist group) runs once, when its first test
runs, in this process or (`--pd-farm`) as the generated Buildkite steps; each test then asserts
on its own cell's verdict:
- a real cell must PASS (or fail as a declared expected failure, for a failure, not an ERROR);
- a canary (an injected fault) must be CAUGHT: FAIL for its own reason, with the fault applied
  and visible where the fault says it must be.
After the session, the annotation, history and HTML report of the run are rendered and must
name every judged cell (harness.pytest_plugin checks that at session end).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.outcomes import CAUGHT, PASS, XFAIL

# the test and the fixtures it needs: `from harness.pytest_suite import *` brings all three
__all__ = ["test_pd_matches_baseline", "pd_groups", "pd_result"]

EFFECT_CHECKS = ("accuracy", "noise-floor", "logprob-divergence")
# trained models: those whose model card measured their task through vLLM (eval_vllm.json;
# docs/zoo.md). On these a zeroed or swapped block of prompt KV must also show as
# lost accuracy, not only as changed text, and the baseline must still solve the task.
TRAINED_MIN_ACCURACY = 0.80
KV_CANARY_MIN_DROP = 0.30


def _is_trained(model: str) -> bool:
    from harness.eval.task_choice import default_task
    from harness.serve.launch.models import reference_accuracy, resolve

    resolved = resolve(model)
    reference = reference_accuracy(resolved, default_task(resolved))
    # a tolerance marks vLLM CI's expected value (harness.core.real_models), not a card's
    return reference is not None and reference.tolerance is None


@dataclass(frozen=True)
class RecordResult:
    """A cell's outcome read back from its record (farm mode: the cells ran in subprocesses)."""

    cell: Cell
    record: dict
    record_path: Path

    @property
    def verdict(self):
        from harness.judge.verdict import Check, Verdict

        v = self.record["verdict"]
        return Verdict(v["status"], v["reason"], tuple(Check(**c) for c in v.get("checks", [])),
                       v.get("expected_failure"), tuple(v.get("decision_path", [])),
                       canary=self.cell.fault, expected_failure_match=v.get("expected_failure_match"))


class GroupRunner:
    """Runs each baseline group once, on first use, and keeps its results by cell id."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        from harness.pytest_plugin import selected_cells

        self.request = request
        self.cells = selected_cells(request.session)
        self.results: dict[str, object] = {}
        self.done: set[str] = set()

    def result(self, cell: Cell):
        if cell.baseline_key not in self.done:
            self.done.add(cell.baseline_key)
            group = [c for c in self.cells if c.baseline_key == cell.baseline_key] or [cell]
            run = self._farm if self.request.config.getoption("--pd-farm") else self._in_process
            self.results.update(run(group))
        return self.results.get(cell.cell_id)

    def _in_process(self, group: list[Cell]) -> dict:
        judge = self.request.getfixturevalue("pd_judge")
        return {r.cell.cell_id: r for r in judge(group, then=self._next_group())}

    def _next_group(self) -> list[Cell]:
        """The cells of the group this process runs next, when it is known: without xdist, or
        with every server test on this worker (--pd-servers-on-one-worker), the tests run in
        collection order, so it is the first group not run yet. With groups spread over
        workers it is not known here: []."""
        from harness.pytest_plugin import runs_every_server_test
        from harness.run.plan.groups_ahead import first_group

        if not runs_every_server_test(self.request.config):
            return []
        return first_group([c for c in self.cells if c.baseline_key not in self.done])

    def _farm(self, group: list[Cell]) -> dict:
        from harness.ci.farm import run_farm
        from harness.run.record import load_records

        config = self.request.config
        runner = self.request.getfixturevalue("pd_runner")
        out = runner.run_dir / "farm" / group[0].baseline_key
        argv = self.request.getfixturevalue("pd_run_argv")
        run_args = [a for i, a in enumerate(argv)
                    if a not in ("--results-dir", "--profile")
                    and (i == 0 or argv[i - 1] not in ("--results-dir", "--profile"))]
        run_farm(config.getoption("--pd-profile"), matrix_path=config.getoption("--pd-matrix"),
                 results_dir=str(runner.run_dir), run_args=run_args, log_dir=str(out / "logs"),
                 only=[c.cell_id for c in group], annotation_path=str(out / "annotation.md"),
                 report_dir=str(out / "report"))
        latest: dict[str, dict] = {}
        for rec in load_records(runner.run_dir):
            latest[rec["cell"]["id"]] = rec          # load_records is oldest first: retries win
        by_id = {c.cell_id: c for c in group}
        return {cid: RecordResult(by_id[cid], rec, Path(rec["_path"]))
                for cid, rec in latest.items() if cid in by_id}


@pytest.fixture(scope="session")
def pd_groups(request: pytest.FixtureRequest) -> GroupRunner:
    return GroupRunner(request)


@pytest.fixture
def pd_result(pd_cell: Cell, pd_groups: GroupRunner):
    result = pd_groups.result(pd_cell)
    assert result is not None, f"no record was written for {pd_cell.cell_id}"
    return result


def explain(result) -> str:
    """The decision path, the numbers, the MDE and the first differing questions."""
    v, rec = result.verdict, result.record
    m = rec.get("metrics") or {}
    lines = [f"{result.cell.cell_id}: {v.outcome} — {v.reason}",
             f"decision path: {' → '.join(v.decision_path)}"]
    lines += [f"  [{'ok' if c.passed else 'FAILED'}] {c.name}: {c.detail}" for c in v.checks]
    if m.get("mde") is not None:
        lines.append(f"  minimum detectable drop at 80% power: {100 * m['mde']:.1f} pts (n={m.get('n')})")
    for ex in (m.get("examples") or [])[:3]:
        lines.append(f"  doc {ex['doc_id']}: baseline {ex['baseline_answer']!r} vs P/D "
                     f"{ex['pd_answer']!r}; first divergent token #{ex['first_divergent_token']}: "
                     f"{ex['baseline_token']!r} ({ex['baseline_logprob']}) vs {ex['pd_token']!r} "
                     f"({ex['pd_logprob']})")
    lines.append(f"  record: {result.record_path}")
    return "\n".join(lines)


def assert_canary_caught(cell: Cell, result, on_disk: dict) -> None:
    verdict = result.verdict
    assert verdict.outcome == CAUGHT, "canary missed:\n" + explain(result)
    if cell.fault in ("corrupt-block", "swap-blocks"):
        applied = on_disk["metrics"]["transfer"]["fault_lines"]
        assert applied > 0, "the decode server logged no applied fault:\n" + explain(result)
        if _is_trained(cell.model):
            m = on_disk["metrics"]
            assert m["baseline_accuracy"] >= TRAINED_MIN_ACCURACY, \
                f"the trained model no longer solves its task:\n{explain(result)}"
            drop = m["baseline_accuracy"] - m["pd_accuracy"]
            assert drop >= KV_CANARY_MIN_DROP, \
                f"a broken KV block cost only {100 * drop:.0f} points:\n{explain(result)}"
    failed = [c.name for c in verdict.checks if not c.passed]
    if cell.fault in ("corrupt-block", "swap-blocks", "perturb-kv", "foreign-params") and any(
            c.name == "kv-digest" for c in verdict.checks):
        assert "kv-digest" in failed, "the KV digest saw no change:\n" + explain(result)
    if cell.fault == "perturb-kv":
        assert on_disk["metrics"]["transfer"]["fault_lines"] > 0, \
            "the decode server logged no applied fault:\n" + explain(result)
        # noise of 1e-3 of each value: only the digest may see it (else it proves nothing new)
        assert failed == ["kv-digest"], "perturb-kv failed other checks:\n" + explain(result)
    if cell.fault in ("wrong-drafts", "corrupt-draft-kv"):
        assert on_disk["metrics"]["transfer"]["fault_lines"] > 0, \
            "the decode server logged no applied fault:\n" + explain(result)
    if cell.fault == "wrong-drafts":
        # lossless: the answers are the decode's own either way; only the acceptance may see it
        assert failed == ["spec-acceptance"], "wrong-drafts failed other checks:\n" + explain(result)
    if cell.fault == "foreign-params":
        # not only the proxy's own bookkeeping: the wrong KV must show in the answers
        effects = [c for c in verdict.checks if c.name in EFFECT_CHECKS and not c.passed]
        assert effects, "foreign KV left no trace in answers or logprobs:\n" + explain(result)


@pytest.mark.pd_accuracy
@pytest.mark.slow
def test_pd_matches_baseline(pd_cell: Cell, pd_result, record_property) -> None:
    from harness.report.junit import junit_properties

    result = pd_result
    verdict = result.verdict
    # the record on disk is the evidence: it must exist and agree with what we assert on
    on_disk = json.loads(Path(result.record_path).read_text())
    for name, value in junit_properties(on_disk).items():   # pytest --junitxml carries them
        record_property(name, value)
    assert on_disk["verdict"]["outcome"] == verdict.outcome
    if pd_cell.fault:
        assert_canary_caught(pd_cell, result, on_disk)
        return
    assert verdict.outcome in (PASS, XFAIL), explain(result)
    # a clean cell shares its pair with the canaries: the decode's fault plugin must have left
    # every one of this cell's own requests alone
    applied = ((on_disk.get("metrics") or {}).get("transfer") or {}).get("fault_lines", 0)
    assert applied == 0, f"{applied} faults were applied to a clean cell's requests:\n" + explain(result)
    if verdict.outcome == XFAIL:
        # it failed the way it is declared to (Verdict.failed_as_declared)
        assert verdict.failed_as_declared, explain(result)
    if verdict.outcome == PASS:
        transfer = on_disk["metrics"]["transfer"]
        assert transfer["prompt_tokens_external"] > 0, explain(result)
        assert transfer["failed_transfers"] == 0, explain(result)
