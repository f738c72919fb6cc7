"""The block-boundary weather: its padded prompts, its row's parameters, its conditions (both
ways), its own baseline group, and the proxy's per-request prompt count it is proven by."""
from __future__ import annotations

import json

import pytest

from harness.core.cell import Cell
from harness.weathers import resolved_params, weather_problem
from harness.weathers.block_boundary import BOUNDARY_UNIT
from harness.run.plan.group_plan import weather_task
from harness.run.weather import weather_for
from harness.run.weather.base import WeatherRun
from harness.zoo import boundary, task

BB = weather_for("block-boundary")


def cell(p: int = 128, d: int | None = None, **kw) -> Cell:
    return Cell(model="tiny-llama-gsm", prefill_block_size=p, decode_block_size=d or p,
                weather="block-boundary", **kw)


def run_of(c: Cell, tokens: list, statuses: list | None = None) -> WeatherRun:
    statuses = statuses or [200] * len(tokens)
    records = tuple({"request_id": f"r{i}", "prefill_status": s, "prompt_tokens": t}
                    for i, (t, s) in enumerate(zip(tokens, statuses)))
    return WeatherRun(c, resolved_params(c.weather, c.weather_settings), (), records, {}, {})


def test_target_and_boundary_arithmetic():
    assert [boundary.target_tokens(485, o) for o in (-1, 0, 1)] == [511, 512, 513]
    assert [boundary.target_tokens(511, o) for o in (-1, 0, 1)] == [511, 512, 513]
    assert boundary.target_tokens(512, -1) == 639 and boundary.target_tokens(514, 1) == 641
    assert [boundary.boundary_of(n, 128) for n in (511, 512, 513, 514, 500)] == [-1, 0, 1, None, None]
    # the same prompt is on a boundary of every block dividing the unit
    assert {b: boundary.boundary_of(513, b) for b in (32, 64, 128)} == {32: 1, 64: 1, 128: 1}
    assert boundary.boundary_of(513, 96) is None


def test_padded_docs_land_on_each_boundary_in_turn(tmp_path):
    out = boundary.write_boundary_splits(tmp_path, test_size=9, train_size=3)
    docs = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    plain = list(task.iter_docs(task.TEST_SEED, 0, 9))
    for i, (doc, orig) in enumerate(zip(docs, plain)):
        n = boundary.prompt_tokens(task.prompt_text(doc))     # the zoo tokenizer, BOS included
        assert n == doc["prompt_tokens"] and n % BOUNDARY_UNIT == doc["boundary_offset"] % BOUNDARY_UNIT
        assert doc["boundary_offset"] == (-1, 0, 1)[i % 3]
        # the question and its answer are gsm_synth's: only a neutral pad precedes the context
        assert doc["context"].endswith(orig["context"]) and doc["answer"] == orig["answer"]
        assert set(doc["context"][:-len(orig["context"])]) <= {boundary.PAD}


def test_row_parameters_both_ways():
    assert weather_problem("block-boundary", {}) is None
    assert weather_problem("block-boundary", {"min_questions": 150}) is None
    assert "min_questions must be" in weather_problem("block-boundary", {"min_questions": 2})
    assert "whole number" in weather_problem("block-boundary", {"min_questions": 9.5})
    assert "takes no parameter 'share'" in weather_problem("block-boundary", {"share": 0.5})
    assert BB.workload(cell(), {"min_questions": 99}).min_questions == 99
    assert BB.servers(cell(), {}) == {}


def test_conditions_hold_when_every_prompt_is_on_a_boundary():
    c = cell(64, 128)
    run = run_of(c, [511, 512, 513, 639, None], statuses=[200, 200, 200, 200, 500])
    conds = {x.name: x for x in BB.conditions(run)}
    assert all(x.passed and x.kind == "happened" for x in conds.values()), conds
    assert "k*block-1 2, k*block 1, k*block+1 1, off a boundary 0" in conds["boundaries-hit[decode]"].detail
    events = BB.events(run)
    assert [e.kind for e in events] == ["prompt-at-block-boundary k*block-1",
                                        "prompt-at-block-boundary k*block",
                                        "prompt-at-block-boundary k*block+1",
                                        "prompt-at-block-boundary k*block-1"]
    assert events[0].detail == ("prompt 511 tokens (prefill usage.prompt_tokens); "
                                "prefill block 64: 8*64-1; decode block 128: 4*128-1")
    assert not any(e.may_fail for e in events)   # nothing may fail: the budget stays 0
    assert BB.failure_budget(run, events) == 0


@pytest.mark.parametrize("tokens, failing", [
    ([511, 512, 514], "boundaries-hit[decode]"),        # one prompt off a boundary
    ([511, 512, 512], "boundaries-hit[prefill]"),       # k*block+1 never hit
    ([511, 512, None], "prompts-counted"),              # a prefill answer without usage
    ([], "prompts-counted"),                            # nothing answered
])
def test_conditions_fail_when_the_weather_did_not_blow(tokens, failing):
    conds = {x.name: x for x in BB.conditions(run_of(cell(), tokens))}
    assert not conds[failing].passed


def test_its_prompts_get_a_baseline_of_their_own():
    calm = Cell(model="tiny-llama-gsm")
    assert cell().baseline_key != calm.baseline_key
    assert Cell(model="tiny-llama-gsm", weather="load").baseline_key == calm.baseline_key
    assert weather_task(cell(), "gsm_synth") == "gsm_synth_boundary"
    assert weather_task(calm, "gsm_synth") == "gsm_synth"
    with pytest.raises(ValueError, match="pads the prompts of gsm_synth only"):
        weather_task(cell(), "gsm8k_local")
