"""How many questions a cell needs to PASS the non-inferiority gate, computed exactly.

Model of a cell: each question independently falls in one of three kinds, baseline right and
P/D wrong (probability p_b), baseline wrong and P/D right (p_c), or both the same. With a chance
discordance rate psi and a true drop Delta, p_c = psi / 2 and p_b = psi / 2 + Delta (the model
of `stats.mcnemar_power`). The baseline accuracy A bounds what is possible (p_b <= A,
p_c <= 1 - A); when psi is not given it defaults to 2 A (1 - A), the discordance of a P/D pair
that errs independently of the baseline at the same accuracy -- the most two unrelated equally
good systems show; a P/D pair that reproduces the baseline's computation shows far less.

Every probability here is an exact sum over the trinomial distribution of (b, c):

* `single_look` -- one look after n questions at the full levels;
* `operating_characteristics` -- the whole `sequential.SequentialPlan`: the distribution of
  cumulative (b, c) of the cells still undecided is carried from look to look by a 2-D
  convolution with the trinomial of the questions added (``scipy.signal.fftconvolve``), and the
  mass each look decides is removed. It gives P(PASS), P(FAIL), P(INCONCLUSIVE) and the expected
  number of questions without Monte-Carlo error;
* `simulate` -- the same by Monte Carlo on synthetic question-level data, to cross-check it.

    python -m harness.judge.power --baseline-accuracy 0.8 --margin 0.05 [--discordance 0.1]
        [--alpha 0.01] [--power 0.8] [--budget 1319] [--drop 0]
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import signal

from harness.judge import noninferiority as ni
from harness.judge.saw_tooth import smallest_stable_n
from harness.judge.sequential import SPENDING_FUNCTIONS, SequentialPlan, look_outcomes

__all__ = [
    "OperatingCharacteristics", "cell_probabilities", "default_discordance",
    "operating_characteristics", "simulate", "single_look", "questions_needed", "doubling_stages",
    "budget_needed", "main",
]


def default_discordance(baseline_accuracy: float) -> float:
    """2 A (1 - A): P/D wrong independently of the baseline, at the baseline's accuracy."""
    return 2.0 * baseline_accuracy * (1.0 - baseline_accuracy)


def cell_probabilities(baseline_accuracy: float, discordance: float | None = None,
                       drop: float = 0.0) -> tuple[float, float]:
    """(p_b, p_c) of the model above; ValueError when the accuracy makes them impossible."""
    if not 0.0 <= baseline_accuracy <= 1.0:
        raise ValueError(f"baseline accuracy must lie in [0, 1], got {baseline_accuracy}")
    psi = default_discordance(baseline_accuracy) if discordance is None else float(discordance)
    if psi < 0.0 or drop < 0.0:
        raise ValueError(f"discordance and drop must be >= 0, got {psi}, {drop}")
    p_b, p_c = psi / 2.0 + drop, psi / 2.0
    if p_b > baseline_accuracy + 1e-12 or p_c > 1.0 - baseline_accuracy + 1e-12:
        raise ValueError(
            f"a baseline at {baseline_accuracy:.3g} cannot lose {p_b:.3g} and gain {p_c:.3g} of "
            f"its questions (discordance {psi:.3g}, drop {drop:.3g})")
    return p_b, p_c


@dataclass(frozen=True)
class OperatingCharacteristics:
    """Exact probabilities of each outcome of a plan, for one (p_b, p_c)."""

    p_baseline_only: float
    p_pd_only: float
    stages: tuple[int, ...]
    pass_by_look: tuple[float, ...]
    fail_by_look: tuple[float, ...]
    inconclusive: float

    @property
    def p_pass(self) -> float:
        return float(sum(self.pass_by_look))

    @property
    def p_fail(self) -> float:
        return float(sum(self.fail_by_look))

    @property
    def expected_questions(self) -> float:
        stops = [p + f for p, f in zip(self.pass_by_look, self.fail_by_look)]
        stops[-1] += self.inconclusive
        return float(sum(n * p for n, p in zip(self.stages, stops)))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(p_pass=self.p_pass, p_fail=self.p_fail,
                   expected_questions=self.expected_questions)
        return out


