"""The declarative matrix: YAML profiles -> validated, identified, shardable Cells.

    load_matrix(path) -> MatrixSpec                                        # spec (+ schema)
    expand(spec, profile, platform) -> Expansion(cells, excluded, notes)   # expansion, rules
    select(cells, only, keyword) -> cells                                  # --only / -k
    parse_shard("I/N") -> (I, N); shard(cells, I, N) -> cells              # CI parallelism

Callers write ``from harness import matrix`` and use these names; the modules behind them are
spec (YAML -> MatrixSpec), schema (the YAML's shape, schema.json), axes (grid axes -> Cell
fields), expansion, selection, and rules (validity rules, defined in rules_cell, rules_models
and rules_machine).
"""
from harness.matrix.errors import DuplicateCellIdError, MatrixError, UnknownCellError, UnknownProfileError
from harness.matrix.expansion import (RELEASE_RULES, Excluded, Expansion, NotApplicable, expand,
                                      not_applicable)
from harness.matrix.rules import (
    EXCLUDING_KINDS,
    InvalidCellError,
    Problem,
    check_cell,
    describe_rules,
    normalize_cell,
    validate_or_die,
)
from harness.matrix.selection import parse_shard, select, shard
from harness.matrix.spec import DEFAULT_MATRIX, MATRIX_DIR, MatrixSpec, Profile, Rulebook, Selector, load_matrix

__all__ = [
    "DEFAULT_MATRIX", "EXCLUDING_KINDS", "MATRIX_DIR", "DuplicateCellIdError", "Excluded", "Expansion",
    "InvalidCellError", "MatrixError", "MatrixSpec", "NotApplicable", "Problem", "Profile", "Rulebook", "Selector",
    "UnknownCellError", "UnknownProfileError", "check_cell", "describe_rules", "expand",
    "load_matrix", "normalize_cell", "not_applicable", "parse_shard", "RELEASE_RULES", "select",
    "shard", "validate_or_die",
]
