"""Known-value tests for harness.judge.logprobs: parsing OpenAI completion logprobs, divergence."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.judge.logprobs import (Divergence, TokenLogprob, logprob_divergence,
                                    parse_completion_logprobs, summarize_divergences)

VLLM_CHOICE = {  # shape of a vLLM /v1/completions choice requested with logprobs=2
    "index": 0,
    "text": " 42.",
    "logprobs": {
        "text_offset": [0, 2, 3],
        "token_logprobs": [-0.01, -0.25, -1.5],
        "tokens": [" 4", "2", "."],
        "top_logprobs": [
            {" 4": -0.01, " 5": -4.7},
            {"2": -0.25, "3": -1.6},
            {".": -1.5, "\n": -0.4},
        ],
    },
    "finish_reason": "stop",
    "stop_reason": None,
}


def test_parse_completion_logprobs():
    tokens = parse_completion_logprobs(VLLM_CHOICE)
    assert [t.token for t in tokens] == [" 4", "2", "."]
    assert [t.logprob for t in tokens] == [-0.01, -0.25, -1.5]
    assert tokens[2].top == {".": -1.5, "\n": -0.4}


def test_parse_handles_null_top_and_null_logprob():
    choice = {"logprobs": {"tokens": ["a", "b"], "token_logprobs": [None, -0.5],
                           "top_logprobs": None}}
    tokens = parse_completion_logprobs(choice)
    assert math.isnan(tokens[0].logprob) and tokens[1].logprob == -0.5
    assert tokens[0].top == {} and tokens[1].top == {}


def test_parse_without_logprobs_raises():
    with pytest.raises(ValueError):
        parse_completion_logprobs({"text": "x", "logprobs": None})
    with pytest.raises(ValueError):
        parse_completion_logprobs({"logprobs": {"tokens": ["a"], "token_logprobs": [],
                                                "top_logprobs": None}})


def _seq(tokens, logprobs, tops=None):
    tops = tops or [{} for _ in tokens]
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(tokens, logprobs, tops)]


def test_identical_sequences_do_not_diverge():
    base = parse_completion_logprobs(VLLM_CHOICE)
    div = logprob_divergence(base, list(base))
    assert div.first_divergent_index is None and not div.diverged
    assert div.n_aligned == 3
    assert (div.abs_delta_median, div.abs_delta_p95, div.abs_delta_max) == (0.0, 0.0, 0.0)
    assert div.mean_top_overlap == 1.0
    assert div.base_token_at_divergence is None and div.pd_token_at_divergence is None


def test_divergence_at_index_two():
    base = _seq(["a", "b", "c", "d"], [-0.1, -0.2, -0.3, -0.4],
                [{"a": -0.1, "x": -3}, {"b": -0.2, "y": -2}, {"c": -0.3, "z": -1.5}, {}])
    pd = _seq(["a", "b", "z", "q"], [-0.1, -0.5, -1.4, -0.9],
              [{"a": -0.1, "x": -3}, {"b": -0.5, "w": -1}, {"z": -1.4, "c": -0.35}, {}])
    div = logprob_divergence(base, pd)
    assert div.first_divergent_index == 2 and div.n_aligned == 2
    assert div.abs_deltas == pytest.approx((0.0, 0.3))
    assert div.abs_delta_max == pytest.approx(0.3)
    assert div.abs_delta_median == pytest.approx(0.15)
    # overlaps over positions 0..2 (same context): 1, 1/2, 2/2
    assert div.mean_top_overlap == pytest.approx((1 + 0.5 + 1) / 3)
    assert (div.base_token_at_divergence, div.pd_token_at_divergence) == ("c", "z")
    assert (div.base_logprob_at_divergence, div.pd_logprob_at_divergence) == (-0.3, -1.4)
    assert "abs_deltas" not in div.to_dict()
    assert div.to_dict(include_abs_deltas=True)["abs_deltas"] == pytest.approx([0.0, 0.3])


def test_top_k_restricts_overlap_to_the_k_best():
    base = _seq(["a"], [-0.1], [{"a": -0.1, "b": -2.0, "c": -3.0}])
    pd = _seq(["a"], [-0.1], [{"a": -0.1, "b": -2.5, "d": -2.9}])
    assert logprob_divergence(base, pd).mean_top_overlap == pytest.approx(2 / 3)
    assert logprob_divergence(base, pd, top_k=2).mean_top_overlap == 1.0


def test_prefix_sequence_diverges_at_its_end():
    base = _seq(["a", "b", "c"], [-0.1, -0.2, -0.3])
    pd = _seq(["a", "b"], [-0.1, -0.2])
    div = logprob_divergence(base, pd)
    assert div.first_divergent_index == 2 and div.n_aligned == 2
    assert div.base_token_at_divergence == "c" and div.pd_token_at_divergence is None


def test_nonfinite_logprobs_are_skipped():
    base = _seq(["a", "b"], [math.nan, -0.2])
    pd = _seq(["a", "b"], [-0.1, -0.7])
    assert logprob_divergence(base, pd).abs_deltas == pytest.approx((0.5,))


def test_summarize_pools_across_questions():
    same = logprob_divergence(_seq(["a", "b"], [-0.1, -0.2]), _seq(["a", "b"], [-0.1, -0.2]))
    split = logprob_divergence(_seq(["a", "b", "c"], [-0.1, -0.2, -0.3]),
                               _seq(["a", "b", "x"], [-0.2, -0.6, -0.3]))
    summary = summarize_divergences([same, split])
    assert summary["n_questions"] == 2 and summary["n_diverging"] == 1
    assert summary["fraction_diverging"] == 0.5
    assert summary["n_aligned_tokens"] == 4
    pooled = np.array([0.0, 0.0, 0.1, 0.4])
    assert summary["abs_delta_median"] == pytest.approx(np.median(pooled))
    assert summary["abs_delta_p99"] == pytest.approx(np.percentile(pooled, 99))
    assert summary["abs_delta_max"] == pytest.approx(0.4)
    assert summary["mean_top_overlap"] == 1.0
    json.dumps(summary)


def test_summarize_empty():
    summary = summarize_divergences([])
    assert summary["n_questions"] == 0 and summary["fraction_diverging"] == 0.0
    assert summary["abs_delta_max"] == 0.0 and summary["mean_top_overlap"] is None
    assert isinstance(logprob_divergence([], []), Divergence)