def operating_characteristics(plan: SequentialPlan, p_baseline_only: float,
                              p_pd_only: float) -> OperatingCharacteristics:
    """P(PASS / FAIL at each look) and P(INCONCLUSIVE) of ``plan``, exactly (see module doc)."""
    undecided = np.ones((1, 1))             # P(b = 0, c = 0) = 1 before any question
    previous = 0
    passes, fails = [], []
    for look, stage in enumerate(plan.stages, start=1):
        added = ni.trinomial_pmf(stage - previous, p_baseline_only, p_pd_only)
        undecided = np.clip(signal.fftconvolve(undecided, added), 0.0, None)
        grid = np.arange(stage + 1)
        possible = grid[:, None] + grid[None, :] <= stage
        undecided = np.where(possible, undecided, 0.0)
        failed, passed = look_outcomes(plan, look, grid[:, None], grid[None, :], stage)
        fails.append(float(undecided[failed & possible].sum()))
        passes.append(float(undecided[passed & possible].sum()))
        undecided = np.where(failed | passed, 0.0, undecided)
        previous = stage
    return OperatingCharacteristics(float(p_baseline_only), float(p_pd_only), plan.stages,
                                    tuple(passes), tuple(fails), float(undecided.sum()))


def simulate(plan: SequentialPlan, baseline_accuracy: float, p_baseline_only: float,
             p_pd_only: float, reps: int, rng: np.random.Generator,
             batch: int = 2000) -> OperatingCharacteristics:
    """Monte-Carlo counterpart of `operating_characteristics`, question by question.

    Each replicate is a synthetic paired dataset of ``plan.budget`` questions: the baseline is
    right with probability ``baseline_accuracy``; P/D then misses a question the baseline got
    right with probability p_b / A and gets one the baseline missed with probability
    p_c / (1 - A). Each look counts b and c over the questions so far and applies
    `look_outcomes`. The result holds frequencies in place of probabilities.
    """
    accuracy = float(baseline_accuracy)
    lose = p_baseline_only / accuracy if accuracy > 0 else 0.0
    gain = p_pd_only / (1.0 - accuracy) if accuracy < 1 else 0.0
    passes = np.zeros(plan.n_looks)
    fails = np.zeros(plan.n_looks)
    undecided_total = 0
    for start in range(0, reps, batch):
        size = min(batch, reps - start)
        base = rng.random((size, plan.budget)) < accuracy
        draw = rng.random((size, plan.budget))
        pd = np.where(base, draw >= lose, draw < gain)
        lost = np.cumsum(base & ~pd, axis=1)
        gained = np.cumsum(~base & pd, axis=1)
        undecided = np.ones(size, dtype=bool)
        for look, stage in enumerate(plan.stages, start=1):
            failed, passed = look_outcomes(plan, look, lost[:, stage - 1], gained[:, stage - 1],
                                           stage)
            fails[look - 1] += np.sum(undecided & failed)
            passes[look - 1] += np.sum(undecided & passed)
            undecided &= ~(failed | passed)
        undecided_total += int(undecided.sum())
    return OperatingCharacteristics(float(p_baseline_only), float(p_pd_only), plan.stages,
                                    tuple(passes / reps), tuple(fails / reps),
                                    undecided_total / reps)


def single_look(n: int, p_baseline_only: float, p_pd_only: float,
                margin: float = ni.DEFAULT_MARGIN,
                alpha: float = ni.DEFAULT_ALPHA) -> OperatingCharacteristics:
    """One look after ``n`` questions, FAIL and PASS each at the full level ``alpha``."""
    plan = SequentialPlan(stages=(int(n),), margin=margin, alpha_fail=alpha, alpha_pass=alpha)
    return operating_characteristics(plan, p_baseline_only, p_pd_only)


def questions_needed(p_baseline_only: float, p_pd_only: float, margin: float = ni.DEFAULT_MARGIN,
                     alpha: float = ni.DEFAULT_ALPHA, power: float = 0.8, n_max: int = 100000,
                     stability_window: int = 3) -> int:
    """Fewest questions for a single look to PASS with probability >= ``power``.

    P(PASS) of a discrete test saw-tooths in n; the search doubles n, bisects to the first
    crossing, then walks forward until ``stability_window`` consecutive n all reach ``power``.
    Raises ValueError when no n <= ``n_max`` does.
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")

    def reaches(n: int) -> bool:
        return single_look(n, p_baseline_only, p_pd_only, margin, alpha).p_pass >= power

    return smallest_stable_n(reaches, n_max, stability_window,
                             unreachable=f"power {power} is out of reach below {n_max} questions",
                             unstable=f"power {power} does not hold below {n_max} questions")


def doubling_stages(budget: int, first: int = 50) -> tuple[int, ...]:
    """first, 2 first, 4 first, ... below ``budget``, then the budget: (50, 100, 200, 400, 800,
    1319) for GSM8K's 1319 questions."""
    stages = []
    stage = first
    while stage < budget:
        stages.append(stage)
        stage *= 2
    return tuple(stages) + (int(budget),)


