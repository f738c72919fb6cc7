"""What every rule module shares: the verdict a rule gives (Problem), what it looks at
(RuleContext) and the ordered list rules register into (RuleList).

The rules themselves live in rules_cell (the cell alone), rules_models (the model's facts) and
rules_machine (this machine); harness.matrix.rules runs them in that order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from harness.core.catalog import ModelCatalog, ModelInfo
from harness.core.cell import Cell
from harness.core.platform import PlatformInfo

ProblemKind = Literal["invalid", "unavailable", "xfail", "note"]
EXCLUDING_KINDS = ("invalid", "unavailable")


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    rule: str
    message: str            # one line; says what is wrong and how to fix it
    fails_with: str | None = None   # xfail: the regex the verdict's reason must match to XFAIL


@dataclass(frozen=True)
class RuleContext:
    platform: PlatformInfo | None     # None: machine-agnostic (the "unavailable" rules stay silent)
    model: ModelInfo
    catalog: ModelCatalog


RuleCheck = Callable[[Cell, RuleContext], "str | None"]   # returns the message when it applies
# an xfail rule's pattern: fixed, or the cell's (its connector's refusal); None: any FAIL
FailsWith = "str | Callable[[Cell], str | None] | None"


@dataclass(frozen=True)
class Rule:
    name: str
    kind: ProblemKind
    summary: str
    check: RuleCheck
    fails_with: FailsWith = None    # xfail rules: how the cell is expected to fail (None: any FAIL)

    def fails_with_for(self, cell: Cell) -> str | None:
        return self.fails_with(cell) if callable(self.fails_with) else self.fails_with


class RuleList(list):
    """Rules in registration order (the order they are checked and listed in)."""

    def rule(self, name: str, kind: ProblemKind,
             fails_with: FailsWith = None) -> Callable[[RuleCheck], Rule]:
        """Register a rule; its docstring's first line is its summary (`pd-accuracy list --rules`)."""

        def wrap(fn: RuleCheck) -> Rule:
            registered = Rule(name, kind, (fn.__doc__ or name).strip().splitlines()[0], fn,
                              fails_with)
            self.append(registered)
            return registered

        return wrap


def blocks(cell: Cell) -> tuple[int, int]:
    """(prefill, decode) block sizes."""
    return cell.prefill_block_size, cell.decode_block_size
