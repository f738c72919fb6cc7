"""The sequential gate: spending, per-look rule, texts, and its error rates by simulation."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats as sps

from harness.core.outcomes import FAIL, INCONCLUSIVE, PASS
from harness.judge import noninferiority as ni
from harness.judge.power import cell_probabilities, operating_characteristics, simulate
from harness.judge.sequential import (
    CONTINUE, SPENDING_FUNCTIONS, SequentialPlan, count_discordant, evaluate_look,
    look_outcomes, walk,
)
from harness.judge.stats import mcnemar_worse


# ---- spending --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SPENDING_FUNCTIONS))
def test_spending_functions_spend_alpha_monotonically(name):
    spend = SPENDING_FUNCTIONS[name]
    values = [spend(0.01, t) for t in np.linspace(0.0, 1.0, 41)]
    assert values[0] == 0.0 and values[-1] == pytest.approx(0.01)
    assert values == sorted(values)


def test_spending_known_values():
    # O'Brien-Fleming type at t = 1/2: 2 (1 - Phi(z_{0.995} / sqrt(1/2)))
    assert SPENDING_FUNCTIONS["obrien-fleming"](0.01, 0.5) == pytest.approx(
        2 * sps.norm.sf(2.5758293 * math.sqrt(2)), rel=1e-6)
    assert SPENDING_FUNCTIONS["obrien-fleming"](0.01, 0.5) == pytest.approx(2.6946e-4, rel=1e-3)
    assert SPENDING_FUNCTIONS["pocock"](0.01, 0.5) == pytest.approx(
        0.01 * math.log(1 + (math.e - 1) / 2))
    assert SPENDING_FUNCTIONS["linear"](0.01, 0.25) == pytest.approx(0.0025)


# ---- plan ------------------------------------------------------------------------------------
def test_plan_levels_add_up_to_alpha():
    for spending in SPENDING_FUNCTIONS:
        plan = SequentialPlan(stages=(50, 100, 200, 400, 800, 1319), alpha_fail=0.01,
                              alpha_pass=0.02, fail_spending=spending, pass_spending=spending)
        levels = [plan.levels(k) for k in range(1, plan.n_looks + 1)]
        assert sum(f for f, _ in levels) == pytest.approx(0.01)
        assert sum(p for _, p in levels) == pytest.approx(0.02)
        assert all(f > 0 and p > 0 for f, p in levels)


def test_plan_defaults_and_shape():
    plan = SequentialPlan()
    assert plan.stages == (50, 100, 200, 400) and plan.budget == 400 and plan.n_looks == 4
    assert plan.margin == 0.05 and plan.alpha_fail == plan.alpha_pass == 0.01
    assert [plan.look_of(n) for n in (1, 50, 51, 100, 400, 500)] == [1, 1, 2, 2, 4, 4]
    assert plan.limited_to(250).stages == (50, 100, 200, 250)
    assert plan.limited_to(1319) is plan
    assert plan.limited_to(30).stages == (30,)
    d = plan.to_dict()
    assert d["stages"] == [50, 100, 200, 400] and len(d["levels"]) == 4


def test_a_look_off_its_stage_spends_by_its_information_fraction():
    plan = SequentialPlan(fail_spending="linear", pass_spending="linear")
    assert plan.levels(2) == pytest.approx((0.00125, 0.00125))
    assert plan.levels(2, n=120) == pytest.approx((0.0017500, 0.0017500))
    assert plan.levels(3, n=400) == pytest.approx((0.01 - 0.0025, 0.01 - 0.0025))  # final


@pytest.mark.parametrize("kwargs", [
    {"stages": ()}, {"stages": (100, 50)}, {"stages": (0, 50)}, {"alpha_fail": 0.0},
    {"alpha_pass": 1.0}, {"margin": 0.0}, {"pass_spending": "haybittle"},
])
def test_plan_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        SequentialPlan(**kwargs)


# ---- one look --------------------------------------------------------------------------------
PLAN = SequentialPlan()


def test_the_issue_case_now_asks_for_more_questions():
    # 96 % vs 86 % on 50 questions (b = 5, c = 0, McNemar p = 0.031) PASSed before
    d = evaluate_look(PLAN, 5, 0, 50)
    assert d.decision == CONTINUE and d.next_n == 100 and not d.final
    assert d.mcnemar_p == pytest.approx(1 / 32)
    assert d.drop_upper > 0.2
    assert d.text.startswith("undecided at look 1 of 4 (n = 50): P/D −10.0 pts")
    assert d.text.endswith("continue to 100 questions")


def test_a_ten_point_drop_fails_at_the_next_look():
    d = evaluate_look(PLAN, 10, 0, 100)
    assert d.decision == FAIL and d.mcnemar_p == pytest.approx(2.0 ** -10)
    assert d.mcnemar_p <= d.alpha_fail_look
    assert re.fullmatch(r"P/D is worse: −10\.0 pts \[−\d+\.\d, −\d+\.\d\] \(99\.\d+ % interval; "
                        r"10 questions lost, 0 gained\), McNemar p = 0\.00098 ≤ 0\.0016 at look 2 "
                        r"of 4 \(n = 100\)", d.text), d.text


def test_a_clean_cell_passes_at_200_questions():
    assert evaluate_look(PLAN, 0, 0, 100).decision == CONTINUE
    d = evaluate_look(PLAN, 0, 0, 200)
    assert d.decision == PASS and d.drop_upper <= 0.05
    assert d.text == ("P/D is not worse than the baseline by more than 5.0 pts (99.74 % upper "
                      "bound of the drop 3.7 pts, n = 200)")


def test_undecided_at_the_budget_is_inconclusive_with_the_bound():
    d = evaluate_look(PLAN, 30, 22, 400)
    assert d.decision == INCONCLUSIVE and d.final and d.next_n is None
    assert d.drop_upper > 0.05
    assert re.fullmatch(r"inconclusive at the budget of 400 questions: the drop is at most "
                        r"\d\.\d pts \(99\.\d+ % bound\), margin 5\.0; P/D −2\.0 pts \(30 "
                        r"questions lost, 22 gained\), McNemar p = 0\.17 > 0\.0038", d.text), d.text


def test_fail_takes_precedence_over_a_drop_inside_the_margin():
    plan = SequentialPlan(stages=(50, 100, 200, 400, 800, 1319))
    d = evaluate_look(plan, 20, 3, 1319)
    assert ni.noninferiority(20, 3, 1319, plan.margin, d.alpha_pass_look).noninferior
    assert d.decision == FAIL


def test_vectorised_rule_matches_the_scalar_one():
    n, look = 100, 2
    grid = np.arange(n + 1)
    fails, passes = look_outcomes(PLAN, look, grid[:, None], grid[None, :], n)
    for b in range(0, 40, 3):
        for c in range(0, 40, 3):
            d = evaluate_look(PLAN, b, c, n)
            assert d.mcnemar_p == pytest.approx(mcnemar_worse(b, c).p_value)
            assert (d.decision == FAIL) == fails[b, c], (b, c)
            assert (d.decision == PASS) == passes[b, c], (b, c)


def test_walk_and_counts_on_question_vectors():
    rng = np.random.default_rng(7)
    base = rng.random(400) < 0.9
    assert count_discordant(base, base) == (0, 0, 400)
    looks = walk(PLAN, base, base)
    assert [d.decision for d in looks] == [CONTINUE, CONTINUE, PASS]
    broken = base & (rng.random(400) < 0.5)      # P/D loses half the baseline's right answers
    looks = walk(PLAN, base, broken)
    assert looks[-1].decision == FAIL and looks[-1].n == 50
    assert walk(PLAN, base[:120], base[:120])[-1].n == 120       # plan limited to 120
    with pytest.raises(ValueError):
        count_discordant(base, base[:10])


def test_look_decision_serialises():
    d = evaluate_look(PLAN, 3, 1, 100).to_dict()
    assert d["decision"] == CONTINUE and d["look"] == 2 and d["next_n"] == 200
    assert set(d) >= {"drop", "drop_upper", "drop_lower", "mcnemar_p", "noninferiority_p",
                      "alpha_fail_look", "alpha_pass_look", "margin", "budget", "text"}


# ---- error rates of the whole rule, by simulation (quick) and exactly ------------------------
REPS = 3000
BOUNDARY = [(0.9, 0.0, 0.05), (0.9, 0.05, 0.05), (0.8, 0.10, 0.05), (0.6, 0.10, 0.10)]
NO_DROP = [(1.0, 0.0, 0.0), (0.97, 0.02, 0.0), (0.8, 0.10, 0.0)]


def _mc_limit(alpha: float) -> float:
    return alpha + 3.0 * math.sqrt(alpha * (1.0 - alpha) / REPS)


@pytest.mark.parametrize("seed,cell", list(enumerate(BOUNDARY)))
def test_simulated_false_pass_rate_is_at_most_alpha(seed, cell):
    accuracy, discordance, drop = cell
    p_b, p_c = cell_probabilities(accuracy, discordance, drop)
    mc = simulate(PLAN, accuracy, p_b, p_c, REPS, np.random.default_rng(100 + seed))
    exact = operating_characteristics(PLAN, p_b, p_c)
    assert mc.p_pass <= _mc_limit(PLAN.alpha_pass)
    assert exact.p_pass <= PLAN.alpha_pass
    se = math.sqrt(max(exact.p_fail * (1 - exact.p_fail), 1 / REPS) / REPS)
    assert abs(mc.p_fail - exact.p_fail) <= 4.5 * se


@pytest.mark.parametrize("seed,cell", list(enumerate(NO_DROP)))
def test_simulated_false_fail_rate_is_at_most_alpha(seed, cell):
    accuracy, discordance, drop = cell
    p_b, p_c = cell_probabilities(accuracy, discordance, drop)
    mc = simulate(PLAN, accuracy, p_b, p_c, REPS, np.random.default_rng(200 + seed))
    exact = operating_characteristics(PLAN, p_b, p_c)
    assert mc.p_fail <= _mc_limit(PLAN.alpha_fail)
    assert exact.p_fail <= PLAN.alpha_fail
    se = math.sqrt(max(exact.p_pass * (1 - exact.p_pass), 1 / REPS) / REPS)
    assert abs(mc.p_pass - exact.p_pass) <= 4.5 * se
    assert abs(mc.expected_questions - exact.expected_questions) <= 4.5 * 350 / math.sqrt(REPS)


def test_exact_false_pass_at_most_alpha_even_at_extreme_discordance():
    for spending in SPENDING_FUNCTIONS:
        plan = SequentialPlan(fail_spending=spending, pass_spending=spending)
        for discordance in (0.3, 0.6, 0.9):
            oc = operating_characteristics(plan, discordance / 2 + 0.05, discordance / 2)
            assert oc.p_pass <= plan.alpha_pass, (spending, discordance, oc.p_pass)


def test_an_off_plan_previous_look_is_accounted_for():
    plan = SequentialPlan(fail_spending="linear", pass_spending="linear")
    # look 2 was made at 300 questions instead of 100: look 3 spends only a(0.5) - a(0.75) -> 0
    assert plan.levels(3, n=200, previous_n=300) == (0.0, 0.0)
    assert plan.levels(4, previous_n=300) == pytest.approx((0.0025, 0.0025))
    d = evaluate_look(plan, 0, 0, 400, previous_n=300)
    assert d.alpha_pass_look == pytest.approx(0.0025) and d.decision == PASS
