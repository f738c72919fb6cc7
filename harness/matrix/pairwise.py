"""A profile's `pairwise:` grids: a covering array over the grid's axes instead of their product.

Every pair of values of any two axes that some valid cell holds (the matrix's validity rules
decide, harness.matrix.rules) is held by at least one generated cell, and every generated cell
is valid: bugs that need two settings together (MLA + fp8 KV, drafts + prefix caching, a
connector under weather) are met without the full product's thousands of cells. A pair no
valid cell holds cannot be covered, and is counted apart.

The array comes from covertable (PyPI, Apache-2.0; docs/matrix.md says why it and not
allpairspy): its constraints take a function over the factors they require and are checked as
soon as those are set. Each pair of axes whose valid value pairs are fewer than their product
gets a constraint naming them (so a row is steered away early), and the whole row must be a
valid cell (rules over three axes or more).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from harness.core.cell import Cell

PAIRWISE_SALT = "pd-accuracy"   # covertable orders candidates by a salted hash: the same array every time


@dataclass(frozen=True)
class PairwiseCoverage:
    """What one pairwise grid covers, against its full product."""

    where: str
    axes: tuple[str, ...]
    cells: int               # the covering array's cells
    product: int             # the full product's cells
    valid: int               # of them, valid under the matrix's rules
    pairs: int               # value pairs some valid cell holds (coverable)
    covered: int             # of them, held by a generated cell
    impossible: int          # value pairs no valid cell holds

    def line(self) -> str:
        return (f"{self.where}: {self.cells} cells cover {self.covered} of {self.pairs} value "
                f"pairs of {len(self.axes)} axes ({', '.join(self.axes)}) that a valid cell "
                f"can hold; the full product is {self.product:,} cells ({self.valid:,} valid); "
                f"{self.impossible} pair{'' if self.impossible == 1 else 's'} no valid cell holds")


def value_pairs(rows: Sequence[tuple[int, ...]]) -> set[tuple[int, int, int, int]]:
    """(axis i, value index, axis j, value index) of every pair the rows hold."""
    return {(i, row[i], j, row[j]) for row in rows
            for i, j in itertools.combinations(range(len(row)), 2)}


def covering_rows(sizes: Sequence[int], valid: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Rows (value indices per axis) covering every pair some row of `valid` holds, each row
    in `valid` (covertable, constrained per pair of axes and per row)."""
    from covertable import make

    keys = [f"a{i}" for i in range(len(sizes))]
    constraints: list[dict[str, Any]] = []
    for i, j in itertools.combinations(range(len(sizes)), 2):
        allowed = {(row[i], row[j]) for row in valid}
        if len(allowed) < sizes[i] * sizes[j]:
            constraints.append({"operator": "fn", "requires": [keys[i], keys[j]],
                                "evaluate": _pair_allowed(keys[i], keys[j], allowed)})
    constraints.append({"operator": "fn", "requires": keys,
                        "evaluate": lambda row: tuple(row[k] for k in keys) in valid})
    factors = {k: list(range(n)) for k, n in zip(keys, sizes)}
    made = make(factors, constraints=constraints, salt=PAIRWISE_SALT)
    return [tuple(row[k] for k in keys) for row in made]


def _pair_allowed(a: str, b: str, allowed: set[tuple[int, int]]) -> Callable[[Mapping], bool]:
    return lambda row: (row[a], row[b]) in allowed


def covering_cells(keys: Sequence[str], values: Sequence[Sequence[Any]],
                   cell_of: Callable[[tuple[Any, ...]], Cell],
                   is_valid: Callable[[Cell], bool], where: str
                   ) -> tuple[list[Cell], PairwiseCoverage]:
    """The covering array's cells over `values` (one list per axis of `keys`), built by
    `cell_of(combo)`, and what they cover."""
    sizes = [len(v) for v in values]
    product = list(itertools.product(*(range(n) for n in sizes)))
    cells = {row: cell_of(tuple(values[i][k] for i, k in enumerate(row))) for row in product}
    valid = {row for row, cell in cells.items() if is_valid(cell)}
    rows = covering_rows(sizes, valid) if valid else []
    coverable = value_pairs(sorted(valid))
    every = {(i, a, j, b) for i, j in itertools.combinations(range(len(sizes)), 2)
             for a in range(sizes[i]) for b in range(sizes[j])}
    coverage = PairwiseCoverage(where, tuple(keys), len(rows), len(product), len(valid),
                                len(coverable), len(value_pairs(rows) & coverable),
                                len(every - coverable))
    return [cells[row] for row in rows], coverage


__all__ = ["PairwiseCoverage", "covering_cells", "covering_rows", "value_pairs"]
