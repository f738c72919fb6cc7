"""Statistics the verdict rests on: pure functions, no I/O.

Every question is answered twice, by the non-disaggregated baseline and by the P/D pair, so the
outcomes are *paired*. Throughout this module

    b = #(baseline correct, P/D wrong)     -- "baseline_only"
    c = #(baseline wrong,   P/D correct)   -- "pd_only"

and the question asked is one-sided: "is P/D worse than the baseline?". Only discordant pairs
carry information about that, which is why McNemar's test (an exact binomial test on b out of
b + c) is the primary test, and why its power depends on how many pairs disagree by chance.

Library calls do the arithmetic wherever one exists (scipy.stats.binomtest / binom / bootstrap /
fisher_exact, statsmodels mcnemar / proportion_confint, numpy percentiles); the code here only
states the model and the decisions around degenerate inputs.

Minimum detectable effect (one-sided exact McNemar, alpha = 0.01, power 0.8), from
``python -m harness.judge.stats``; delta is the absolute accuracy drop, base_discordance the fraction of
questions on which baseline and P/D disagree in correctness by chance:

    n      base_discordance=0   base_discordance=0.05
    50     0.177                0.239
    100    0.090                0.138
    200    0.046                0.083
    500    0.019                0.045
    1000   0.010                0.029
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.proportion import proportion_confint

from harness.judge.saw_tooth import smallest_stable_n

__all__ = [
    "McNemarResult", "DeltaCI", "FloorTest",
    "mcnemar_worse", "paired_bootstrap_delta_ci", "mcnemar_power", "minimum_detectable_effect",
    "required_sample_size", "disagreement_exceeds_floor", "below_reference", "accuracy",
    "wilson_ci", "plain",
]


def plain(value: Any) -> Any:
    """Make dataclass fields JSON-friendly (tuples -> lists, numpy scalars -> Python)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")


