""""Did you mean": the closest known value to a mistyped one, for every vocabulary the user
types (models, backends, profiles, connectors, weathers, tasks, ...). Matching ignores case, so
that `flashinfer` finds FLASHINFER; where the value itself ignores case, `canonical` returns the
known spelling instead of refusing it."""
from __future__ import annotations

import difflib
from typing import Iterable


def closest(value: object, known: Iterable[str], n: int = 1) -> list[str]:
    """Up to `n` known values close to `value`, compared without case (known spelling kept)."""
    by_lower: dict[str, str] = {}
    for name in known:
        by_lower.setdefault(str(name).lower(), str(name))
    text = str(value).strip().lower()[:200]   # difflib is quadratic: a long value finds nothing anyway
    exact = by_lower.get(text)
    if exact is not None:
        return [exact]
    return [by_lower[m] for m in difflib.get_close_matches(text, list(by_lower), n=n, cutoff=0.6)]


def did_you_mean(value: object, known: Iterable[str]) -> str:
    """"; did you mean X?" when a known value is close to `value`, else ""."""
    found = closest(value, known)
    return f"; did you mean {found[0]}?" if found else ""


def canonical(value: str, known: Iterable[str]) -> str | None:
    """The known value equal to `value` but for case (None: no such value)."""
    lowered = value.strip().lower()
    return next((k for k in known if k.lower() == lowered), None)


__all__ = ["canonical", "closest", "did_you_mean"]
