"""Non-inferiority of P/D against the baseline: a confidence bound on the paired accuracy drop.

Each question is answered by the baseline and by the P/D pair, so the outcomes are paired:

    b = #(baseline right, P/D wrong)     c = #(baseline wrong, P/D right)     n = #questions

and the accuracy drop is Delta = p_b - p_c, estimated by (b - c) / n (positive: P/D is worse).
"P/D is not worse by more than the margin delta" is the one-sided hypothesis H1: Delta < delta
against H0: Delta >= delta; it holds at level alpha when the upper (1 - alpha) confidence bound
of Delta is <= delta.

Method: Tango's asymptotic score interval (Tango 1998, Stat Med 17:891-908, eq. 3-5), which
inverts the score test of H0: Delta = d0 for the paired design,

    Z(d0) = (b - c - n d0) / sqrt(n (2 q + d0 (1 - d0)))

where q is the maximum-likelihood estimate of p_c under the constraint p_b - p_c = d0, the
positive root of 2n q^2 + (-(b + c) + (2n - b + c) d0) q - c d0 (1 - d0) = 0. The upper bound is
the d0 > (b - c)/n with Z(d0) = -z_{1-alpha} (``scipy.optimize.brentq``); the test decision uses
the p-value Phi(Z(delta)) directly, so it needs no root. Why this one:

* it is the test behind the decision (a non-inferiority score test; Tango's paper is about
  exactly that), so bound and decision cannot disagree, and its p-value is one line;
* it uses all n pairs, the randomness of b + c included (the conditional Clopper-Pearson bound
  on b / (b + c) does not, and cannot be turned into a bound on Delta without a bound on the
  discordance rate);
* b = c = 0 gives the finite bound z^2 / (n + z^2) (the Wilson bound of a zero count), which
  shrinks like 1/n: at 99 % it is 9.8 pts at n = 50, and it first drops to <= 5 pts at n = 103;
  see `clean_upper_bound` and `questions_for_clean_pass`;
* Fagerland, Lydersen & Laake (2014, Stat Med 33:2850-75) recommend it among the intervals for
  a paired difference; the tests reproduce their published numbers.

The interval is asymptotic, so its one-sided error is not guaranteed below alpha. Computed
exactly by enumerating the trinomial (`rejection_probability`), the probability of a false
non-inferiority claim at Delta = delta (= 0.05) is <= alpha whenever the discordance
p_b + p_c - delta is <= 15 %, for n = 50..1319 and alpha from 0.01 down to 6e-4 (conservative
there, the more so the smaller n and the discordance); it reaches 1.03 alpha at 20-30 %
discordance and up to 1.4 alpha (n = 50) only at 30-95 %, far above what a model shows against
itself. ``scripts/simulate_noninferiority.py`` records that table, and the tests repeat it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, stats as sps

__all__ = [
    "NonInferiority", "tango_score", "drop_upper_bound", "drop_lower_bound", "drop_interval",
    "noninferiority", "clean_upper_bound", "questions_for_clean_pass", "trinomial_pmf",
    "rejection_probability",
]

DEFAULT_MARGIN = 0.05
DEFAULT_ALPHA = 0.01


def check_counts(b: int, c: int, n: int) -> tuple[int, int, int]:
    """(b, c, n) as ints; ValueError unless 0 <= b, c and b + c <= n, n > 0."""
    b, c, n = int(b), int(c), int(n)
    if n <= 0 or b < 0 or c < 0 or b + c > n:
        raise ValueError(f"need b, c >= 0 and 0 < b + c <= n, got b={b}, c={c}, n={n}")
    return b, c, n


def _check_level(alpha: float, name: str = "alpha") -> float:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"{name} must lie in (0, 1), got {alpha}")
    return float(alpha)


def tango_score(b: Any, c: Any, n: int, drop: float) -> np.ndarray:
    """Tango's score statistic Z(drop) for H0: p_b - p_c = drop; vectorised over b and c.

    Large negative values are evidence that the true drop is below ``drop``. Where the
    constrained variance is 0 (drop = 0 with b = c = 0, or drop = +-1) Z is 0 if the numerator
    is 0 and +-inf otherwise.
    """
    b = np.asarray(b, dtype=float)
    c = np.asarray(c, dtype=float)
    d = float(drop)
    linear = -b - c + (2.0 * n - b + c) * d
    constant = -c * d * (1.0 - d)
    # positive root of 2n q^2 + linear q + constant = 0 (constant <= 0, so the root is >= 0)
    q = (np.sqrt(np.maximum(linear * linear - 8.0 * n * constant, 0.0)) - linear) / (4.0 * n)
    variance = n * (2.0 * q + d * (1.0 - d))
    numerator = b - c - n * d
    with np.errstate(divide="ignore", invalid="ignore"):
        z = numerator / np.sqrt(variance)
    degenerate = ~(variance > 0.0)
    if np.any(degenerate):
        limit = np.where(numerator > 0.0, np.inf, np.where(numerator < 0.0, -np.inf, 0.0))
        z = np.where(degenerate, limit, z)
    return z


def drop_upper_bound(b: int, c: int, n: int, confidence: float = 1 - DEFAULT_ALPHA) -> float:
    """Upper ``confidence`` bound of the drop Delta = p_b - p_c (Tango's score bound)."""
    b, c, n = check_counts(b, c, n)
    z = sps.norm.isf(1.0 - _check_level(confidence, "confidence"))
    estimate = (b - c) / n
    if b == n:
        return 1.0
    # Z(estimate) = 0 > -z and Z -> -inf as d -> 1, and Z falls monotonically in between
    hi = math.nextafter(1.0, 0.0)
    return float(optimize.brentq(lambda d: float(tango_score(b, c, n, d)) + z, estimate, hi,
                                 xtol=1e-12, rtol=1e-12))


def drop_lower_bound(b: int, c: int, n: int, confidence: float = 1 - DEFAULT_ALPHA) -> float:
    """Lower ``confidence`` bound of the drop (the mirror image: swap b and c)."""
    return -drop_upper_bound(c, b, n, confidence)


def drop_interval(b: int, c: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Tango interval of the drop: each tail holds (1 - confidence) / 2."""
    one_sided = 1.0 - (1.0 - _check_level(confidence, "confidence")) / 2.0
    return drop_lower_bound(b, c, n, one_sided), drop_upper_bound(b, c, n, one_sided)


@dataclass(frozen=True)
class NonInferiority:
    """Tango score test of H0: drop >= margin, with the matching upper bound of the drop."""

    baseline_only: int          # b
    pd_only: int                # c
    n: int
    drop: float                 # (b - c) / n; positive: P/D is worse
    upper_bound: float          # upper (1 - alpha) bound of the drop
    margin: float
    alpha: float
    p_value: float              # Phi(Z(margin)); <= alpha exactly when upper_bound <= margin
    method: str = "tango-score"

    @property
    def noninferior(self) -> bool:
        return self.p_value <= self.alpha

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["noninferior"] = self.noninferior
        return out


def noninferiority(b: int, c: int, n: int, margin: float = DEFAULT_MARGIN,
                   alpha: float = DEFAULT_ALPHA) -> NonInferiority:
    """Is P/D's accuracy at most ``margin`` below the baseline's, at level ``alpha``?"""
    b, c, n = check_counts(b, c, n)
    _check_level(alpha)
    if not 0.0 < margin < 1.0:
        raise ValueError(f"margin must lie in (0, 1), got {margin}")
    p_value = float(sps.norm.cdf(tango_score(b, c, n, margin)))
    return NonInferiority(b, c, n, (b - c) / n, drop_upper_bound(b, c, n, 1.0 - alpha),
                          float(margin), float(alpha), p_value)


def clean_upper_bound(n: int, confidence: float = 1 - DEFAULT_ALPHA) -> float:
    """The upper bound when every pair agrees (b = c = 0): z^2 / (n + z^2), z = z_confidence."""
    z2 = sps.norm.isf(1.0 - _check_level(confidence, "confidence")) ** 2
    return z2 / (n + z2)


def questions_for_clean_pass(margin: float = DEFAULT_MARGIN,
                             confidence: float = 1 - DEFAULT_ALPHA) -> int:
    """Fewest questions, all agreeing, whose upper bound is <= margin: ceil(z^2 (1 - m) / m)."""
    z2 = sps.norm.isf(1.0 - _check_level(confidence, "confidence")) ** 2
    n = math.ceil(z2 * (1.0 - margin) / margin)
    return n if clean_upper_bound(n, confidence) <= margin else n + 1  # floating-point guard


def trinomial_pmf(n: int, p_baseline_only: float, p_pd_only: float) -> np.ndarray:
    """P(b, c) as an (n+1) x (n+1) array indexed [b, c] (0 where b + c > n).

    b ~ Binomial(n, p_b) and, given b, c ~ Binomial(n - b, p_c / (1 - p_b)): two
    ``scipy.stats.binom`` pmfs, stable where a multinomial coefficient would overflow.
    """
    if p_baseline_only < 0 or p_pd_only < 0 or p_baseline_only + p_pd_only > 1 + 1e-12:
        raise ValueError(f"need p_b, p_c >= 0 and p_b + p_c <= 1, got {p_baseline_only}, "
                         f"{p_pd_only}")
    counts = np.arange(n + 1)
    p_b = sps.binom.pmf(counts, n, p_baseline_only)
    rest = 1.0 - p_baseline_only
    share_c = min(p_pd_only / rest, 1.0) if rest > 0 else 0.0
    p_c_given_b = sps.binom.pmf(counts[None, :], (n - counts)[:, None], share_c)
    return p_b[:, None] * p_c_given_b


def rejection_probability(n: int, p_baseline_only: float, p_pd_only: float,
                          margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA) -> float:
    """Exact probability that `noninferiority` claims non-inferiority with n questions.

    Sums the trinomial over every (b, c) the test accepts as non-inferior. At
    p_b - p_c >= margin it is the test's real error rate (compare with alpha); at
    p_b - p_c < margin it is its power.
    """
    grid = np.arange(n + 1)
    z = tango_score(grid[:, None], grid[None, :], n, margin)
    accepts = (sps.norm.cdf(z) <= alpha) & (grid[:, None] + grid[None, :] <= n)
    return float(np.sum(trinomial_pmf(n, p_baseline_only, p_pd_only)[accepts]))
