"""A profile -> its cells: the grids' cartesian products, includes, selectors and rules applied.

Every cell is kept, excluded with the reason (a profile's `exclude`, or a validity rule that
finds it invalid or unavailable here), or kept with `expected_failure` set (xfail: a selector
or a rule says it is known to fail upstream).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from harness.core.catalog import ModelCatalog
from harness.core.cell import Cell
from harness.core.platform import PlatformInfo
from harness.matrix.axes import AXES, PAIR_AXES, REQUIRED_BLOCK, axis_values
from harness.matrix.errors import DuplicateCellIdError, MatrixError
from harness.matrix.pairwise import PairwiseCoverage, covering_cells
from harness.matrix.rules import EXCLUDING_KINDS, check_cell, normalize_cell
from harness.matrix.rules_machine import host_dtype
from harness.matrix.spec import MatrixSpec, Rulebook


@dataclass(frozen=True)
class Excluded:
    cell: Cell
    rule: str
    reason: str


# the rules that say the installed vLLM release lacks what a cell needs (its runner, backend,
# connector, a hook, a weather's settings): such a cell is "not applicable on vLLM X", and a
# release x cell view shows it as its own state
RELEASE_RULES = ("vllm-runner", "vllm-v2-ngram", "vllm-backend", "vllm-kv-connector",
                 "vllm-weather", "vllm-hooks")


@dataclass(frozen=True)
class NotApplicable:
    """A cell the installed vLLM release cannot run, and why (one line naming the release)."""

    cell: Cell
    rule: str
    reason: str
    vllm_version: str | None


def not_applicable(expansion: "Expansion") -> list[NotApplicable]:
    """The cells of `expansion` that its machine's vLLM release cannot run (RELEASE_RULES)."""
    features = expansion.platform.vllm if expansion.platform is not None else None
    version = features.version if features is not None else None
    return [NotApplicable(e.cell, e.rule, e.reason, version)
            for e in expansion.excluded if e.rule in RELEASE_RULES]


@dataclass
class Expansion:
    profile: str
    platform: PlatformInfo | None      # None: expanded for any machine
    cells: list[Cell]
    excluded: list[Excluded]
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)   # cell_id -> note lines
    coverage: tuple[PairwiseCoverage, ...] = ()   # each pairwise grid's, against its product

    def by_id(self) -> dict[str, Cell]:
        return {c.cell_id: c for c in self.cells}


def _grid_keys(axes: Mapping[str, Any], where: str) -> list[str]:
    keys = [k for k in AXES if k in axes]
    if "model" not in keys:
        raise MatrixError(f"{where}: no model (set it in the grid, the profile's or the top-level defaults)")
    return keys


def _combo_cell(keys: list[str], combo: tuple[Any, ...], catalog: ModelCatalog, where: str) -> Cell:
    """The cell one value per axis of `keys` makes."""
    fields: dict[str, Any] = {}
    for key, value in zip(keys, combo):
        if key in PAIR_AXES:
            fields[PAIR_AXES[key][0]], fields[PAIR_AXES[key][1]] = (value, value) \
                if value == REQUIRED_BLOCK else value
        else:
            fields[key] = value
    if fields.get("prefill_block_size") == REQUIRED_BLOCK:
        device = fields.get("device", Cell.__dataclass_fields__["device"].default)
        need = catalog.min_block_size(fields["model"], device)
        if need is None:
            raise MatrixError(
                f"{where}: block_size: required, but no minimum block size is known for "
                f"{fields['model']} on {device}; add it under hybrid_block_sizes")
        fields["prefill_block_size"] = fields["decode_block_size"] = need
    return Cell(**fields)


def _grid_cells(axes: Mapping[str, Any], catalog: ModelCatalog, where: str) -> list[Cell]:
    keys = _grid_keys(axes, where)
    return [_combo_cell(keys, combo, catalog, where)
            for combo in itertools.product(*(axis_values(k, axes[k]) for k in keys))]


def _pairwise_cells(axes: Mapping[str, Any], spec: MatrixSpec, where: str
                    ) -> tuple[list[Cell], PairwiseCoverage]:
    """A pairwise grid's covering array (harness.matrix.pairwise): every value pair a valid
    cell can hold, in cells the validity rules keep (on any machine)."""
    keys = _grid_keys(axes, where)
    values = {k: axis_values(k, axes[k]) for k in keys}
    varied = [k for k in keys if len(values[k]) > 1]   # the factors; the rest hold one value

    def cell_of(combo: tuple[Any, ...]) -> Cell:
        chosen = {**{k: values[k][0] for k in keys}, **dict(zip(varied, combo))}
        return normalize_cell(_combo_cell(keys, tuple(chosen[k] for k in keys), spec.models,
                                          where), spec.models)

    def is_valid(cell: Cell) -> bool:
        return not any(p.kind in EXCLUDING_KINDS for p in check_cell(cell, None, spec.models))

    return covering_cells(varied, [values[k] for k in varied], cell_of, is_valid, where)


