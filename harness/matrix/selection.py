"""Choosing cells of an expansion: by id or glob (`--only`), by a pytest-style keyword
expression (`-k`), and by deterministic shard (`--shard I/N`, CI parallelism)."""
from __future__ import annotations

import difflib
import fnmatch
import re
import warnings
from typing import Sequence

from harness.core.cell import Cell
from harness.matrix.errors import MatrixError, UnknownCellError

_KEYWORD_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def _keyword_matches(expression: str, cell_id: str) -> bool:
    """pytest -k style: words are case-insensitive substrings of the id; and/or/not/()."""
    tokens = _KEYWORD_TOKEN.findall(expression)
    if not tokens:
        return True
    python = []
    for tok in tokens:
        if tok in ("and", "or", "not", "(", ")"):
            python.append(tok)
        else:
            python.append(str(tok.lower() in cell_id.lower()))
    try:
        with warnings.catch_warnings():   # "(a)(b)" compiles with a SyntaxWarning, then fails
            warnings.simplefilter("ignore")
            return bool(eval(" ".join(python), {"__builtins__": {}}, {}))  # only True/False/and/or/not/()
    except (SyntaxError, TypeError, ValueError, RecursionError, MemoryError):
        shown = expression if len(expression) <= 60 else expression[:57] + "..."
        raise MatrixError(f"keyword expression {shown!r} is not valid (use words with "
                          f"and/or/not/())") from None


def select(cells: Sequence[Cell], only: Sequence[str] | None = None, keyword: str | None = None) -> list[Cell]:
    """Cells named in `only` (exact ids or globs) and matching the -k style `keyword`.

    An `only` entry that matches no cell raises UnknownCellError naming the closest ids; an
    empty `only` selects nothing (None: no filter).
    """
    chosen = list(cells)
    if only is not None:
        ids = [c.cell_id for c in cells]
        wanted: set[str] = set()
        for entry in only:
            hits = [i for i in ids if fnmatch.fnmatchcase(i, entry)] if any(ch in entry for ch in "*?[") \
                else [i for i in ids if i == entry]
            if not hits:
                close = difflib.get_close_matches(entry, ids, n=3, cutoff=0.5)
                hint = f"; closest: {', '.join(close)}" if close else ""
                raise UnknownCellError(f"no cell {entry!r} in this expansion{hint}")
            wanted.update(hits)
        chosen = [c for c in chosen if c.cell_id in wanted]
    if keyword:
        chosen = [c for c in chosen if _keyword_matches(keyword, c.cell_id)]
    return chosen


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard I/N`` (0-based index I of N shards) -> (I, N); MatrixError (one line) otherwise."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise MatrixError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
    if count < 1 or not 0 <= index < count:
        raise MatrixError(f"--shard {text!r}: need 0 <= I < N")
    return index, count


def shard(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """The cells of shard `index` (0-based) out of `count`, deterministically.

    Cells with equal GPU needs and baseline_key form one group (they reuse one baseline server
    and one lease shape), and a group never splits across shards. Groups are placed largest
    first onto the least-loaded shard (ties: lower shard index; group order: size, then key),
    so every cell lands in exactly one shard and the split depends only on the cell list.
    """
    if count < 1 or not 0 <= index < count:
        raise MatrixError(f"shard {index} of {count}: need count >= 1 and 0 <= index < count")
    groups: dict[tuple[int, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.gpus_needed["total"], cell.baseline_key), []).append(cell)
    order = sorted(groups, key=lambda k: (-len(groups[k]), k))
    loads = [0] * count
    mine: set[str] = set()
    for key in order:
        target = min(range(count), key=lambda s: (loads[s], s))
        loads[target] += len(groups[key])
        if target == index:
            mine.update(c.cell_id for c in groups[key])
    return [c for c in cells if c.cell_id in mine]
