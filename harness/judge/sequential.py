"""The sequential accuracy gate: PASS, FAIL, or evaluate more questions, with error rates kept.

A cell is judged at looks after n_1 < n_2 < ... < n_K = budget questions, each look using every
question so far (cumulative b, c, n; see `harness.judge.noninferiority` for the notation). At
look k, with per-look levels alpha_fail_k and alpha_pass_k:

    FAIL          P/D is worse: one-sided exact McNemar p (`stats.mcnemar_worse`) <= alpha_fail_k
    PASS          not FAIL, and non-inferiority holds: the Tango upper (1 - alpha_pass_k) bound
                  of the drop is <= margin
    CONTINUE      neither, and k < K: evaluate up to n_{k+1} questions
    INCONCLUSIVE  neither at the budget; the bound reached is reported

FAIL is checked first: a drop shown to exist is a fault even when it is inside the margin.

Error rates. The per-look levels are a Bonferroni split of Lan-DeMets alpha spending: with
information fraction t_k = n_k / budget and a spending function a(t) (a(0) = 0, a(1) = alpha),
alpha_k = a(t_k) - a(t_{k-1}), so sum_k alpha_k = alpha. The union bound then gives
P(any false FAIL | drop = 0) <= sum_k P(McNemar rejects at look k) <= alpha_fail, since McNemar's
exact test is valid at every level whatever the discordance, and likewise
P(any false PASS | drop >= margin) <= alpha_pass as far as Tango's test holds its level (see
`noninferiority`). Stopping early for one reason only removes chances of the other. Bonferroni
ignores that looks are correlated, so the real rates are below the stated ones;
`harness.judge.power.operating_characteristics` computes them exactly: with the defaults, at
most 0.0085 false PASS (drop = margin, any discordance up to 90 %) and 0.0047 false FAIL
(drop 0, discordance up to 10 %) for alpha = 0.01, budgets 400 and 1319.

Spending functions (Lan & DeMets 1983; Jennison & Turnbull 2000, sec. 7.2), one-sided:
    "obrien-fleming"  a(t) = 2 (1 - Phi(z_{1-alpha/2} / sqrt(t)))  -- almost nothing early
    "pocock"          a(t) = alpha ln(1 + (e - 1) t)                -- spends early
    "linear"          a(t) = alpha t
The default is Pocock-type for both rules. A cell where every question agrees can PASS only
once the bound z^2 / (n + z^2) at the look's level is <= margin; O'Brien-Fleming levels are so
small early (3e-13 at 50 of 400 questions, 6e-40 at 50 of 1319) that such a cell waits for 400
questions and a P/D pair that gets everything wrong cannot FAIL at the first look of a
1319-question plan; Pocock-type levels let the clean cell PASS at 200 and halve the expected
questions of a cell with 2 % chance discordance (1319 budget: 311 vs 712). The price is power
late in the plan: a real 2.5-pt drop FAILs with probability 0.57 instead of 0.71 (budget 1319;
0.16 vs 0.25 at 400), and a 400-question cell with 10 % discordance PASSes with 0.63 instead
of 0.75 (exact numbers: results/calibration/noninferiority-sim/summary.md).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats as sps

from harness.core.outcomes import FAIL, INCONCLUSIVE, PASS
from harness.judge import noninferiority as ni
from harness.judge.stats import mcnemar_worse

__all__ = [
    "CONTINUE", "SPENDING_FUNCTIONS", "SequentialPlan", "LookDecision", "evaluate_look",
    "look_outcomes", "walk", "count_discordant",
]

from harness.core.outcomes import CONTINUE  # noqa: E402 (one name for "ask more")


def obrien_fleming(alpha: float, t: float) -> float:
    return 0.0 if t <= 0 else float(2.0 * sps.norm.sf(sps.norm.isf(alpha / 2.0) / math.sqrt(t)))


def pocock(alpha: float, t: float) -> float:
    return alpha * math.log1p((math.e - 1.0) * t)


def linear(alpha: float, t: float) -> float:
    return alpha * t


SPENDING_FUNCTIONS: dict[str, Callable[[float, float], float]] = {
    "obrien-fleming": obrien_fleming, "pocock": pocock, "linear": linear}


@dataclass(frozen=True)
class SequentialPlan:
    """Where to look, how much error to allow, and how to spend it over the looks."""

    stages: tuple[int, ...] = (50, 100, 200, 400)   # cumulative questions at each look
    margin: float = ni.DEFAULT_MARGIN               # largest acceptable drop (0.05 = 5 pts)
    alpha_fail: float = ni.DEFAULT_ALPHA            # P(FAIL | no drop), over all looks
    alpha_pass: float = ni.DEFAULT_ALPHA            # P(PASS | drop >= margin), over all looks
    fail_spending: str = "pocock"
    pass_spending: str = "pocock"

    def __post_init__(self) -> None:
        stages = tuple(int(s) for s in self.stages)
        if not stages or stages[0] <= 0 or any(b <= a for a, b in zip(stages, stages[1:])):
            raise ValueError(f"stages must be positive and increasing, got {self.stages}")
        object.__setattr__(self, "stages", stages)
        for name in ("alpha_fail", "alpha_pass"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in (0, 1), got {getattr(self, name)}")
        if not 0.0 < self.margin < 1.0:
            raise ValueError(f"margin must lie in (0, 1), got {self.margin}")
        for name in ("fail_spending", "pass_spending"):
            if getattr(self, name) not in SPENDING_FUNCTIONS:
                raise ValueError(f"{name} must be one of {sorted(SPENDING_FUNCTIONS)}, "
                                 f"got {getattr(self, name)!r}")

    @property
    def budget(self) -> int:
        return self.stages[-1]

    @property
    def n_looks(self) -> int:
        return len(self.stages)

    def limited_to(self, available: int) -> "SequentialPlan":
        """The same plan for a task with only ``available`` questions (the budget shrinks)."""
        if available >= self.budget:
            return self
        if available <= 0:
            raise ValueError(f"no questions available ({available})")
        stages = tuple(s for s in self.stages if s < available) + (int(available),)
        return dataclasses.replace(self, stages=stages)

    def look_of(self, n: int) -> int:
        """The look (1-based) that ``n`` cumulative questions make: the first stage >= n."""
        for k, stage in enumerate(self.stages, start=1):
            if n <= stage:
                return k
        return self.n_looks

    def _spent(self, spending: str, alpha: float, look: int, n: int | None,
               previous_n: int | None) -> float:
        """alpha_k = a(t_k) - a(t_{k-1}); the last look spends all that is left."""
        spend = SPENDING_FUNCTIONS[spending]
        if look == 1:
            before = 0.0
        else:
            previous = self.stages[look - 2] if previous_n is None else previous_n
            before = spend(alpha, min(previous / self.budget, 1.0))
        if look >= self.n_looks or (n is not None and n >= self.budget):
            return max(alpha - before, 0.0)
        t = (self.stages[look - 1] if n is None else n) / self.budget
        return max(spend(alpha, t) - before, 0.0)

    def levels(self, look: int, n: int | None = None,
               previous_n: int | None = None) -> tuple[float, float]:
        """(alpha_fail_k, alpha_pass_k) at look ``look`` (1-based).

        By default the look and the one before it are at their planned stages; a look made
        after another number of questions ``n``, or following one made after ``previous_n``,
        spends by the actual information fractions (Lan-DeMets).
        """
        if not 1 <= look <= self.n_looks:
            raise ValueError(f"look must lie in 1..{self.n_looks}, got {look}")
        return (self._spent(self.fail_spending, self.alpha_fail, look, n, previous_n),
                self._spent(self.pass_spending, self.alpha_pass, look, n, previous_n))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["stages"] = list(self.stages)
        out["levels"] = [list(self.levels(k)) for k in range(1, self.n_looks + 1)]
        return out


def look_outcomes(plan: SequentialPlan, look: int, b: Any, c: Any,
                  n: int) -> tuple[np.ndarray, np.ndarray]:
    """(fails, passes): the rule of look ``look`` applied to arrays of cumulative b and c.

    The vectorised form of `evaluate_look` (same tests, same levels), for exact operating
    characteristics and simulation: McNemar p = P(X >= b | X ~ Binomial(b + c, 1/2)) and the
    Tango non-inferiority p-value Phi(Z(margin)).
    """
    alpha_fail, alpha_pass = plan.levels(look, n)
    b, c = np.asarray(b), np.asarray(c)
    mcnemar_p = sps.binom.sf(b - 1, b + c, 0.5)
    fails = mcnemar_p <= alpha_fail
    ni_p = sps.norm.cdf(ni.tango_score(b, c, n, plan.margin))
    return fails, ~fails & (ni_p <= alpha_pass)


def _pts(x: float) -> str:
    return f"{100.0 * x:.1f}"


def _signed(x: float) -> str:
    return f"{100.0 * x:+.1f}".replace("-", "−")


def _confidence(alpha: float) -> str:
    """1 - alpha as a percentage, its shortfall to two digits: 99 %, 99.03 %, 99.973 %."""
    if alpha <= 0.0:
        return "100 %"
    digits = max(0, 1 - math.floor(math.log10(100.0 * alpha)))
    return f"{100.0 * (1.0 - alpha):.{digits}f}".rstrip("0").rstrip(".") + " %"


@dataclass(frozen=True)
class LookDecision:
    """What one look decided, with every number behind it."""

    decision: str               # PASS | FAIL | CONTINUE | INCONCLUSIVE
    look: int                   # 1-based
    n_looks: int
    n: int
    baseline_only: int          # b
    pd_only: int                # c
    drop: float                 # (b - c) / n; positive: P/D is worse
    drop_upper: float           # upper (1 - alpha_pass_look) bound of the drop (PASS: <= margin)
    drop_lower: float           # lower (1 - alpha_fail_look) bound of the drop
    margin: float
    mcnemar_p: float            # one-sided exact (FAIL: <= alpha_fail_look)
    noninferiority_p: float     # Tango score test of drop >= margin (PASS: <= alpha_pass_look)
    alpha_fail_look: float
    alpha_pass_look: float
    budget: int
    next_n: int | None          # CONTINUE: cumulative questions of the next look
    text: str = field(default="", compare=False)

    @property
    def final(self) -> bool:
        return self.decision != CONTINUE

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _text(d: LookDecision) -> str:
    at = f"at look {d.look} of {d.n_looks} (n = {d.n})"
    change = (f"P/D {_signed(-d.drop)} pts ({d.baseline_only} questions lost, {d.pd_only} "
              f"gained)")
    worse = (f"McNemar p = {d.mcnemar_p:.2g} {'≤' if d.decision == FAIL else '>'} "
             f"{d.alpha_fail_look:.2g}")
    if d.decision == PASS:
        return (f"P/D is not worse than the baseline by more than {_pts(d.margin)} pts "
                f"({_confidence(d.alpha_pass_look)} upper bound of the drop "
                f"{_pts(d.drop_upper)} pts, n = {d.n})")
    if d.decision == FAIL:
        high = ni.drop_upper_bound(d.baseline_only, d.pd_only, d.n, 1.0 - d.alpha_fail_look)
        return (f"P/D is worse: {_signed(-d.drop)} pts [{_signed(-high)}, "
                f"{_signed(-d.drop_lower)}] ({_confidence(2.0 * d.alpha_fail_look)} "
                f"interval; {d.baseline_only} questions lost, {d.pd_only} gained), {worse} {at}")
    if d.decision == CONTINUE:
        return (f"undecided {at}: {change}; the {_confidence(d.alpha_pass_look)} upper bound "
                f"of the drop, {_pts(d.drop_upper)} pts, exceeds the margin {_pts(d.margin)}; "
                f"{worse}; continue to {d.next_n} questions")
    return (f"inconclusive at the budget of {d.n} questions: the drop is at most "
            f"{_pts(d.drop_upper)} pts ({_confidence(d.alpha_pass_look)} bound), margin "
            f"{_pts(d.margin)}; {change}, {worse}")


def evaluate_look(plan: SequentialPlan, b: int, c: int, n: int, look: int | None = None,
                  previous_n: int | None = None) -> LookDecision:
    """Apply the rule to the cumulative counts after ``n`` questions.

    ``look`` defaults to `SequentialPlan.look_of` (n is normally exactly a stage);
    ``previous_n`` is needed only when the look before was not made at its planned stage. A
    look at n >= budget, or at the last stage, is final: INCONCLUSIVE instead of CONTINUE.
    """
    b, c, n = ni.check_counts(b, c, n)
    look = plan.look_of(n) if look is None else int(look)
    alpha_fail, alpha_pass = plan.levels(look, n, previous_n)
    mcnemar = mcnemar_worse(b, c)
    test = ni.noninferiority(b, c, n, plan.margin, alpha_pass)
    final = look >= plan.n_looks or n >= plan.budget
    if mcnemar.p_value <= alpha_fail:
        decision = FAIL
    elif test.noninferior:
        decision = PASS
    else:
        decision = INCONCLUSIVE if final else CONTINUE
    result = LookDecision(
        decision=decision, look=look, n_looks=plan.n_looks, n=n, baseline_only=b, pd_only=c,
        drop=(b - c) / n, drop_upper=test.upper_bound,
        drop_lower=ni.drop_lower_bound(b, c, n, 1.0 - alpha_fail), margin=plan.margin,
        mcnemar_p=mcnemar.p_value, noninferiority_p=test.p_value, alpha_fail_look=alpha_fail,
        alpha_pass_look=alpha_pass, budget=plan.budget,
        next_n=plan.stages[look] if decision == CONTINUE else None)
    return dataclasses.replace(result, text=_text(result))


def count_discordant(baseline_correct: Sequence[bool],
                     pd_correct: Sequence[bool]) -> tuple[int, int, int]:
    """(b, c, n) of paired correctness vectors."""
    base = np.asarray(baseline_correct, dtype=bool)
    pd = np.asarray(pd_correct, dtype=bool)
    if base.shape != pd.shape or base.ndim != 1:
        raise ValueError(f"paired vectors differ in shape: {base.shape} vs {pd.shape}")
    return int(np.sum(base & ~pd)), int(np.sum(~base & pd)), int(base.size)


def walk(plan: SequentialPlan, baseline_correct: Sequence[bool],
         pd_correct: Sequence[bool]) -> list[LookDecision]:
    """Every look the plan makes on these questions (in order) until one decides.

    The plan is first `limited_to` the number of questions given, so the last look uses all.
    """
    plan = plan.limited_to(len(baseline_correct))
    looks = []
    for stage in plan.stages:
        b, c, n = count_discordant(baseline_correct[:stage], pd_correct[:stage])
        looks.append(evaluate_look(plan, b, c, n))
        if looks[-1].final:
            break
    return looks
