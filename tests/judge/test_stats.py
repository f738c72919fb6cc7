"""Known-value tests for harness.judge.stats (textbook examples, hand-checkable exact cases)."""
from __future__ import annotations

import json
import math
import warnings

import pytest
from scipy import stats as sps

from harness.judge.stats import (
    DeltaCI, accuracy, disagreement_exceeds_floor, mcnemar_power, mcnemar_worse,
    minimum_detectable_effect, paired_bootstrap_delta_ci, required_sample_size, wilson_ci,
)


# ---- McNemar ---------------------------------------------------------------------------------
def test_mcnemar_agresti_presidential_approval():
    # Agresti, Categorical Data Analysis: approval table (794, 150, 86, 570).
    # Chi-square without continuity correction: (150 - 86)^2 / 236 = 17.36.
    result = mcnemar_worse(150, 86)
    assert result.chi2_statistic == pytest.approx(17.356, abs=1e-3)
    # exact two-sided = 2 * P(X <= 86 | 236, 1/2)
    assert result.p_value_two_sided == pytest.approx(3.7159e-05, rel=1e-4)
    # one-sided "worse" is half of the symmetric two-sided value
    assert result.p_value == pytest.approx(result.p_value_two_sided / 2, rel=1e-9)
    assert result.n_discordant == 236


def test_mcnemar_small_exact_case():
    # P(X >= 10 | 12, 1/2) = (C(12,10) + C(12,11) + C(12,12)) / 2^12 = 79 / 4096
    result = mcnemar_worse(10, 2)
    assert result.p_value == pytest.approx(79 / 4096, rel=1e-12)
    assert result.p_value == pytest.approx(0.019287, abs=1e-6)


@pytest.mark.parametrize("k", [1, 3, 10, 50])
def test_mcnemar_balanced_is_not_evidence(k):
    assert mcnemar_worse(k, k).p_value >= 0.5


def test_mcnemar_p_decreases_as_pd_gets_worse():
    p_values = [mcnemar_worse(b, 10).p_value for b in range(10, 30, 4)]
    assert p_values == sorted(p_values, reverse=True)
    assert p_values[-1] < p_values[0]


def test_mcnemar_no_discordant_pairs():
    result = mcnemar_worse(0, 0)
    assert (result.p_value, result.p_value_two_sided, result.chi2_statistic) == (1.0, 1.0, 0.0)
    assert json.loads(json.dumps(result.to_dict())) == {
        "baseline_only": 0, "pd_only": 0, "p_value": 1.0, "p_value_two_sided": 1.0,
        "chi2_statistic": 0.0, "n_discordant": 0}


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(ValueError):
        mcnemar_worse(-1, 3)


# ---- paired bootstrap ------------------------------------------------------------------------
def _pairs(n_both, n_base_only, n_pd_only, n_neither):
    base = [True] * n_both + [True] * n_base_only + [False] * n_pd_only + [False] * n_neither
    pd = [True] * n_both + [False] * n_base_only + [True] * n_pd_only + [False] * n_neither
    return base, pd


def test_bootstrap_is_deterministic_for_a_seed():
    base, pd = _pairs(60, 8, 4, 28)
    first = paired_bootstrap_delta_ci(base, pd, n_resamples=2000, seed=3)
    second = paired_bootstrap_delta_ci(base, pd, n_resamples=2000, seed=3)
    assert first == second
    other_seed = paired_bootstrap_delta_ci(base, pd, n_resamples=2000, seed=4)
    assert (other_seed.low, other_seed.high) != (first.low, first.high)


def test_bootstrap_ci_contains_observed_delta():
    base, pd = _pairs(60, 8, 4, 28)
    ci = paired_bootstrap_delta_ci(base, pd, n_resamples=2000)
    assert ci.delta == pytest.approx(-0.04)
    assert ci.low < ci.delta < ci.high
    assert ci.method == "BCa"
    assert ci.n == 100


