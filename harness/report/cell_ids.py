"""What a report reads from a cell id: canary or real cell, the fault, the configuration variant.

Cell ids look like ``{runner}-{backend}-p{P}d{D}-{model_short}-tp{a}x{b}[-n{i}x{j}][-kvbuf-cpu]
[-eager][-kvc_<connector>][-w_<weather>[_<param><value>...]][-x<hash>][-fault-<kind>[-<block>]]`` (harness.core.cell.Cell.cell_id). History rows keep
only the id, so the report derives the fault and the variant from it rather than storing them.

A canary's outcome is CAUGHT or MISSED. Records written before those outcomes existed say FAIL
(or PASS) for a canary; `canary_result` decides theirs as the judge does now, from status and
reason (harness.judge.canaries.canary_outcome).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from harness.core.cell import FAULTS
from harness.core.outcomes import CANARY_OUTCOMES, CAUGHT, MISSED
from harness.judge.canaries import canary_outcome

FAULT_MARK = "-fault-"
_HEAD = re.compile(r"^[^-]+-[^-]+-(?P<blocks>p(?P<p>\d+)d(?P<d>\d+))-(?P<rest>.+)$")
# the model's short name may hold "-"; the TP part is the last tp<a>x<b> token of the id
_TP = re.compile(r"(?:^|-)(tp\d+x\d+)(?=-|$)")


def is_canary(cell_id: str) -> bool:
    return FAULT_MARK in cell_id


def _fault_part(cell_id: str) -> str:
    return cell_id.partition(FAULT_MARK)[2]


def fault_of(cell_id: str) -> str | None:
    """The fault kind a canary's id names ("corrupt-block" of "...-fault-corrupt-block-last")."""
    if not is_canary(cell_id):
        return None
    part = _fault_part(cell_id)
    known = [f for f in FAULTS if part == f or part.startswith(f + "-")]
    return max(known, key=len) if known else part


def fault_label(cell_id: str, fault: str | None = None) -> str:
    """The fault with what steers it, e.g. "corrupt-block (last)"."""
    fault = fault or fault_of(cell_id) or ""
    part = _fault_part(cell_id)
    steering = part[len(fault) + 1:] if part.startswith(fault + "-") else ""
    return f"{fault} ({steering.replace('-', ' ')})" if steering else fault


def canary_result(cell_id: str, fault: str | None, status: str, outcome: str, reason: str) -> str:
    """A canary's outcome: the recorded one when it is CAUGHT/MISSED, else the judge's decision."""
    if outcome in CANARY_OUTCOMES:
        return outcome
    return canary_outcome(fault or fault_of(cell_id) or "", status, reason)


def with_canary_outcome(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """A history row, its outcome decided as a canary's when its cell is one."""
    cell_id = str(row.get("cell_id") or "")
    if not is_canary(cell_id):
        return row
    status = str(row.get("status") or "ERROR")
    outcome = str(row.get("outcome") or status)
    return {**row, "outcome": canary_result(cell_id, None, status, outcome,
                                            str(row.get("reason") or ""))}


def variant_of(row: Mapping[str, Any]) -> str:
    """Everything of a cell's configuration but runner, backend, model and fault, e.g.
    "p128d128 tp1x2", "p128d128 tp1x1 kvbuf-cpu eager", "p64d128 tp1x1 x62f261"."""
    cell_id = str(row.get("cell_id") or "").partition(FAULT_MARK)[0]
    head = _HEAD.match(cell_id)
    tps = list(_TP.finditer(head.group("rest"))) if head else []
    if not tps:   # not an id the harness writes: fall back to the row's own columns
        tp = f" tp{row['tp']}" if row.get("tp") else ""
        return f"p{row.get('p_block')}d{row.get('d_block')}{tp}"
    tail = head.group("rest")[tps[-1].end():].strip("-")
    tokens: list[str] = []
    for token in tail.split("-") if tail else []:
        if tokens and tokens[-1] == "kvbuf":   # "kvbuf-cpu" is one setting
            tokens[-1] += "-" + token
        else:
            tokens.append(token)
    return " ".join([head.group("blocks"), tps[-1].group(1), *tokens])


def variant_sort_key(variant: str) -> tuple:
    """Decode block, then prefill block, then the rest (the plain tp1x1 variant first)."""
    match = re.match(r"p(\d+)d(\d+)", variant)
    p, d = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    return d, p, variant.split(" ")[1:]


def canary_summary(outcomes: list[str]) -> str:
    """e.g. "4 canaries: 4 caught", "2 canaries: 1 caught, 1 missed", "1 canary: 1 ERROR"."""
    parts = [f"{outcomes.count(o)} {o.lower()}" for o in (CAUGHT, MISSED) if o in outcomes]
    parts += [f"{outcomes.count(o)} {o}" for o in sorted(set(outcomes) - {CAUGHT, MISSED})]
    noun = "canary" if len(outcomes) == 1 else "canaries"
    return f"{len(outcomes)} {noun}: " + (", ".join(parts) or "none")


__all__ = ["FAULT_MARK", "canary_result", "canary_summary", "fault_label", "fault_of",
           "is_canary", "variant_of", "variant_sort_key", "with_canary_outcome"]
