"""The P/D accuracy suite: one test per matrix cell, each a REAL vLLM P/D pair (NIXL) against a
REAL non-disaggregated baseline, scored by real lm-eval.

All selected cells run once per session (per xdist worker) through harness.run.runner, which shares
baselines and P/D pairs between cells; each test then asserts on its own cell's verdict:
- a normal cell must PASS (or fail as a declared expected failure);
- a canary cell (a fault the harness injects) must FAIL, for the right reason.

    pytest -m pd_accuracy --pd-profile smoke
    pytest -m pd_accuracy --pd-profile pr -k "FLASHINFER and p128"
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.core.cell import Cell

from harness.judge.calibration import CANARY_REASONS  # what each canary's verdict must say

EFFECT_CHECKS = ("accuracy", "noise-floor", "logprob-divergence")
# trained models: those whose model card measured their task through vLLM (eval_vllm.json; the zoo's
# three score 97.5-100%). On these a zeroed or swapped block of prompt KV must also show as lost
# accuracy, not only as changed text, and the baseline must still solve the task.
TRAINED_MIN_ACCURACY = 0.80
KV_CANARY_MIN_DROP = 0.30


def _is_trained(model: str) -> bool:
    from harness.serve.models import reference_accuracy, resolve
    from harness.run.runner import default_task

    resolved = resolve(model)
    return reference_accuracy(resolved, default_task(resolved)) is not None


def _expansion(config: pytest.Config):
    from harness.matrix import spec as matrix
    from harness.core.platform import PlatformInfo
    from harness.serve.vllm_features import detect_platform

    spec = matrix.load_matrix(config.getoption("--pd-matrix"))
    plat = config.getoption("--pd-platform")
    platform = PlatformInfo.from_spec(plat) if plat else detect_platform()
    return spec, matrix.expand(spec, config.getoption("--pd-profile"), platform)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pd_cell" in metafunc.fixturenames:
        _, expansion = _expansion(metafunc.config)
        cells = expansion.cells
        metafunc.parametrize("pd_cell", cells, ids=[c.cell_id for c in cells])


def _selected_cells(request: pytest.FixtureRequest) -> list[Cell]:
    cells: list[Cell] = []
    for item in request.session.items:
        cell = getattr(item, "callspec", None) and item.callspec.params.get("pd_cell")
        if cell is not None and cell not in cells:
            cells.append(cell)
    return cells


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
                       v.get("expected_failure"), tuple(v.get("decision_path", [])))


@pytest.fixture(scope="session")
def pd_farm(request: pytest.FixtureRequest) -> dict:
    """Farm mode: run the selected cells' generated Buildkite steps on this machine."""
    from harness.ci.farm import run_farm
    from harness.run.record import load_records

    config = request.config
    cells = _selected_cells(request)
    out = Path(config.getoption("--pd-results-dir")) / time.strftime("farm-%Y%m%dT%H%M%S")
    run_args = ["--limit", str(config.getoption("--pd-limit") or 50),
                "--alpha", str(config.getoption("--pd-alpha")),
                "--max-mde", str(config.getoption("--pd-max-mde")),
                *config.getoption("--pd-run-arg")]
    exit_code = run_farm(config.getoption("--pd-profile"), matrix_path=config.getoption("--pd-matrix"),
                         results_dir=str(out / "records"), run_args=run_args,
                         log_dir=str(out / "farm-logs"), only=[c.cell_id for c in cells],
                         annotation_path=str(out / "annotation.md"), report_dir=str(out / "report"))
    latest: dict[str, dict] = {}
    for rec in load_records(out / "records"):
        latest[rec["cell"]["id"]] = rec          # load_records is oldest first: retries win
    by_id = {c.cell_id: c for c in cells}
    results = {cid: RecordResult(by_id[cid], rec, Path(rec["_path"]))
               for cid, rec in latest.items() if cid in by_id}
    return {"exit_code": exit_code, "dir": out, "results": results, "cells": cells}