# ---------------------------------------------------------------------------------------------
# 1. McNemar: is P/D worse?
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar test of "P/D is worse" on the discordant pairs."""

    baseline_only: int          # b: baseline right, P/D wrong
    pd_only: int                # c: baseline wrong, P/D right
    p_value: float              # one-sided exact: P(X >= b | X ~ Binomial(b + c, 1/2))
    p_value_two_sided: float    # statsmodels exact two-sided, for reference only
    chi2_statistic: float       # (b - c)^2 / (b + c), uncorrected, for reference only

    @property
    def n_discordant(self) -> int:
        return self.baseline_only + self.pd_only

    def to_dict(self) -> dict[str, Any]:
        out = plain(dataclasses.asdict(self))
        out["n_discordant"] = self.n_discordant
        return out


def mcnemar_worse(b: int, c: int) -> McNemarResult:
    """One-sided exact McNemar test for "P/D is worse than the baseline".

    Under H0 (no difference) each discordant pair is equally likely to favour either side, so
    b ~ Binomial(b + c, 1/2); the p-value is P(X >= b), from ``scipy.stats.binomtest`` with
    ``alternative="greater"``. With no discordant pairs there is no evidence at all: p = 1.
    """
    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    if b + c == 0:
        # statsmodels' chi-square divides by zero here; the answer is known: no evidence.
        return McNemarResult(b, c, 1.0, 1.0, 0.0)
    p_one = float(sps.binomtest(b, b + c, 0.5, alternative="greater").pvalue)
    table = [[0, b], [c, 0]]  # McNemar uses only the off-diagonal cells
    p_two = float(sm_mcnemar(table, exact=True).pvalue)
    chi2 = float(sm_mcnemar(table, exact=False, correction=False).statistic)
    return McNemarResult(b, c, p_one, p_two, chi2)


# ---------------------------------------------------------------------------------------------
# 2. Paired bootstrap CI of the accuracy delta
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeltaCI:
    """Confidence interval of mean(P/D correct) - mean(baseline correct)."""

    delta: float                # observed pd accuracy - baseline accuracy
    low: float
    high: float
    confidence: float
    method: str                 # "BCa" | "percentile" | "degenerate" (all pair differences equal)
    n: int
    n_resamples: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return plain(dataclasses.asdict(self))


def _as_bool_array(values: Sequence[bool], name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional")
    return arr.astype(bool)


def paired_bootstrap_delta_ci(
    baseline_correct: Sequence[bool],
    pd_correct: Sequence[bool],
    confidence: float = 0.95,
    n_resamples: int = 10000,
    seed: int = 0,
) -> DeltaCI:
    """Paired bootstrap CI (``scipy.stats.bootstrap(paired=True)``) of the accuracy delta.

    Questions are resampled as pairs, so the CI reflects the paired design. BCa is tried first;
    when scipy reports a degenerate bootstrap distribution (warning or NaN bound) the percentile
    interval is used instead. When every pair has the same difference (e.g. all pairs agree) the
    bootstrap distribution is a single point and the CI is [delta, delta], returned without
    calling scipy (which would warn). Deterministic for a fixed ``seed``.
    """
    base = _as_bool_array(baseline_correct, "baseline_correct")
    pd = _as_bool_array(pd_correct, "pd_correct")
    if base.shape != pd.shape:
        raise ValueError(f"paired samples differ in length: {base.size} vs {pd.size}")
    if base.size == 0:
        raise ValueError("no pairs: the accuracy delta is undefined")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    differences = pd.astype(float) - base.astype(float)
    delta = float(differences.mean())
    if np.all(differences == differences[0]):
        return DeltaCI(delta, delta, delta, confidence, "degenerate", int(base.size),
                       n_resamples, seed)

    def mean_delta(base_sample: np.ndarray, pd_sample: np.ndarray, axis: int = -1) -> np.ndarray:
        return pd_sample.mean(axis=axis) - base_sample.mean(axis=axis)

    data = (base.astype(float), pd.astype(float))
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = sps.bootstrap(
                data, mean_delta, paired=True, vectorized=True, n_resamples=n_resamples,
                confidence_level=confidence, method=method, rng=np.random.default_rng(seed),
            )
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        degenerate = any(issubclass(w.category, sps.DegenerateDataWarning) for w in caught)
        if not degenerate and math.isfinite(low) and math.isfinite(high):
            return DeltaCI(delta, low, high, confidence, method, int(base.size), n_resamples, seed)
    raise RuntimeError(f"bootstrap failed for n={base.size}, delta={delta}")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# 3. Power and minimum detectable effect of the one-sided exact McNemar test
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _critical_b(n: int, alpha: float) -> np.ndarray:
    """For D = 0..n discordant pairs, the smallest b with binomtest(b, D, greater).pvalue <= alpha.

    The binomtest p-value is binom.sf(b - 1, D, 1/2), non-increasing in b, so the critical b is
    isf(alpha) + 1; one fix-up pass on each side guards against isf's floating-point rounding.
    A value > D means no b can reject at that D.
    """
    discordant = np.arange(n + 1)
    crit = sps.binom.isf(alpha, discordant, 0.5).astype(np.int64) + 1
    # too small: the p-value at crit is still above alpha
    crit = np.where(sps.binom.sf(crit - 1, discordant, 0.5) > alpha, crit + 1, crit)
    # too large: crit - 1 already rejects
    crit = np.where(sps.binom.sf(crit - 2, discordant, 0.5) <= alpha, crit - 1, crit)
    crit.setflags(write=False)
    return crit


def mcnemar_power(n: int, delta: float, base_discordance: float, alpha: float) -> float:
    """Exact power of the one-sided exact McNemar test at level ``alpha`` with ``n`` pairs.

    Model of a regression of size ``delta`` (absolute accuracy drop): pairs disagree by chance
    with probability ``base_discordance``, split evenly between b and c, and the regression adds
    ``delta`` more pairs of type b. So D = b + c ~ Binomial(n, psi) with
    psi = min(base_discordance + delta, 1), and given D, b ~ Binomial(D, (psi + delta) / (2 psi)).
    power = sum_D P(D) * P(b >= critical_b(D) | D), computed exactly (vectorised over D).
    """
    _check_alpha(alpha)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must lie in [0, 1], got {delta}")
    if not 0.0 <= base_discordance <= 1.0:
        raise ValueError(f"base_discordance must lie in [0, 1], got {base_discordance}")
    n = int(n)
    psi = min(base_discordance + delta, 1.0)
    # psi == 0: no pair ever disagrees, D == 0, nothing can be rejected; 1/2 only avoids 0/0.
    share_b = min((psi + delta) / (2.0 * psi), 1.0) if psi > 0 else 0.5
    discordant = np.arange(n + 1)
    crit = _critical_b(n, float(alpha))
    p_discordant = sps.binom.pmf(discordant, n, psi)
    p_reject_given_d = sps.binom.sf(crit - 1, discordant, share_b)
    power = float(np.sum(p_discordant * p_reject_given_d))
    return min(max(power, 0.0), 1.0)


def minimum_detectable_effect(
    n: int, alpha: float, power: float = 0.8, base_discordance: float = 0.0,
    tolerance: float = 1e-3,
) -> float:
    """Smallest accuracy drop delta in (0, 1] that the test detects with at least ``power``.

    Bisection on delta (power is monotone in delta under the model of `mcnemar_power`) to within
    ``tolerance``; the returned value is the upper end of the final bracket, so
    ``mcnemar_power(n, mde, ...) >= power`` always holds. Returns ``math.inf`` (not 1.0) when even
    delta = 1 is not detectable, e.g. for tiny n at small alpha: "no drop is detectable" must not
    read as "a 100% drop is".
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if mcnemar_power(n, 1.0, base_discordance, alpha) < power:
        return math.inf
    lo, hi = 0.0, 1.0  # power(lo) < target (power(0) <= alpha < target), power(hi) >= target
    while hi - lo > tolerance:
        mid = (lo + hi) / 2.0
        if mcnemar_power(n, mid, base_discordance, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def required_sample_size(
    delta: float, alpha: float, power: float = 0.8, base_discordance: float = 0.0,
    n_max: int = 100000, stability_window: int = 5,
) -> int:
    """Number of pairs needed to detect an accuracy drop ``delta`` with at least ``power``.

    Power of an exact test is not strictly monotone in n (it saw-tooths as the discrete
    critical value steps). The search doubles n until power >= target, bisects between the last
    failing and first passing n, and then walks forward to the smallest n >= that crossing
    from which power stays >= target for the next ``stability_window`` values of n
    (n, n+1, ..., n+stability_window-1). Raises ValueError when no n <= ``n_max`` qualifies.
    """
    if not 0.0 < delta <= 1.0:
        raise ValueError(f"delta must lie in (0, 1], got {delta}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if stability_window < 1:
        raise ValueError("stability_window must be >= 1")

    def passes(n: int) -> bool:
        return mcnemar_power(n, delta, base_discordance, alpha) >= power

    return smallest_stable_n(
        passes, n_max, stability_window,
        unreachable=f"delta={delta} is not detectable with power {power} at alpha={alpha} "
                    f"within n_max={n_max} pairs",
        unstable=f"power for delta={delta} does not stay >= {power} below n_max={n_max}")



# ---------------------------------------------------------------------------------------------
# 4. Noise floor: is P/D's disagreement rate above the A/A rate?
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FloorTest:
    """One-sided Fisher exact test: P/D-vs-baseline disagreement above the A/A disagreement."""

    pd_differing: int
    pd_total: int
    aa_differing: int
    aa_total: int
    pd_rate: float
    aa_rate: float
    p_value: float
    alpha: float

    @property
    def exceeds(self) -> bool:
        """True when P/D differs from the baseline significantly more often than A/A does."""
        return self.p_value <= self.alpha

    def to_dict(self) -> dict[str, Any]:
        out = plain(dataclasses.asdict(self))
        out["exceeds"] = self.exceeds
        return out


def disagreement_exceeds_floor(k_pd: int, n_pd: int, k_aa: int, n_aa: int,
                               alpha: float) -> FloorTest:
    """Is P/D's rate of generations differing from the baseline above the A/A noise floor?

    ``k_pd`` of ``n_pd`` P/D generations differ from the baseline's; ``k_aa`` of ``n_aa``
    generations differ when the baseline is compared with itself under another batching.
    Test: ``scipy.stats.fisher_exact([[k_pd, n_pd-k_pd], [k_aa, n_aa-k_aa]], "greater")``.
    """
    _check_alpha(alpha)
    for k, n, name in ((k_pd, n_pd, "pd"), (k_aa, n_aa, "aa")):
        if n <= 0 or not 0 <= k <= n:
            raise ValueError(f"{name}: need 0 <= k <= n and n > 0, got k={k}, n={n}")
    table = [[k_pd, n_pd - k_pd], [k_aa, n_aa - k_aa]]
    p_value = float(sps.fisher_exact(table, alternative="greater").pvalue)
    return FloorTest(int(k_pd), int(n_pd), int(k_aa), int(n_aa), k_pd / n_pd, k_aa / n_aa,
                     p_value, float(alpha))


def below_reference(correct: int, n: int, reference: float, tolerance: float) -> float:
    """p-value that a baseline with ``correct`` of ``n`` right scores below ``reference - tolerance``.

    ``reference`` is the model's accuracy measured elsewhere (its model card). One-sided exact
    binomial test ``scipy.stats.binomtest(correct, n, reference - tolerance, "less")``; a small
    p-value says the baseline server is broken on this configuration, before any P/D question.
    """
    if n <= 0 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n and n > 0, got correct={correct}, n={n}")
    floor = min(1.0, max(0.0, reference - tolerance))
    if floor <= 0.0:
        return 1.0
    return float(sps.binomtest(int(correct), int(n), floor, alternative="less").pvalue)


# ---------------------------------------------------------------------------------------------
# 5. Accuracy and its Wilson interval
# ---------------------------------------------------------------------------------------------
def accuracy(correct: Sequence[bool]) -> float:
    """Fraction of questions answered correctly; ValueError on an empty sequence."""
    arr = _as_bool_array(correct, "correct")
    if arr.size == 0:
        raise ValueError("accuracy of zero questions is undefined")
    return float(arr.mean())


def wilson_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (statsmodels ``proportion_confint``)."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    low, high = proportion_confint(k, n, alpha=1.0 - confidence, method="wilson")
    return float(low), float(high)


def _mde_table(alpha: float = 0.01, power: float = 0.8,
               sizes: Sequence[int] = (50, 100, 200, 500, 1000),
               discordances: Sequence[float] = (0.0, 0.05)) -> str:
    header = "n      " + "  ".join(f"base_discordance={d:<6g}" for d in discordances)
    rows = [f"MDE at alpha={alpha}, power={power} (one-sided exact McNemar)", header]
    for n in sizes:
        cells = "  ".join(
            f"{minimum_detectable_effect(n, alpha, power, d):<23.3f}" for d in discordances)
        rows.append(f"{n:<6} {cells}")
    return "\n".join(rows)


if __name__ == "__main__":
    print(_mde_table())
