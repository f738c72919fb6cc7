"""The smallest sample size from which a saw-toothing criterion holds (the power of an exact
test is not monotone in n: its discrete critical value steps). Shared by the McNemar
sample-size search (stats) and the non-inferiority question planning (power)."""
from __future__ import annotations

from typing import Callable


def smallest_stable_n(reaches: Callable[[int], bool], n_max: int, stability_window: int, *,
                      unreachable: str, unstable: str) -> int:
    """Smallest n from which `reaches(n)` holds for `stability_window` consecutive n.

    For the power of a discrete test, which saw-tooths in n: double n until it reaches, bisect
    between the last miss and the first hit, then walk forward past every miss in the window.
    Raises ValueError(`unreachable`) when no n <= n_max reaches, ValueError(`unstable`) when
    none stays."""
    lo, hi = 0, 1  # reaches(0) is False: no questions, no decision
    while not reaches(hi):
        if hi >= n_max:
            raise ValueError(unreachable)
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    candidate = hi
    while candidate <= n_max:
        missing = [m for m in range(candidate, candidate + stability_window) if not reaches(m)]
        if not missing:
            return candidate
        candidate = missing[-1] + 1
    raise ValueError(unstable)