def budget_needed(p_baseline_only: float, p_pd_only: float, plan: SequentialPlan,
                  power: float = 0.8, n_max: int = 100000) -> int:
    """Smallest budget whose doubling plan (``plan``'s levels and spending) PASSes with
    probability >= ``power``, by bisection (the saw-tooth is left to the reader: check nearby
    budgets with `operating_characteristics` before relying on the last few questions)."""

    def reaches(budget: int) -> bool:
        candidate = dataclasses.replace(plan, stages=doubling_stages(budget, plan.stages[0]))
        return operating_characteristics(candidate, p_baseline_only, p_pd_only).p_pass >= power

    lo, hi = plan.stages[0], plan.stages[0]
    while not reaches(hi):
        if hi >= n_max:
            raise ValueError(f"power {power} is out of reach below a budget of {n_max}")
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi


def _report(args: argparse.Namespace) -> list[str]:
    p_b, p_c = cell_probabilities(args.baseline_accuracy, args.discordance, args.drop)
    psi = p_b + p_c - args.drop
    lines = [f"baseline accuracy {args.baseline_accuracy:.3g}, chance discordance {psi:.3g}"
             f"{' (independent errors)' if args.discordance is None else ''}, true drop "
             f"{100 * args.drop:.1f} pts, margin {100 * args.margin:.1f} pts, "
             f"alpha {args.alpha:g}, power {args.power:g} (exact trinomial sums)"]
    try:
        n = questions_needed(p_b, p_c, args.margin, args.alpha, args.power)
        lines.append(f"single look: {n} questions"
                     + ("" if n <= args.budget else f" (more than the budget of {args.budget})"))
    except ValueError as exc:
        lines.append(f"single look: {exc}")
    plan = SequentialPlan(stages=doubling_stages(args.budget), margin=args.margin,
                          alpha_fail=args.alpha, alpha_pass=args.alpha,
                          fail_spending=args.spending, pass_spending=args.spending)
    oc = operating_characteristics(plan, p_b, p_c)
    stages = ", ".join(str(s) for s in plan.stages)
    lines.append(f"sequential ({args.spending} spending, looks at {stages}): P(PASS) "
                 f"{oc.p_pass:.3f}, P(FAIL) {oc.p_fail:.2g}, P(INCONCLUSIVE) "
                 f"{oc.inconclusive:.3f}, expected questions {oc.expected_questions:.0f}")
    if oc.p_pass < args.power:
        try:
            budget = budget_needed(p_b, p_c, plan, args.power)
            lines.append(f"sequential: a budget of {budget} questions reaches power "
                         f"{args.power:g}")
        except ValueError as exc:
            lines.append(f"sequential: {exc}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.judge.power", description=(
        "Questions a cell needs to PASS the non-inferiority gate when P/D is as good as the "
        "baseline (exact computation)."))
    parser.add_argument("--baseline-accuracy", type=float, required=True)
    parser.add_argument("--margin", type=float, default=ni.DEFAULT_MARGIN,
                        help="largest acceptable drop, as a fraction (default 0.05 = 5 pts)")
    parser.add_argument("--discordance", type=float, default=None,
                        help="chance rate of questions the two get differently right "
                             "(default: 2 A (1 - A), independent errors)")
    parser.add_argument("--alpha", type=float, default=ni.DEFAULT_ALPHA)
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--budget", type=int, default=1319,
                        help="most questions a cell may use (default: GSM8K's 1319)")
    parser.add_argument("--drop", type=float, default=0.0, help="true drop (default 0)")
    parser.add_argument("--spending", default=SequentialPlan.pass_spending,
                        choices=sorted(SPENDING_FUNCTIONS))
    args = parser.parse_args(argv)
    try:
        print("\n".join(_report(args)))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
