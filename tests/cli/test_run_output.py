"""What `pd-accuracy run` writes about its cells: JUnit XML with the numbers as properties, and
outcomes that keep their meaning (a caught canary passes, INCONCLUSIVE is no green skip)."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from types import SimpleNamespace

from harness.report.junit import write_junit
from harness.core.cell import Cell
from harness.judge.verdict import Verdict


def _result(cell: Cell, status: str, reason: str, **verdict) -> SimpleNamespace:
    v = replace(Verdict(status, reason, **verdict), canary=cell.fault)
    record = {"verdict": {"outcome": v.outcome},
              "metrics": {"baseline_accuracy": 1.0, "pd_accuracy": 0.5, "n": 50,
                          "transfer": {"prompt_tokens_external": 23000.0}},
              "timings": {"pd_eval_s": 12.5}}
    return SimpleNamespace(cell=cell, verdict=v, record=record, record_path=f"/r/{cell.cell_id}.json")


def test_junit_outcomes_and_properties(tmp_path):
    real = Cell(model="tiny-llama-gsm")
    canary = real.replace(fault="drop-transfer")
    missed = real.replace(fault="corrupt-block")
    results = [_result(real, "PASS", "fine"),
               _result(canary, "FAIL", "decode recomputed the prompt: no KV crossed (x)"),
               _result(missed, "PASS", "fine"),
               _result(real.replace(runner="v2"), "INCONCLUSIVE", "underpowered"),
               _result(real.replace(backend="X"), "ERROR", "baseline died")]
    path = tmp_path / "j.xml"
    write_junit(str(path), results, "run")
    suite = ET.parse(path).getroot()
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) \
        == ("5", "2", "1", "0")
    assert cases[real.cell_id].find("failure") is None
    assert cases[canary.cell_id].find("failure") is None        # CAUGHT passes
    assert cases[missed.cell_id].find("failure").get("message").startswith("MISSED")
    assert cases[real.replace(runner="v2").cell_id].find("failure").get("message") \
        .startswith("INCONCLUSIVE")
    assert cases[real.replace(backend="X").cell_id].find("error") is not None
    props = {p.get("name"): p.get("value") for p in cases[real.cell_id].iter("property")}
    assert props["outcome"] == "PASS" and props["pd_accuracy"] == "0.5"
    assert props["prompt_tokens_external"] == "23000.0" and props["pd_eval_s"] == "12.5"
    assert {p.get("value") for p in cases[canary.cell_id].iter("property")
            if p.get("name") == "outcome"} == {"CAUGHT"}
