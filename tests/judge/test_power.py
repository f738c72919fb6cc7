"""Exact operating characteristics and power planning of the non-inferiority gate."""
from __future__ import annotations

import functools
import itertools
import math

import pytest
from scipy import stats as sps

from harness.core.outcomes import FAIL, PASS
from harness.judge.power import (
    budget_needed, cell_probabilities, default_discordance, doubling_stages, main,
    operating_characteristics, questions_needed, single_look,
)
from harness.judge.sequential import SequentialPlan, evaluate_look


def test_cell_probabilities_follow_the_model():
    assert cell_probabilities(0.8, 0.1, 0.05) == pytest.approx((0.1, 0.05))
    assert default_discordance(0.8) == pytest.approx(0.32)
    assert cell_probabilities(0.8) == pytest.approx((0.16, 0.16))
    with pytest.raises(ValueError):
        cell_probabilities(1.0, 0.02)      # a perfect baseline cannot be out-answered
    with pytest.raises(ValueError):
        cell_probabilities(0.03, 0.0, 0.05)
    with pytest.raises(ValueError):
        cell_probabilities(0.9, -0.1)


def test_doubling_stages():
    assert doubling_stages(1319) == (50, 100, 200, 400, 800, 1319)
    assert doubling_stages(400) == (50, 100, 200, 400)
    assert doubling_stages(30) == (30,)


def test_operating_characteristics_match_enumeration_of_every_question_sequence():
    # a tiny plan with large levels so that every outcome happens; each of the 3^6 sequences
    # of question kinds goes through the scalar `evaluate_look`, independently of the DP
    plan = SequentialPlan(stages=(3, 6), margin=0.3, alpha_fail=0.3, alpha_pass=0.3)
    p_b, p_c = 0.25, 0.15
    probability = {"b": p_b, "c": p_c, "=": 1 - p_b - p_c}
    expected = {PASS: 0.0, FAIL: 0.0, "undecided": 0.0, "questions": 0.0}
    look = functools.lru_cache(maxsize=None)(lambda b, c, n: evaluate_look(plan, b, c, n))
    for seq in itertools.product("bc=", repeat=6):
        weight = math.prod(probability[k] for k in seq)
        for stage in plan.stages:
            d = look(seq[:stage].count("b"), seq[:stage].count("c"), stage)
            if d.final:
                break
        expected[d.decision if d.decision in (PASS, FAIL) else "undecided"] += weight
        expected["questions"] += weight * d.n
    oc = operating_characteristics(plan, p_b, p_c)
    assert oc.p_pass == pytest.approx(expected[PASS], abs=1e-12)
    assert oc.p_fail == pytest.approx(expected[FAIL], abs=1e-12)
    assert oc.inconclusive == pytest.approx(expected["undecided"], abs=1e-12)
    assert oc.expected_questions == pytest.approx(expected["questions"], abs=1e-10)
    assert 0 < oc.p_pass < 1 and 0 < oc.p_fail < 1 and 0 < oc.inconclusive < 1


def test_probabilities_add_up_and_serialise():
    oc = operating_characteristics(SequentialPlan(), 0.06, 0.01)
    assert oc.p_pass + oc.p_fail + oc.inconclusive == pytest.approx(1.0)
    d = oc.to_dict()
    assert d["stages"] == (50, 100, 200, 400) and len(d["pass_by_look"]) == 4
    assert d["expected_questions"] == pytest.approx(oc.expected_questions)


def test_clean_cells():
    # no discordance: the bound is deterministic, z^2 / (n + z^2) <= 5 pts from 103 questions
    assert single_look(103, 0.0, 0.0).p_pass == 1.0
    assert single_look(102, 0.0, 0.0).p_pass == 0.0
    assert questions_needed(0.0, 0.0) == 103
    oc = operating_characteristics(SequentialPlan(), 0.0, 0.0)
    assert oc.p_pass == pytest.approx(1.0) and oc.expected_questions == pytest.approx(200.0)
    # baseline 97 %, 2 % chance discordance: PASS almost surely, mostly by 200 questions
    oc = operating_characteristics(SequentialPlan(), 0.01, 0.01)
    assert oc.p_pass > 0.99 and 200 < oc.expected_questions < 300


def test_questions_needed_grows_with_discordance_like_the_normal_approximation():
    needed = [questions_needed(psi / 2, psi / 2) for psi in (0.02, 0.1)]
    assert needed == sorted(needed)
    # n ~ (z_alpha + z_power)^2 psi / margin^2 for a paired difference at drop 0
    approx = (sps.norm.isf(0.01) + sps.norm.isf(0.2)) ** 2 * 0.1 / 0.05 ** 2
    assert needed[-1] == pytest.approx(approx, rel=0.15)
    n = needed[-1]
    assert all(single_look(m, 0.05, 0.05).p_pass >= 0.8 for m in range(n, n + 3))


def test_budget_needed_reaches_the_power():
    plan = SequentialPlan()
    budget = budget_needed(0.01, 0.01, plan, power=0.9)
    reached = SequentialPlan(stages=doubling_stages(budget))
    assert operating_characteristics(reached, 0.01, 0.01).p_pass >= 0.9
    below = SequentialPlan(stages=doubling_stages(budget - 1))
    assert operating_characteristics(below, 0.01, 0.01).p_pass < 0.9


def test_cli_prints_single_look_and_sequential_plan(capsys):
    assert main(["--baseline-accuracy", "0.97", "--discordance", "0.02", "--budget", "400"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("baseline accuracy 0.97, chance discordance 0.02, true drop 0.0 "
                             "pts, margin 5.0 pts, alpha 0.01, power 0.8")
    assert out[1] == f"single look: {questions_needed(0.01, 0.01)} questions"
    assert out[2].startswith("sequential (pocock spending, looks at 50, 100, 200, 400): P(PASS)")


def test_cli_rejects_an_impossible_cell(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--baseline-accuracy", "1.0", "--discordance", "0.1"])
    assert exc.value.code == 2
    assert "cannot lose" in capsys.readouterr().err
