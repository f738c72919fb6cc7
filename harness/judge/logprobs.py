"""Per-token logprobs of OpenAI ``/v1/completions`` choices, and where and how far a P/D
generation departs from the baseline generation of the same prompt: pure functions, no I/O.

Both generations are greedy, so before their first differing token they were computed on the same
context; the chosen tokens' |Δ logprob| over that prefix and the top-k overlap up to the split
measure how differently the two servers scored it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from harness.judge.stats import plain

__all__ = ["CONSISTENCY_BOUND_NATS", "CONSISTENCY_TOKENS", "Divergence", "TokenLogprob",
           "first_tokens_delta", "logprob_divergence", "parse_completion_logprobs",
           "summarize_consistency", "summarize_divergences"]

# vLLM CI's hybrid P/D consistency test (test_hybrid_pd_consistency.py under
# tests/v1/kv_connector/): the chosen tokens' logprobs of the first 4 generated tokens,
# single instance vs through the P/D proxy, position by position; each prompt's largest
# |difference| must stay under 1.5 nats (a healthy path: < 0.25, upstream's comment)
CONSISTENCY_TOKENS = 4
CONSISTENCY_BOUND_NATS = 1.5


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, its logprob, and the top alternatives' logprobs."""

    token: str
    logprob: float                       # NaN when the server returned null
    top: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "top": dict(self.top)}


def parse_completion_logprobs(choice: Mapping[str, Any]) -> list[TokenLogprob]:
    """Per-token logprobs of one OpenAI ``/v1/completions`` choice.

    ``choice["logprobs"]`` holds parallel lists ``tokens``, ``token_logprobs`` and
    ``top_logprobs`` (a list of dicts, or None when top logprobs were not requested; single
    entries may also be None). A null logprob (e.g. the first prompt token with ``echo``) becomes
    NaN. Raises ValueError when the choice carries no logprobs, so that a request sent without
    ``logprobs=`` cannot pass as "two identical empty sequences".
    """
    logprobs = choice.get("logprobs")
    if not logprobs:
        raise ValueError("completion choice has no 'logprobs' (request with logprobs=K)")
    tokens = list(logprobs.get("tokens") or [])
    token_logprobs = list(logprobs.get("token_logprobs") or [])
    top_logprobs = logprobs.get("top_logprobs")
    if top_logprobs is None:
        top_logprobs = [None] * len(tokens)
    if not len(tokens) == len(token_logprobs) == len(top_logprobs):
        raise ValueError(
            f"logprobs lists differ in length: tokens={len(tokens)}, "
            f"token_logprobs={len(token_logprobs)}, top_logprobs={len(top_logprobs)}")
    return [
        TokenLogprob(
            token=str(token),
            logprob=math.nan if logprob is None else float(logprob),
            top={str(k): float(v) for k, v in (top or {}).items()},
        )
        for token, logprob, top in zip(tokens, token_logprobs, top_logprobs)
    ]


@dataclass(frozen=True)
class Divergence:
    """Where and how much one P/D generation departs from its baseline generation."""

    n_base_tokens: int
    n_pd_tokens: int
    first_divergent_index: int | None    # None: same tokens and same length
    n_aligned: int                       # positions before the divergence (same prefix, same token)
    abs_delta_median: float              # |logprob_pd - logprob_base| of the chosen token,
    abs_delta_p95: float                 #   over aligned positions with finite logprobs;
    abs_delta_max: float                 #   zeros when there are none
    mean_top_overlap: float | None       # mean |top_b ∩ top_pd| / max(|top_b|, |top_pd|)
    base_token_at_divergence: str | None  # None when no divergence or the sequence ended there
    pd_token_at_divergence: str | None
    base_logprob_at_divergence: float | None
    pd_logprob_at_divergence: float | None
    abs_deltas: tuple[float, ...] = ()   # the per-position values, kept for pooling

    @property
    def diverged(self) -> bool:
        return self.first_divergent_index is not None

    def to_dict(self, include_abs_deltas: bool = False) -> dict[str, Any]:
        out = plain(dataclasses.asdict(self))
        if not include_abs_deltas:
            out.pop("abs_deltas")
        out["diverged"] = self.diverged
        return out


def _top_k(top: Mapping[str, float], top_k: int | None) -> set[str]:
    if top_k is None or len(top) <= top_k:
        return set(top)
    return set(sorted(top, key=lambda tok: top[tok], reverse=True)[:top_k])


def _overlap(top_base: Mapping[str, float], top_pd: Mapping[str, float],
             top_k: int | None) -> float:
    set_base, set_pd = _top_k(top_base, top_k), _top_k(top_pd, top_k)
    if not set_base and not set_pd:
        return 1.0
    return len(set_base & set_pd) / max(len(set_base), len(set_pd))


