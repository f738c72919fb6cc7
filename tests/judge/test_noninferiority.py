"""Textbook checks of harness.judge.noninferiority: published intervals, identities, brute force."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats as sps

from harness.judge.noninferiority import (
    clean_upper_bound, drop_interval, drop_lower_bound, drop_upper_bound, noninferiority,
    questions_for_clean_pass, rejection_probability, tango_score, trinomial_pmf,
)


# ---- published worked examples ---------------------------------------------------------------
def test_fagerland_2014_bentur_airway_hyperresponsiveness():
    # Fagerland, Lydersen & Laake (2014) Stat Med 33:2850, Table V: the paired table
    # (a, b, c, d) = (1, 1, 7, 12), Tango asymptotic score 95 % CI (-0.517, -0.026).
    low, high = drop_interval(1, 7, 21, 0.95)
    assert (round(low, 3), round(high, 3)) == (-0.517, -0.026)


def test_fagerland_2017_cavo_complete_response():
    # Fagerland, Lydersen & Laake (2017), Statistical Analysis of Contingency Tables, ch. 8
    # (as in R contingencytables' tests): (59, 6, 16, 80), estimate -0.0621,
    # Tango 95 % CI -0.1240 to -0.0054.
    low, high = drop_interval(6, 16, 161, 0.95)
    assert (6 - 16) / 161 == pytest.approx(-0.0621, abs=5e-5)
    assert (round(low, 4), round(high, 4)) == (-0.1240, -0.0054)


def test_score_at_zero_is_the_mcnemar_statistic():
    # Under H0: drop = 0 the constrained variance is (b + c) / n, so Z(0) = (b - c) / sqrt(b + c)
    for b, c, n in ((150, 86, 1600), (5, 0, 50), (3, 9, 40)):
        assert float(tango_score(b, c, n, 0.0)) == pytest.approx((b - c) / math.sqrt(b + c))


def test_constrained_mle_matches_numerical_maximisation():
    # the closed-form root against a brute-force maximisation of the trinomial likelihood
    for b, c, n, d0 in ((6, 16, 161, 0.05), (1, 7, 21, -0.1), (5, 0, 50, 0.2), (0, 3, 100, 0.04)):
        def negloglik(q):
            p_b, p_c = q + d0, q
            return -(b * math.log(p_b) + c * math.log(p_c) + (n - b - c) * math.log(1 - p_b - p_c))

        lo, hi = max(0.0, -d0) + 1e-12, (1 - d0) / 2 - 1e-12
        q = optimize.minimize_scalar(negloglik, bounds=(lo, hi), method="bounded",
                                     options={"xatol": 1e-12}).x
        z = (b - c - n * d0) / math.sqrt(n * (2 * q + d0 * (1 - d0)))
        assert float(tango_score(b, c, n, d0)) == pytest.approx(z, rel=1e-5, abs=1e-6)


# ---- all questions agree ---------------------------------------------------------------------
def test_clean_bound_closed_form_and_the_questions_a_clean_cell_needs():
    z2 = sps.norm.isf(0.01) ** 2
    assert drop_upper_bound(0, 0, 50, 0.99) == pytest.approx(z2 / (50 + z2), rel=1e-9)
    assert clean_upper_bound(50) == pytest.approx(0.0977, abs=1e-4)   # 9.8 pts > 5: no PASS
    assert questions_for_clean_pass(0.05, 0.99) == 103
    assert drop_upper_bound(0, 0, 102, 0.99) > 0.05 >= drop_upper_bound(0, 0, 103, 0.99)
    assert not noninferiority(0, 0, 102).noninferior
    assert noninferiority(0, 0, 103).noninferior
    bounds = [drop_upper_bound(0, 0, n) for n in (10, 50, 100, 400, 1319)]
    assert bounds == sorted(bounds, reverse=True) and 0 < bounds[-1] < 0.005


def test_the_issue_case_is_not_noninferior():
    # 96 % vs 86 %: b = 5, c = 0, n = 50 -- the drop today's gate let through
    result = noninferiority(5, 0, 50)
    assert result.drop == pytest.approx(0.10)
    assert not result.noninferior and result.upper_bound > 0.2


# ---- properties ------------------------------------------------------------------------------
CASES = [(0, 0, 50), (5, 0, 50), (0, 5, 50), (3, 2, 100), (12, 2, 400), (40, 35, 1319),
         (50, 0, 50), (0, 50, 50), (25, 25, 50)]


@pytest.mark.parametrize("b,c,n", CASES)
def test_score_falls_monotonically_and_vanishes_at_the_estimate(b, c, n):
    grid = np.linspace(-0.999, 0.999, 801)
    z = np.array([float(tango_score(b, c, n, d)) for d in grid])
    assert np.all(np.diff(z) <= 1e-12)
    assert float(tango_score(b, c, n, (b - c) / n)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("b,c,n", CASES)
def test_bounds_bracket_the_estimate_and_invert_the_score(b, c, n):
    estimate = (b - c) / n
    for confidence in (0.9, 0.99, 0.9999):
        low, high = drop_lower_bound(b, c, n, confidence), drop_upper_bound(b, c, n, confidence)
        assert -1 <= low <= estimate <= high <= 1
        z = sps.norm.isf(1 - confidence)
        if high < 1:
            assert float(tango_score(b, c, n, high)) == pytest.approx(-z, abs=1e-6)
        assert drop_lower_bound(b, c, n, confidence) == pytest.approx(
            -drop_upper_bound(c, b, n, confidence))
    assert drop_upper_bound(b, c, n, 0.9) <= drop_upper_bound(b, c, n, 0.99) <= \
        drop_upper_bound(b, c, n, 0.9999)


def test_upper_bound_grows_with_b_and_falls_with_c():
    n = 100
    for c in (0, 3, 10):
        ups = [drop_upper_bound(b, c, n) for b in range(0, 30)]
        assert ups == sorted(ups)
    for b in (0, 3, 10):
        ups = [drop_upper_bound(b, c, n) for c in range(0, 30)]
        assert ups == sorted(ups, reverse=True)


def test_p_value_decision_agrees_with_the_bound():
    n, margin, alpha = 120, 0.05, 0.01
    for b in range(0, 25):
        for c in range(0, 25):
            result = noninferiority(b, c, n, margin, alpha)
            if abs(result.upper_bound - margin) > 1e-9:
                assert result.noninferior == (result.upper_bound <= margin), (b, c)


# ---- exact error of the test, by enumeration -------------------------------------------------
def _brute_rejection(n, p_b, p_c, margin, alpha):
    """Independent of trinomial_pmf and of the vectorised score: math.comb and the scalar API."""
    total = 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            if noninferiority(b, c, n, margin, alpha).noninferior:
                total += (math.comb(n, b) * math.comb(n - b, c) * p_b ** b * p_c ** c
                          * (1 - p_b - p_c) ** (n - b - c))
    return total


@pytest.mark.parametrize("n,p_b,p_c", [(30, 0.06, 0.01), (40, 0.02, 0.03), (25, 0.15, 0.1)])
def test_rejection_probability_matches_brute_force(n, p_b, p_c):
    assert rejection_probability(n, p_b, p_c, 0.1, 0.05) == pytest.approx(
        _brute_rejection(n, p_b, p_c, 0.1, 0.05), rel=1e-9, abs=1e-15)


def test_trinomial_pmf_is_a_distribution_with_the_right_means():
    pmf = trinomial_pmf(60, 0.07, 0.02)
    grid = np.arange(61)
    assert pmf.sum() == pytest.approx(1.0)
    assert (pmf * grid[:, None]).sum() == pytest.approx(60 * 0.07)
    assert (pmf * grid[None, :]).sum() == pytest.approx(60 * 0.02)
    assert np.all(pmf[grid[:, None] + grid[None, :] > 60] == 0)


@pytest.mark.parametrize("n", [50, 100, 200])
@pytest.mark.parametrize("alpha", [0.01, 0.002])
def test_false_noninferiority_at_most_alpha_at_realistic_discordance(n, alpha):
    # true drop exactly at the margin, chance discordance 0-15 %: the claim's exact error
    for discordance in (0.0, 0.02, 0.05, 0.1, 0.15):
        error = rejection_probability(n, discordance / 2 + 0.05, discordance / 2, 0.05, alpha)
        assert error <= alpha, (discordance, error)


def test_power_when_nothing_changed():
    # 2 % chance discordance, no drop: a single look at 400 questions passes almost surely
    powers = [rejection_probability(n, 0.01, 0.01) for n in (50, 100, 200, 400)]
    assert powers == sorted(powers) and powers[0] < 0.5 < 0.99 < powers[-1]


def test_bad_inputs():
    with pytest.raises(ValueError):
        noninferiority(3, 2, 4)          # b + c > n
    with pytest.raises(ValueError):
        noninferiority(-1, 0, 10)
    with pytest.raises(ValueError):
        noninferiority(0, 0, 10, margin=0.0)
    with pytest.raises(ValueError):
        drop_upper_bound(0, 0, 10, confidence=1.0)
    with pytest.raises(ValueError):
        trinomial_pmf(10, 0.7, 0.5)