def test_bootstrap_all_pairs_equal_gives_point_ci_without_warnings():
    base, pd = _pairs(70, 0, 0, 30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ci = paired_bootstrap_delta_ci(base, pd)
    assert (ci.delta, ci.low, ci.high, ci.method) == (0.0, 0.0, 0.0, "degenerate")


def test_bootstrap_clear_regression_is_entirely_below_zero():
    # P/D wrong on 30 of the 100 questions the baseline gets right
    base, pd = _pairs(70, 30, 0, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ci = paired_bootstrap_delta_ci(base, pd)
    assert ci.delta == pytest.approx(-0.30)
    assert ci.high < 0
    assert ci.low < -0.30 < ci.high


def test_bootstrap_ci_narrows_with_more_questions():
    small = paired_bootstrap_delta_ci(*_pairs(30, 4, 2, 14), n_resamples=2000)
    large = paired_bootstrap_delta_ci(*_pairs(300, 40, 20, 140), n_resamples=2000)
    assert (large.high - large.low) < (small.high - small.low)


def test_bootstrap_falls_back_to_percentile_when_bca_degenerates(monkeypatch):
    import harness.judge.stats as stats_module

    real_bootstrap = sps.bootstrap

    def bca_degenerates(*args, method, **kwargs):
        result = real_bootstrap(*args, method=method, **kwargs)
        if method == "BCa":  # what scipy does when the jackknife/bias term is undefined
            warnings.warn("degenerate", sps.DegenerateDataWarning)
            result.confidence_interval = type(result.confidence_interval)(math.nan, math.nan)
        return result

    monkeypatch.setattr(stats_module.sps, "bootstrap", bca_degenerates)
    ci = paired_bootstrap_delta_ci(*_pairs(60, 8, 4, 28), n_resamples=1000)
    assert ci.method == "percentile"
    assert ci.low < ci.delta < ci.high


def test_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError):
        paired_bootstrap_delta_ci([True, False], [True])
    with pytest.raises(ValueError):
        paired_bootstrap_delta_ci([], [])


def test_delta_ci_to_dict_is_json():
    ci = paired_bootstrap_delta_ci(*_pairs(20, 3, 1, 6), n_resamples=500)
    data = json.loads(json.dumps(ci.to_dict()))
    assert data["low"] == ci.low and data["method"] == ci.method
    assert isinstance(ci, DeltaCI)


# ---- power and MDE ---------------------------------------------------------------------------
def test_power_tiny_hand_checkable_case():
    # n=10, no chance discordance, delta=1: every pair is (baseline right, P/D wrong), so
    # b = D = 10 always and the p-value is 2^-10 = 0.000977.
    assert mcnemar_power(10, 1.0, 0.0, alpha=0.01) == pytest.approx(1.0)
    assert mcnemar_power(10, 1.0, 0.0, alpha=0.0005) == 0.0


def _brute_force_power(n, delta, base_discordance, alpha):
    """Sum the multinomial (b, c, concordant) directly over the rejection region."""
    p_b, p_c = base_discordance / 2 + delta, base_discordance / 2
    total = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            if b + c and sps.binomtest(b, b + c, 0.5, alternative="greater").pvalue <= alpha:
                total += sps.multinomial.pmf([b, c, n - b - c], n, [p_b, p_c, 1 - p_b - p_c])
    return total


@pytest.mark.parametrize("n,delta,base,alpha", [(30, 0.1, 0.1, 0.05), (24, 0.05, 0.2, 0.01),
                                                (20, 0.0, 0.3, 0.05)])
def test_power_matches_brute_force_enumeration(n, delta, base, alpha):
    assert mcnemar_power(n, delta, base, alpha) == pytest.approx(
        _brute_force_power(n, delta, base, alpha), rel=1e-9, abs=1e-12)


def test_power_increases_with_delta_and_n():
    by_delta = [mcnemar_power(200, d, 0.05, 0.01) for d in (0.01, 0.03, 0.05, 0.08, 0.12)]
    assert all(a < b for a, b in zip(by_delta, by_delta[1:]))
    by_n = [mcnemar_power(n, 0.05, 0.05, 0.01) for n in (50, 100, 200, 500, 1000)]
    assert all(a < b for a, b in zip(by_n, by_n[1:]))


def test_power_near_zero_effect_is_at_most_alpha():
    # exact tests are conservative: size <= alpha under H0
    assert mcnemar_power(300, 0.0, 0.1, 0.05) <= 0.05
    assert mcnemar_power(300, 1e-4, 0.0, 0.05) < 0.05
    assert mcnemar_power(300, 0.0, 0.0, 0.05) == 0.0


def test_mde_decreases_with_n_and_has_the_power_it_claims():
    mdes = [minimum_detectable_effect(n, alpha=0.01) for n in (50, 100, 200, 500, 1000)]
    assert all(a > b for a, b in zip(mdes, mdes[1:]))
    for n, mde in zip((50, 100, 200, 500, 1000), mdes):
        assert mcnemar_power(n, mde, 0.0, 0.01) >= 0.8
        assert mcnemar_power(n, max(mde - 2e-3, 0.0), 0.0, 0.01) < 0.8


def test_mde_grows_with_chance_discordance():
    assert minimum_detectable_effect(200, 0.01, base_discordance=0.05) > \
        minimum_detectable_effect(200, 0.01, base_discordance=0.0)


def test_mde_unreachable_is_inf():
    # 5 pairs can never reach p <= 0.01 (best case 2^-5 = 0.03)
    assert minimum_detectable_effect(5, alpha=0.01) == math.inf


@pytest.mark.parametrize("n", [50, 200, 500])
@pytest.mark.parametrize("base", [0.0, 0.05])
def test_required_sample_size_is_consistent_with_mde(n, base):
    mde = minimum_detectable_effect(n, 0.01, base_discordance=base)
    needed = required_sample_size(mde, 0.01, base_discordance=base)
    assert needed <= n
    assert mcnemar_power(needed, mde, base, 0.01) >= 0.8
    assert mcnemar_power(needed - 1, mde, base, 0.01) < 0.8


def test_required_sample_size_beyond_n_max_raises():
    with pytest.raises(ValueError):
        required_sample_size(0.001, 0.01, base_discordance=0.5, n_max=1000)


# ---- noise floor -----------------------------------------------------------------------------
def test_floor_fisher_tea_example():
    # Fisher's lady tasting tea: [[3, 1], [1, 3]], one-sided p = 17/70 = 0.2429
    result = disagreement_exceeds_floor(3, 4, 1, 4, alpha=0.05)
    assert result.p_value == pytest.approx(17 / 70, rel=1e-9)
    assert (result.pd_rate, result.aa_rate) == (0.75, 0.25)
    assert result.exceeds is False
    assert result.to_dict()["exceeds"] is False


def test_floor_detects_clearly_higher_disagreement():
    result = disagreement_exceeds_floor(40, 100, 5, 100, alpha=0.01)
    assert result.exceeds and result.p_value < 1e-6


def test_floor_lower_pd_rate_is_not_flagged():
    assert disagreement_exceeds_floor(2, 100, 20, 100, alpha=0.05).p_value > 0.99


def test_floor_rejects_bad_counts():
    with pytest.raises(ValueError):
        disagreement_exceeds_floor(5, 4, 1, 4, alpha=0.05)
    with pytest.raises(ValueError):
        disagreement_exceeds_floor(0, 0, 1, 4, alpha=0.05)


# ---- accuracy and Wilson ---------------------------------------------------------------------
def test_accuracy():
    assert accuracy([True, True, False, True]) == 0.75
    with pytest.raises(ValueError):
        accuracy([])


def test_wilson_known_values():
    # textbook: 0/10 -> upper z^2/(n+z^2) = 0.2775; 8/10 -> (0.4902, 0.9433)
    assert wilson_ci(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert wilson_ci(8, 10) == pytest.approx((0.49016, 0.94332), abs=1e-5)
    low99, high99 = wilson_ci(8, 10, confidence=0.99)
    assert low99 < 0.49016 and high99 > 0.94332
    with pytest.raises(ValueError):
        wilson_ci(3, 0)


def test_below_reference_matches_the_exact_binomial_tail():
    from scipy.stats import binom

    from harness.judge.stats import below_reference

    # P(X <= 40 | n=50, p=0.9): the exact lower tail
    assert below_reference(40, 50, 1.0, 0.10) == pytest.approx(binom.cdf(40, 50, 0.9))
    assert below_reference(2, 100, 1.0, 0.10) < 1e-80          # GPU Granite FLASH_ATTN baseline
    assert below_reference(48, 50, 0.975, 0.10) > 0.5          # a healthy CPU repeat
    assert below_reference(0, 10, 0.05, 0.10) == 1.0            # nothing to fall below
    with pytest.raises(ValueError):
        below_reference(5, 4, 0.9, 0.1)
