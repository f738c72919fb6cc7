"""One cell of the HTML report as a person reads it: the line of the verdict table and the
evidence behind it (the row's details), built from the cell's newest history row and, where it
can be read, its record.

Every number is in the units of harness.report.evidence (accuracies in %, deltas in points, the
interval the verdict used). The details hold what a reader asks next: the whole reason, the
declared expected failure, the transfer proof (prompt tokens that arrived through the connector,
its bytes against the bytes it should move), the KV digest's comparison, what the servers ran,
every check with its result, and links to the record and the logs.
"""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any, Mapping

from harness.core.outcomes import display_rank
from harness.report.annotate import artifact_files, transfer_summary
from harness.report.cell_ids import fault_label, is_canary
from harness.report.evidence import (VERDICT, Accuracy, accuracy_of, accuracy_of_row,
                                     confidence_text, count, pct, pts)

WHY_CHARS = 110      # the table's "why": the reason's head, cut at a word; the details hold it all
# effective_config.summary marks with "?" a value the server was asked for but did not confirm
RAN_NOTE = "a value marked ? is what the server was asked to run; its log did not confirm it"


def _record(row: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        record = json.loads(Path(row["record_path"]).read_text())
    except (OSError, TypeError, ValueError, KeyError):
        return None
    if isinstance(record, dict):
        record.setdefault("_path", row["record_path"])
        return record
    return None


def _check_detail(checks: list[Mapping[str, Any]], name: str) -> str:
    check = next((c for c in checks if c.get("name") == name), None)
    if check is None:
        return ""
    return f"{'passed' if check.get('passed') else 'FAILED'}: {check.get('detail') or ''}".strip()


def _evidence(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The details' evidence lines of one record (empty without one)."""
    from harness.protocol.effective_config import summary as ran

    if record is None:
        return {"checks": [], "transfer": "", "digest": "", "bytes": "", "ran": "", "look": "",
                "instances": "", "consistency": ""}
    verdict = record.get("verdict") or {}
    metrics = record.get("metrics") or {}
    checks = [c for c in verdict.get("checks") or () if isinstance(c, Mapping)]
    transfer = metrics.get("transfer") or {}
    account = transfer.get("byte_account") or {}
    look = verdict.get("look") if isinstance(verdict.get("look"), Mapping) else {}
    return {
        "checks": [{"name": str(c.get("name")), "passed": bool(c.get("passed")),
                    "detail": str(c.get("detail") or "")} for c in checks],
        "transfer": transfer_summary(metrics, checks),
        "digest": _check_detail(checks, "kv-digest") or str(transfer.get("kv_digest_skipped") or ""),
        "bytes": str(account.get("detail") or transfer.get("byte_account_skipped") or ""),
        "ran": ran(record.get("effective_config")),
        "look": str(look.get("text") or ""),
        "instances": _check_detail(checks, "every-instance-served"),
        "consistency": consistency_text(metrics.get("consistency")),
    }


def consistency_text(consistency: Mapping[str, Any] | None) -> str:
    """A hybrid cell's vLLM CI consistency number, beside the harness's own divergence."""
    if not consistency:
        return ""
    c = consistency
    return (f"first {c['tokens']} tokens' top-1 |Δ logprob|: max {c['max_nats']:.3f} nats "
            f"(doc {c['worst_doc']}), median {c['median_nats']:.3f}, p95 {c['p95_nats']:.3f} over "
            f"{c['questions']} questions; upstream's bound {c['bound_nats']} nats, "
            f"{c['over_bound']} at or over it")


def _links(record: Mapping[str, Any] | None, out: Path) -> list[tuple[str, str]]:
    if record is None:
        return []
    links = []
    for name, path in artifact_files(record):
        links.append((name, os.path.relpath(Path(path).resolve(), out.resolve())))
    return links


def _numbers(acc: Accuracy) -> dict[str, Any]:
    has = acc.lo is not None and acc.hi is not None
    return {
        "delta": pts(acc.delta), "delta_value": acc.delta,
        "interval": f"[{pts(acc.lo)}, {pts(acc.hi)}]" if has else "-",
        "confidence": confidence_text(acc.confidence) if has else "",
        "source": acc.source or "", "verdict_interval": acc.source == VERDICT,
        "n": acc.n, "baseline": pct(acc.baseline), "pd": pct(acc.pd),
        "accuracy": acc,
    }


def cell_view(row: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Everything the report shows of one cell's newest `row` (see the module docstring)."""
    record = _record(row)
    acc = accuracy_of(record) if record is not None else accuracy_of_row(row)
    cell_id, outcome = str(row["cell_id"]), str(row.get("outcome") or row.get("status") or "ERROR")
    reason = str(row.get("reason") or "")
    canary = is_canary(cell_id)
    view = {
        "id": cell_id, "outcome": outcome, "rank": display_rank(outcome),
        "kind": "canary" if canary else "cell",
        "fault": fault_label(cell_id) if canary else "",
        "why": textwrap.shorten(reason, WHY_CHARS, placeholder=" …",
                                                    break_on_hyphens=False) if reason else "",
        "reason": reason, "expected_failure": str(row.get("expected_failure") or ""),
        "vllm": str(row.get("vllm_version") or "-"), "run_id": str(row.get("run_id") or ""),
        "created": str(row.get("created_at") or row.get("run_created_at") or "")[:16],
        "links": _links(record, out), "ran_note": RAN_NOTE,
        "tokens": count(row.get("external_tokens")),
        **_numbers(acc), **_evidence(record),
    }
    view["search"] = " ".join([cell_id, outcome, view["fault"], reason]).lower()
    return view


__all__ = ["RAN_NOTE", "WHY_CHARS", "cell_view"]
