"""Atomic file writes: a reader (another process, a CI step, a person) sees either the old file or
the whole new one, never a torn write, and an interrupted write leaves no temporary file behind.

The new text goes to a temporary file in the target's own directory (so ``os.replace`` is a
rename within one file system), is fsynced, and then replaces the target in one step.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_json", "atomic_write_text"]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` so readers see either the old file or the whole new one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; these files are meant to be read by CI and people
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """``atomic_write_text`` of ``data`` as indented, key-sorted JSON (``str()`` for the rest)."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
