"""File names built from input, and where files may land.

A cell id is a record's file name and a directory name under the run, so it (and every other
name the harness builds from a matrix, a deployment file or the command line) keeps to a safe
alphabet: letters, digits, ``.``, ``_``, ``+``, ``-``, not starting with ``.`` or ``-``, at
most 200 characters. `under` is the last guard: the path it returns lies below its root,
whatever the parts hold.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

SAFE_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+\-]{0,199}")


class UnsafePath(ValueError):
    """A name outside the safe alphabet, or a path that would leave its root. One line."""


def safe_name_problem(name: object, what: str = "name") -> str | None:
    """None when `name` is a safe file name; else one line saying why not."""
    if not isinstance(name, str):
        return f"{what} must be a string, not {type(name).__name__}"
    if SAFE_NAME.fullmatch(name) and ".." not in name:
        return None
    shown = name if len(name) <= 60 else name[:57] + "..."
    return (f"{what} {shown!r} is not a safe file name (letters, digits, '.', '_', '+', '-'; "
            f"no '..', at most 200 characters)")


def check_safe_name(name: object, what: str = "name") -> str:
    problem = safe_name_problem(name, what)
    if problem:
        raise UnsafePath(problem)
    return name  # type: ignore[return-value]


def under(root: str | os.PathLike[str], *parts: str) -> Path:
    """``root / parts...`` resolved, refused (UnsafePath) unless it lies below ``root``."""
    base = Path(root).resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and base not in path.parents:
        raise UnsafePath(f"{os.path.join(str(root), *parts)} lies outside {root}")
    return path


__all__ = ["SAFE_NAME", "UnsafePath", "check_safe_name", "safe_name_problem", "under"]