@pytest.fixture(scope="session")
def pd_results(request: pytest.FixtureRequest) -> dict:
    """Run every selected cell once (shared servers) and return {cell_id: result}."""
    if not request.config.getoption("--pd-in-process"):
        return request.getfixturevalue("pd_farm")["results"]
    from harness.core.cell import RunOptions
    from harness.serve.process import install_signal_handlers
    from harness.run.runner import Runner
    from harness.serve.server_spec import Features
    from harness.judge.verdict import Policy

    config = request.config
    cells = _selected_cells(request)
    spec, _ = _expansion(config)
    hybrid = [c.model for c in cells if spec.models.get(c.model).is_hybrid]
    features = Features.detect()
    options = RunOptions(limit=config.getoption("--pd-limit") or 50,
                         alpha=config.getoption("--pd-alpha"),
                         results_dir=config.getoption("--pd-results-dir"),
                         startup_timeout_s=600.0,
                         extra={"profile": config.getoption("--pd-profile")})
    policy = Policy(alpha=options.alpha, max_mde=config.getoption("--pd-max-mde"))
    install_signal_handlers()
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda m: reporter.write_line(f"[pd-accuracy] {m}")) if reporter else print
    runner = Runner(options, policy, features=features, progress=say, hybrid_models=hybrid)
    say(f"run {runner.run_id}: {len(cells)} cell(s) → {runner.run_dir}")
    results = runner.run(cells)
    request.config._pd_outputs = {"dir": runner.run_dir, "records": runner.run_dir,  # noqa: SLF001
                                  "cells": cells, "annotation": None}
    return {r.cell.cell_id: r for r in results}


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


@pytest.mark.pd_accuracy
@pytest.mark.slow
def test_pd_matches_baseline(pd_cell: Cell, pd_results: dict) -> None:
    assert pd_cell.cell_id in pd_results, f"no record was written for {pd_cell.cell_id}"
    result = pd_results[pd_cell.cell_id]
    verdict = result.verdict
    # the record on disk is the evidence: it must exist and agree with what we assert on
    on_disk = json.loads(result.record_path.read_text())
    assert on_disk["verdict"]["outcome"] == verdict.outcome
    if pd_cell.fault:
        assert verdict.status == "FAIL", "canary did not fail:\n" + explain(result)
        assert re.search(CANARY_REASONS[pd_cell.fault], verdict.reason), \
            f"canary failed for the wrong reason:\n{explain(result)}"
        if pd_cell.fault in ("corrupt-block", "swap-blocks"):
            applied = on_disk["metrics"]["transfer"]["fault_lines"]
            assert applied > 0, "the decode server logged no applied fault:\n" + explain(result)
            if _is_trained(pd_cell.model):
                m = on_disk["metrics"]
                assert m["baseline_accuracy"] >= TRAINED_MIN_ACCURACY, \
                    f"the trained model no longer solves its task:\n{explain(result)}"
                drop = m["baseline_accuracy"] - m["pd_accuracy"]
                assert drop >= KV_CANARY_MIN_DROP, \
                    f"a broken KV block cost only {100 * drop:.0f} points:\n{explain(result)}"
        if pd_cell.fault == "foreign-params":
            # not only the proxy's own bookkeeping: the wrong KV must show in the answers
            effects = [c for c in verdict.checks if c.name in EFFECT_CHECKS and not c.passed]
            assert effects, "foreign KV left no trace in answers or logprobs:\n" + explain(result)
        return
    assert verdict.outcome in ("PASS", "XFAIL"), explain(result)
    if verdict.outcome == "PASS":
        transfer = on_disk["metrics"]["transfer"]
        assert transfer["prompt_tokens_external"] > 0, explain(result)
        assert transfer["nixl_failed_transfers"] == 0, explain(result)


@pytest.mark.pd_accuracy
@pytest.mark.slow
def test_annotation_history_and_report(request: pytest.FixtureRequest, pd_results: dict) -> None:
    """The Buildkite annotation, the history store and the HTML report cover every cell that ran.
    Farm mode checks what the pipeline's final step produced; in-process mode renders them."""
    import sqlite3
    from html.parser import HTMLParser

    from harness.report.annotate import annotate
    from harness.report.history import append_results_dir
    from harness.report.html import render_report

    if request.config.getoption("--pd-in-process"):
        outputs = request.config._pd_outputs  # noqa: SLF001
        out, records = outputs["dir"], outputs["records"]
        annotate(records, out / "annotation.md", agent=False)
        cells = outputs["cells"]
    else:
        farm = request.getfixturevalue("pd_farm")
        out, records, cells = farm["dir"], farm["dir"] / "records", farm["cells"]
    ids = [c.cell_id for c in cells]
    annotation = (out / "annotation.md").read_text()
    for cid in ids:
        assert f"`{cid}`" in annotation, f"{cid} missing from the annotation"
    db = out / "history.sqlite"
    append_results_dir(db, records)
    with sqlite3.connect(db) as conn:
        rows = {r[0] for r in conn.execute("SELECT cell_id FROM cells")}
    assert set(ids) <= rows, f"history lacks {set(ids) - rows}"
    report = out / "report" / "index.html"
    if request.config.getoption("--pd-in-process") or not report.exists():
        report = render_report(db, out / "report")
    html = Path(report).read_text()
    HTMLParser().feed(html)
    for cid in ids:
        assert cid in html, f"{cid} missing from the HTML report"
    assert list((out / "report").rglob("*.png")), "the report has no heatmap/trend images"
