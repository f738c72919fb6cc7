"""Validity rules for matrix cells, checked before any server starts.

Each rule is a small named function that looks at one Cell (plus the machine and what the matrix
knows about the model) and returns a message or None; `check_cell` turns the messages into
Problems. The Problem's `kind` decides what happens:

- ``invalid``     the combination cannot work (upstream rejects it): the cell is excluded from a
                  profile, and `validate_or_die` stops a run that names it explicitly.
- ``unavailable`` the cell is valid but this machine (GPU count, installed vLLM) cannot run it:
                  excluded the same way, with the reason.
- ``xfail``       the cell runs, but is known to fail upstream: it is kept with `expected_failure`.
- ``note``        the cell runs as asked, with something worth knowing (e.g. logical ≠ kernel block).

The rules are defined by what they look at: rules_cell (the cell alone), rules_engine (the
engine settings: async scheduling, speculative decoding, prefix reuse, chunked prefill, CUDA
graphs, the decode's KV layout), rules_models (the model's facts), rules_machine (this machine);
they are checked and listed in that order.

Hybrid SSM models need ``VLLM_SSM_CONV_STATE_LAYOUT=DS`` on every server. The matrix does not ask
the YAML author to remember it: `normalize_cell` adds it to the cell's extra_env (so it is part of
the cell's identity and baseline), and the `hybrid-conv-state-layout` rule only rejects a cell that
explicitly sets another layout.

Model facts come from a ModelCatalog (harness.core.catalog), always passed in: a matrix's own
(`load_matrix(path).models`), or the default matrix's for cells that come from no matrix.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterable

from harness.core.catalog import ModelCatalog
from harness.core.cell import Cell
from harness.core.platform import PlatformInfo
from harness.matrix import rules_cell, rules_engine, rules_machine, rules_models
from harness.matrix.rule_types import EXCLUDING_KINDS, Problem, ProblemKind, Rule, RuleContext
from harness.matrix.rules_models import SSM_LAYOUT_ENV, SSM_LAYOUT_REQUIRED
from harness.weathers import weather_rules
from harness.weathers.facts import WeatherRule

__all__ = [
    "EXCLUDING_KINDS", "RULES", "InvalidCellError", "Problem", "ProblemKind", "Rule", "RuleContext",
    "check_cell", "describe_rules", "normalize_cell", "rules", "validate_or_die",
]

# a weather's own rules are checked (and listed) right after this one
WEATHER_RULES_AFTER = "known-weather"


def _on_its_weather(weather: str, check: Callable[[Cell], str | None]) -> Callable:
    return lambda cell, ctx: check(cell) if cell.weather == weather else None


@functools.lru_cache(maxsize=None)
def _ordered(own: tuple[tuple[str, WeatherRule], ...]) -> tuple[Rule, ...]:
    cut = next(i for i, r in enumerate(rules_cell.RULES) if r.name == WEATHER_RULES_AFTER) + 1
    added = tuple(Rule(rule.name, "invalid", rule.summary, _on_its_weather(weather, rule.check))
                  for weather, rule in own)
    return (*rules_cell.RULES[:cut], *added, *rules_cell.RULES[cut:], *rules_engine.RULES,
            *rules_models.RULES, *rules_machine.RULES)


def rules() -> tuple[Rule, ...]:
    """Every rule in the order it is checked and listed, with the registered weathers' own."""
    return _ordered(weather_rules())


RULES: tuple[Rule, ...] = rules()     # the rules of the weathers found at import


def normalize_cell(cell: Cell, catalog: ModelCatalog) -> Cell:
    """Fill in what a cell implies: hybrid SSM models get VLLM_SSM_CONV_STATE_LAYOUT=DS."""
    if catalog.get(cell.model).is_hybrid and SSM_LAYOUT_ENV not in dict(cell.extra_env):
        env = tuple(sorted(cell.extra_env + ((SSM_LAYOUT_ENV, SSM_LAYOUT_REQUIRED),)))
        return dataclasses.replace(cell, extra_env=env)
    return cell


def check_cell(cell: Cell, platform: PlatformInfo | None, catalog: ModelCatalog) -> list[Problem]:
    """Every rule's verdict on `cell`, in rule order (empty: nothing to say).

    `platform=None` checks the cell alone, for any machine: rules about this machine's GPUs and
    installed vLLM ("unavailable") stay silent. Pass `harness.serve.launch.vllm_features.detect_platform()`
    before a run.
    """
    ctx = RuleContext(platform=platform, model=catalog.get(cell.model), catalog=catalog)
    problems = []
    for registered in rules():
        message = registered.check(cell, ctx)
        if message:
            problems.append(Problem(registered.kind, registered.name, " ".join(message.split()),
                                    registered.fails_with_for(cell)))
    return problems


class InvalidCellError(ValueError):
    """A cell that cannot run here. str() is one line: cell id, rule and fix."""

    def __init__(self, cell_id: str, problem: Problem):
        self.cell_id = cell_id
        self.problem = problem
        super().__init__(f"cell {cell_id}: {problem.kind} ({problem.rule}): {problem.message}")


def validate_or_die(cells: Iterable[Cell], platform: PlatformInfo | None,
                    catalog: ModelCatalog) -> None:
    """Raise InvalidCellError for the first invalid (or, given a platform, unavailable) cell."""
    for cell in cells:
        for problem in check_cell(cell, platform, catalog):
            if problem.kind in EXCLUDING_KINDS:
                raise InvalidCellError(cell.cell_id, problem)


def describe_rules() -> list[tuple[str, str, str]]:
    """(name, kind, summary) of every rule, for documentation and `pd-accuracy list --rules`."""
    return [(r.name, r.kind, r.summary) for r in rules()]