@dataclass
class _Candidate:
    cell: Cell
    excluded: Excluded | None = None
    xfail: list[Rulebook] = field(default_factory=list)


def _collect(spec: MatrixSpec, name: str, coverage: list[PairwiseCoverage] | None = None,
             release: str | None = None) -> list[_Candidate]:
    """Cells of a profile and its includes, with that level's selectors applied; each pairwise
    grid's coverage is appended to `coverage`."""
    profile = spec.profile(name)
    coverage = [] if coverage is None else coverage
    candidates: list[_Candidate] = []
    for inc in profile.include:
        candidates.extend(_collect(spec, inc, coverage, release))
    for i, grid in enumerate(profile.grids):
        axes = {**spec.defaults, **profile.defaults, **grid}
        where = f"{Path(spec.path).name}: profiles.{name}.grids[{i}]"
        candidates.extend(_Candidate(normalize_cell(c, spec.models)) for c in _grid_cells(axes, spec.models, where))
    for i, grid in enumerate(profile.pairwise):
        axes = {**spec.defaults, **profile.defaults, **grid}
        where = f"profiles.{name}.pairwise[{i}]"
        cells, covered = _pairwise_cells(axes, spec, where)
        coverage.append(covered)
        candidates.extend(_Candidate(c) for c in cells)
    for cand in candidates:
        model = spec.models.get(cand.cell.model)
        for book in profile.exclude:
            if cand.excluded is None and book.selector.matches(cand.cell, model, release):
                cand.excluded = Excluded(cand.cell, f"profile-exclude:{name}", book.reason)
        cand.xfail.extend(b for b in profile.expected_failures if b.selector.matches(cand.cell, model, release))
    return candidates


def expand(spec: MatrixSpec, profile: str, platform: PlatformInfo | None = None) -> Expansion:
    """All cells of `profile` (with includes), split into runnable and excluded-with-reason.

    `platform=None` expands for any machine (pipeline generation): only invalid cells are
    excluded. Pass `PlatformInfo.detect()` (or `harness.serve.launch.vllm_features.detect_platform()` to
    also check the installed vLLM) to exclude what this machine cannot run, or
    `PlatformInfo.from_spec("cuda:8")` to see what a bigger one would.
    """
    seen: dict[str, _Candidate] = {}
    coverage: list[PairwiseCoverage] = []
    # the installed vLLM release bounds `vllm:` selectors (None: any release, not probed)
    release = platform.vllm.version if platform is not None and platform.vllm is not None else None
    for cand in _collect(spec, profile, coverage, release):
        cand.cell = host_dtype(cand.cell, platform)
        cid = cand.cell.cell_id
        if cid in seen:
            if seen[cid].cell != cand.cell:
                first, second = seen[cid].cell.to_dict(), cand.cell.to_dict()
                diff = {k: (first[k], second[k]) for k in first if first[k] != second[k]}
                raise DuplicateCellIdError(
                    f"profile {profile}: two different cells share the id {cid} (they differ in {diff}); "
                    "give one a model_tag or drop the duplicate")
            seen[cid].xfail.extend(b for b in cand.xfail if b not in seen[cid].xfail)
            continue
        seen[cid] = cand
    cells: list[Cell] = []
    excluded: list[Excluded] = []
    notes: dict[str, tuple[str, ...]] = {}
    for cid, cand in seen.items():
        model = spec.models.get(cand.cell.model)
        xfail = list(cand.xfail) + [b for b in spec.expected_failures
                                    if b.selector.matches(cand.cell, model, release)]
        if cand.excluded is not None:
            excluded.append(cand.excluded)
            continue
        problems = check_cell(cand.cell, platform, spec.models)
        blocking = [p for p in problems if p.kind in EXCLUDING_KINDS]
        if blocking:
            excluded.append(Excluded(cand.cell, blocking[0].rule, blocking[0].message))
            continue
        xfail += [Rulebook(None, p.message, p.fails_with)  # type: ignore[arg-type]
                  for p in problems if p.kind == "xfail"]
        note_lines = tuple(f"{p.rule}: {p.message}" for p in problems if p.kind == "note")
        if note_lines:
            notes[cid] = note_lines
        if xfail:
            reasons = list(dict.fromkeys(b.reason for b in xfail))
            # XFAIL needs the verdict to fail as declared: any failure when one declaration
            # names no pattern (rules, older declarations), else one of the patterns
            patterns = [b.fails_with for b in xfail]
            match = None if None in patterns else "|".join(f"(?:{p})" for p in dict.fromkeys(patterns))
            cells.append(cand.cell.replace(expected_failure="; ".join(reasons),
                                           expected_failure_match=match))
        else:
            cells.append(cand.cell)
    return Expansion(profile=profile, platform=platform, cells=cells, excluded=excluded, notes=notes,
                     coverage=tuple(coverage))
