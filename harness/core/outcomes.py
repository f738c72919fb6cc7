"""Every way a cell, a run or a command can end, and the one exit-code table.

Verdict statuses are what the judge decides about a cell; outcomes add what the matrix declared:
an expected failure turns FAIL into XFAIL and PASS into XPASS, and a canary (a cell with an
injected fault) that FAILs for its fault's own reason is CAUGHT, otherwise MISSED. Exit codes are what CI acts on:
0 nothing to do, 1 P/D is broken (never retry), 2 bad input (nothing was started), 3 the
environment is broken (retry), 4 too little evidence (add questions).
"""
from __future__ import annotations

from typing import Iterable

PASS, FAIL, INCONCLUSIVE, ERROR = "PASS", "FAIL", "INCONCLUSIVE", "ERROR"
XFAIL, XPASS = "XFAIL", "XPASS"
CAUGHT, MISSED = "CAUGHT", "MISSED"     # canaries: the harness saw the fault / did not
STATUSES = (PASS, FAIL, INCONCLUSIVE, ERROR)
CONTINUE = "CONTINUE"   # a verdict at a look that decided nothing: ask more questions (never final)

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2          # bad input: one line on stderr, nothing was started
EXIT_ERROR = 3          # environment error: a retry is reasonable
EXIT_INCONCLUSIVE = 4   # nothing failed, too few questions

EXIT_CODES = {PASS: EXIT_OK, FAIL: EXIT_FAIL, ERROR: EXIT_ERROR, INCONCLUSIVE: EXIT_INCONCLUSIVE,
              XFAIL: EXIT_OK, XPASS: EXIT_FAIL, CAUGHT: EXIT_OK, MISSED: EXIT_FAIL}
# worst first: the exit code of a run is its worst outcome's
SEVERITY = (FAIL, MISSED, XPASS, ERROR, INCONCLUSIVE, XFAIL, CAUGHT, PASS)
# the order tables and reports list outcomes in (what a reader must look at first)
DISPLAY_ORDER = (FAIL, MISSED, ERROR, XPASS, INCONCLUSIVE, XFAIL, CAUGHT, PASS)
CANARY_OUTCOMES = (CAUGHT, MISSED)
# the order of a run's one-line summary: what went right, then what did not
SUMMARY_ORDER = (PASS, XFAIL, CAUGHT, FAIL, MISSED, XPASS, ERROR, INCONCLUSIVE)


def worst_outcome(outcomes: Iterable[str]) -> str:
    present = set(outcomes)
    for o in SEVERITY:
        if o in present:
            return o
    return PASS


def display_rank(outcome: str) -> int:
    return DISPLAY_ORDER.index(outcome) if outcome in DISPLAY_ORDER else 0


def summary_line(outcomes: Iterable[str]) -> str:
    """e.g. "10 cells: 5 PASS, 1 XFAIL, 4 canaries caught" (zero counts left out)."""
    outcomes = list(outcomes)
    parts = []
    for o in SUMMARY_ORDER:
        n = outcomes.count(o)
        if not n:
            continue
        if o == CAUGHT:
            parts.append(f"{n} {'canary' if n == 1 else 'canaries'} caught")
        elif o == MISSED:
            parts.append(f"{n} {'canary' if n == 1 else 'canaries'} missed")
        else:
            parts.append(f"{n} {o}")
    others = sorted(set(outcomes) - set(SUMMARY_ORDER))
    parts += [f"{outcomes.count(o)} {o}" for o in others]
    return f"{len(outcomes)} cell{'s' if len(outcomes) != 1 else ''}: " + (", ".join(parts) or "none")