def logprob_divergence(base: Sequence[TokenLogprob], pd: Sequence[TokenLogprob],
                       top_k: int | None = None) -> Divergence:
    """Compare one baseline generation with the P/D generation of the same prompt.

    The first divergent index is the first position whose tokens differ, or the length of the
    shorter sequence when one is a strict prefix of the other. Chosen-token |Δ logprob| is taken
    over the aligned positions (before the divergence), skipping positions where either logprob
    is not finite. Top-k overlap is averaged over every position that shares its prefix, i.e.
    the aligned positions plus the divergence position itself when both sequences have a token
    there: the two distributions there are still conditioned on the same context, and a
    collapsed overlap at that point is evidence of what caused the split. It is None when there
    is no such position (an empty sequence).
    """
    common = min(len(base), len(pd))
    first = next((i for i in range(common) if base[i].token != pd[i].token), None)
    if first is None and len(base) != len(pd):
        first = common
    n_aligned = common if first is None else first

    deltas = np.array([abs(pd[i].logprob - base[i].logprob) for i in range(n_aligned)],
                      dtype=float)
    deltas = deltas[np.isfinite(deltas)]
    if deltas.size:
        median, p95 = (float(v) for v in np.percentile(deltas, [50, 95]))
        maximum = float(deltas.max())
    else:
        median = p95 = maximum = 0.0

    same_context = n_aligned + (1 if first is not None and first < common else 0)
    overlaps = [_overlap(base[i].top, pd[i].top, top_k) for i in range(same_context)]
    mean_overlap = float(np.mean(overlaps)) if overlaps else None

    def at(seq: Sequence[TokenLogprob], attr: str) -> Any:
        if first is None or first >= len(seq):
            return None
        return getattr(seq[first], attr)

    return Divergence(
        n_base_tokens=len(base), n_pd_tokens=len(pd),
        first_divergent_index=first, n_aligned=n_aligned,
        abs_delta_median=median, abs_delta_p95=p95, abs_delta_max=maximum,
        mean_top_overlap=mean_overlap,
        base_token_at_divergence=at(base, "token"), pd_token_at_divergence=at(pd, "token"),
        base_logprob_at_divergence=at(base, "logprob"), pd_logprob_at_divergence=at(pd, "logprob"),
        abs_deltas=tuple(float(v) for v in deltas),
    )


def summarize_divergences(divergences: Sequence[Divergence]) -> dict[str, Any]:
    """Pool per-question divergences into the record's ``metrics.logprob`` summary.

    |Δ logprob| values are pooled over all aligned tokens of all questions (median, p95, p99,
    max; zeros when there are none); ``mean_top_overlap`` averages the per-question means that
    exist (None when none does).
    """
    pooled = np.array([v for d in divergences for v in d.abs_deltas], dtype=float)
    if pooled.size:
        median, p95, p99 = (float(v) for v in np.percentile(pooled, [50, 95, 99]))
        maximum = float(pooled.max())
    else:
        median = p95 = p99 = maximum = 0.0
    n_questions = len(divergences)
    n_diverging = sum(1 for d in divergences if d.diverged)
    overlaps = [d.mean_top_overlap for d in divergences if d.mean_top_overlap is not None]
    return {
        "n_questions": n_questions,
        "n_diverging": n_diverging,
        "fraction_diverging": n_diverging / n_questions if n_questions else 0.0,
        "n_aligned_tokens": int(pooled.size),
        "abs_delta_median": median,
        "abs_delta_p95": p95,
        "abs_delta_p99": p99,
        "abs_delta_max": maximum,
        "mean_top_overlap": float(np.mean(overlaps)) if overlaps else None,
    }


def first_tokens_delta(base: Sequence[TokenLogprob], pd: Sequence[TokenLogprob],
                       tokens: int = CONSISTENCY_TOKENS) -> float | None:
    """vLLM CI's consistency number of one prompt: the largest |Δ logprob| of the chosen token
    over the first `tokens` generated positions, taken position by position as upstream does
    (whatever each side chose there); None when no position has both logprobs finite."""
    deltas = [abs(b.logprob - p.logprob) for b, p in zip(base[:tokens], pd[:tokens])]
    finite = [d for d in deltas if math.isfinite(d)]
    return max(finite) if finite else None


def summarize_consistency(per_question: Mapping[int, float]) -> dict[str, Any] | None:
    """A cell's consistency numbers (doc id -> first_tokens_delta): the largest (what
    upstream's per-prompt assertion meets first), median and p95, and the questions at or over
    the bound; None without any."""
    if not per_question:
        return None
    values = np.array(list(per_question.values()), dtype=float)
    worst = max(per_question, key=lambda doc: per_question[doc])
    return {"tokens": CONSISTENCY_TOKENS, "bound_nats": CONSISTENCY_BOUND_NATS,
            "questions": int(values.size), "max_nats": float(values.max()),
            "median_nats": float(np.median(values)),
            "p95_nats": float(np.percentile(values, 95)),
            "over_bound": int((values >= CONSISTENCY_BOUND_NATS).sum()), "worst_doc": int(worst)}
