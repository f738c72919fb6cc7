"""A cell is judged as the cell its servers really ran, or not at all.

Each server's effective configuration (harness.protocol.effective_config) is compared with
what the cell's id says for that server's role; any difference ("decode ran block 128, the cell
says 64") turns the verdict into ERROR with that reason. ERROR, not FAIL: nothing is known about
P/D at the cell's own settings (vLLM ran another cell), and not a new outcome: ERROR already
means "no verdict on P/D, the run itself is wrong" and keeps its exit code 3, its place in the
tables and in an expected failure's `fails_with`. Only values the server stated are compared,
never the ones the harness asked for (those are the cell's by construction).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from harness.core.cell import Cell
from harness.core.outcomes import ERROR
from harness.core.spec_decode import speculative_expectation
from harness.judge.verdict import Check, Verdict
from harness.protocol.effective_config import EffectiveConfig

CHECK = "effective-config"
REASON_PREFIX = "not judged as this cell (its servers ran another configuration)"


def _kind(role: str) -> str:
    return role.split("-")[0]


def _said(config: EffectiveConfig, name: str) -> bool:
    """`name` was stated by the server itself, not only asked for."""
    source = config.sources.get(name, "")
    return bool(source) and not source.startswith("asked")


def _same_backend(cell: Cell, ran: str | None) -> bool:
    """On CPU an MLA model's CPU_ATTN cell is served by vLLM CPU's MLA backend (CPU_MLA or
    AMX_MLA, its own choice: the mla-backend rule); elsewhere the names must agree."""
    if cell.device == "cpu" and cell.backend == "CPU_ATTN" and str(ran).endswith("_MLA"):
        return True
    return ran == cell.backend


def _speculative_mismatch(who: str, c: EffectiveConfig,
                          wanted: tuple[str, int] | None) -> list[str]:
    """The server's speculative method and token count against the cell's for its role."""
    method, tokens = wanted or ("none", None)
    if _said(c, "speculative_config") and (c.speculative_config or "none") != method:
        return [f"{who} ran speculative decoding {c.speculative_config}, the cell says {method}"]
    if tokens is not None and _said(c, "speculative_tokens") and c.speculative_tokens != tokens:
        return [f"{who} ran {c.speculative_tokens} speculative tokens, the cell says {tokens}"]
    return []


def mismatches(cell: Cell, configs: Mapping[str, EffectiveConfig]) -> list[str]:
    """One line per difference between what each server ran and what `cell` says for its role."""
    lines = []
    for role, c in configs.items():
        kind = _kind(role)
        if kind not in ("baseline", "prefill", "decode"):
            continue
        who = role[:-2] if role.endswith("-0") else role
        block = {"baseline": cell.baseline_block_size, "prefill": cell.prefill_block_size,
                 "decode": cell.decode_block_size}[kind]
        if _said(c, "block_size") and c.block_size != block:
            lines.append(f"{who} ran block {c.block_size}, the cell says {block}")
        if _said(c, "attention_backend") and not _same_backend(cell, c.attention_backend):
            lines.append(f"{who} ran {c.attention_backend}, the cell says {cell.backend}")
        runner = (cell.prefill_runner or cell.runner) if kind == "prefill" else cell.runner
        if _said(c, "runner") and c.runner != runner:
            lines.append(f"{who} ran the {c.runner} model runner, the cell says {runner}")
        tp = {"baseline": cell.baseline_tp, "prefill": cell.prefill_tp, "decode": cell.decode_tp}[kind]
        if _said(c, "tensor_parallel_size") and c.tensor_parallel_size != tp:
            lines.append(f"{who} ran TP {c.tensor_parallel_size}, the cell says {tp}")
        if _said(c, "enforce_eager") and c.enforce_eager != (cell.compile == "eager"):
            lines.append(f"{who} ran {'eager' if c.enforce_eager else 'compiled'}, the cell says "
                         f"{cell.compile}")
        lines += _speculative_mismatch(who, c, speculative_expectation(cell.spec_decode, kind))
        if _said(c, "async_scheduling") and cell.async_scheduling == "on" and not c.async_scheduling:
            lines.append(f"{who} ran without async scheduling, the cell says on")
    return lines


def judged_as_ran(verdict: Verdict, cell: Cell, configs: Mapping[str, EffectiveConfig]) -> Verdict:
    """`verdict`, or ERROR naming every difference when the servers ran another cell."""
    lines = mismatches(cell, configs)
    if not lines:
        return replace(verdict, checks=verdict.checks + (Check(CHECK, True, "servers ran the cell's "
                                                                 "configuration"),)) if configs else verdict
    detail = "; ".join(lines)
    # the cell's own verdict goes to the check, not the reason: an expected failure's fails_with
    # must match the misconfiguration itself ("ran block 16, the cell says 128"), not what it hid
    own = f"{detail} (the cell's own verdict would have been {verdict.status}: {verdict.reason[:200]})"
    return replace(verdict, status=ERROR, reason=f"{REASON_PREFIX}: {detail}",
                   checks=verdict.checks + (Check(CHECK, False, own),),
                   decision_path=verdict.decision_path + (CHECK,))
