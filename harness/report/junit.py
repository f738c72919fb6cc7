"""JUnit XML of a run's cells, for CI dashboards: one <testcase> per cell with its numbers as
<property> elements. `pd-accuracy run --junit-xml` writes it; the pytest suite records the same
properties through pytest's own --junitxml (`record_property`)."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from harness.core.redact import redact


def junit_properties(record: dict) -> dict[str, str]:
    """The cell's numbers, as JUnit <property> name/value pairs (what CI dashboards can chart)."""
    m = record.get("metrics") or {}
    t = m.get("transfer") or {}
    timings = record.get("timings") or {}
    values = {"outcome": (record.get("verdict") or {}).get("outcome"),
              "baseline_accuracy": m.get("baseline_accuracy"), "pd_accuracy": m.get("pd_accuracy"),
              "accuracy_delta": m.get("accuracy_delta"), "mcnemar_p": m.get("mcnemar_p"),
              "mde": m.get("mde"), "n": m.get("n"), "agreement": m.get("agreement"),
              "prompt_tokens_external": t.get("prompt_tokens_external"),
              "kv_bytes": t.get("kv_bytes"), "startup_s": timings.get("startup_s"),
              "pd_eval_s": timings.get("pd_eval_s")}
    return {k: redact(v) for k, v in values.items() if v is not None}


def write_junit(path: str, results, run_id: str) -> None:
    """One <testcase> per cell. PASS, XFAIL and CAUGHT pass; FAIL, XPASS, MISSED and INCONCLUSIVE
    (exit 4: too few questions, not a green result) are failures; ERROR is an error."""
    suite = ET.Element("testsuite", name="pd-accuracy", tests=str(len(results)))
    failures = errors = 0
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="pd_accuracy", name=r.cell.cell_id,
                             time=f"{r.record.get('timings', {}).get('pd_eval_s', 0):.1f}")
        props = ET.SubElement(case, "properties")
        for name, value in junit_properties(r.record).items():
            ET.SubElement(props, "property", name=name, value=value)
        outcome, reason = r.verdict.outcome, redact(r.verdict.reason)
        if outcome in ("FAIL", "XPASS", "MISSED", "INCONCLUSIVE"):
            failures += 1
            ET.SubElement(case, "failure", message=f"{outcome}: {reason[:480]}").text = reason
        elif outcome == "ERROR":
            errors += 1
            ET.SubElement(case, "error", message=reason[:500]).text = reason
        ET.SubElement(case, "system-out").text = redact(r.record_path or "")
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", "0")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
