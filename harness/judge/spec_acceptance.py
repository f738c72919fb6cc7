"""Speculative decoding's acceptance: P/D's decode against the baseline, on the same questions.

Speculative decoding is lossless: a decode whose drafts are wrong (a draft model that reads a
KV that did not cross, a proposer fed the wrong history) answers exactly what a good one does,
only slower. So its answers cannot show it; its acceptance can.

**The data.** vLLM answers each request with its own acceptance
(``--per-request-spec-decode-metrics summary``: the response's ``metrics.speculative_decoding``,
kept per question by harness.eval.lmeval): the verify steps that had drafts, the draft tokens,
and a histogram of how many of each step's drafts the target accepted (``hist[j]``: the steps
that accepted exactly j). Summed over the questions both runs answered, they give vLLM's own
rates (those of ``vllm:spec_decode_*`` on /metrics):

    overall      R   = accepted draft tokens / draft tokens
    position i   r_i = steps that accepted more than i drafts / steps with drafts

**The test**, for the overall rate and each position: H0 "P/D's rate is at least (1 - tau) x
the baseline's". Paired by question, with a_q / d_q a question's numerator / denominator (P/D
p, baseline b) and A / D their sums, the statistic W = R_p - (1 - tau) R_b has the per-question
influence (delta method for a ratio of sums)

    w_q = (a_pq - R_p d_pq) / D_p - (1 - tau) (a_bq - R_b d_bq) / D_b,   se = sqrt(n/(n-1) sum w_q^2)

and the rate is **lower** when W / se < -z(1 - alpha'). ``tau`` is the larger of the margin (5 %
relative, ``Policy.spec_margin``) and the A/A's own relative
difference at that rate (the baseline's re-run at concurrency 1 on the first look's questions):
a drop no larger than two runs of the baseline show is never called one. ``alpha'`` is the
look's FAIL alpha split over the rates (Bonferroni). The question, not the token, is the unit:
a question's draft steps are not independent of each other, and pairing removes what the
questions themselves differ in.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from scipy.stats import norm

OVERALL = "overall"
POWER = 0.8     # the drop stated as detectable: found with this probability


@dataclass(frozen=True)
class Counts:
    """One answer's (or a run's summed) speculative decoding."""

    steps: int                  # verify steps with drafts (vLLM's num_drafts)
    drafted: int                # draft tokens proposed
    accepted: int               # draft tokens accepted
    per_pos: tuple[int, ...]    # per position i: steps that accepted more than i drafts

    def plus(self, other: "Counts") -> "Counts":
        width = max(len(self.per_pos), len(other.per_pos))
        pos = tuple(_at(self.per_pos, i) + _at(other.per_pos, i) for i in range(width))
        return Counts(self.steps + other.steps, self.drafted + other.drafted,
                      self.accepted + other.accepted, pos)

    def part(self, rate: int) -> tuple[int, int]:
        """(numerator, denominator) of rate ``rate`` (-1: overall, else a position)."""
        return (self.accepted, self.drafted) if rate < 0 else (_at(self.per_pos, rate), self.steps)

    def row(self) -> list[int]:
        """The record's compact form: [steps, drafted, accepted, *per_pos]."""
        return [self.steps, self.drafted, self.accepted, *self.per_pos]

    @classmethod
    def of_row(cls, row: Sequence[int]) -> "Counts":
        return cls(int(row[0]), int(row[1]), int(row[2]), tuple(int(x) for x in row[3:]))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "per_pos": list(self.per_pos),
                "rate": _ratio(self.accepted, self.drafted),
                "per_position": [_ratio(k, self.steps) for k in self.per_pos]}


def _at(values: Sequence[int], i: int) -> int:
    return values[i] if i < len(values) else 0


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


NONE = Counts(0, 0, 0, ())


def counts_of(spec: Mapping[str, Any] | None) -> Counts | None:
    """An answer's Counts from vLLM's per-request metrics, or None when it carries none."""
    if not spec or "acceptance_histogram" not in spec:
        return None
    hist = [int(h) for h in spec["acceptance_histogram"]]
    per_pos = tuple(sum(hist[i + 1:]) for i in range(max(len(hist) - 1, 0)))
    return Counts(steps=sum(hist), drafted=int(spec.get("num_draft_tokens") or 0),
                  accepted=sum(j * h for j, h in enumerate(hist)), per_pos=per_pos)


def total(counts: Sequence[Counts]) -> Counts:
    out = NONE
    for c in counts:
        out = out.plus(c)
    return out


def rate_name(rate: int) -> str:
    return OVERALL if rate < 0 else f"position {rate}"


@dataclass(frozen=True)
class RateTest:
    """One rate's test: P/D's against the baseline's, with what decided it."""

    rate: str
    baseline: float
    pd: float
    change: float               # relative: pd / baseline - 1
    tolerance: float            # tau
    aa_change: float | None     # the A/A's relative difference at this rate
    z: float
    p_value: float
    lower: bool                 # P/D's is lower by more than tau, beyond chance at alpha'
    detectable: float           # the relative drop found with POWER probability at this n

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}


def rel_change(pairs: Sequence[tuple[Counts, Counts]], rate: int) -> float | None:
    """The second side's relative difference from the first's at ``rate``; None: undefined."""
    num_b, den_b = map(sum, zip(*(b.part(rate) for b, _ in pairs))) if pairs else (0, 0)
    num_p, den_p = map(sum, zip(*(p.part(rate) for _, p in pairs))) if pairs else (0, 0)
    if not den_b or not num_b:
        return None
    return (num_p / den_p if den_p else 0.0) / (num_b / den_b) - 1


def rate_test(pairs: Sequence[tuple[Counts, Counts]], rate: int, margin: float, alpha: float,
              aa_change: float | None) -> RateTest | None:
    """The test of one rate over the paired questions; None where the baseline's rate is 0 or
    undefined (nothing to lose)."""
    parts = [(b.part(rate), p.part(rate)) for b, p in pairs]
    a_b = [x[0][0] for x in parts]
    d_b = [x[0][1] for x in parts]
    a_p = [x[1][0] for x in parts]
    d_p = [x[1][1] for x in parts]
    sum_ab, sum_db, sum_ap, sum_dp = sum(a_b), sum(d_b), sum(a_p), sum(d_p)
    if not sum_db or not sum_ab:
        return None
    r_b = sum_ab / sum_db
    r_p = sum_ap / sum_dp if sum_dp else 0.0      # P/D drafting nothing accepts nothing
    tau = max(margin, abs(aa_change) if aa_change is not None else 0.0)
    w = [((ap - r_p * dp) / sum_dp if sum_dp else 0.0) - (1 - tau) * (ab - r_b * db) / sum_db
         for ab, db, ap, dp in zip(a_b, d_b, a_p, d_p)]
    n = len(w)
    se = math.sqrt(n / (n - 1) * sum(x * x for x in w)) if n > 1 else 0.0
    stat = r_p - (1 - tau) * r_b
    z = stat / se if se > 0 else (-math.inf if stat < 0 else math.inf)
    p_value = float(norm.cdf(z))
    # the relative drop this n detects with POWER probability: tau plus the bound's width
    detectable = tau + (norm.ppf(1 - alpha) + norm.ppf(POWER)) * se / r_b
    return RateTest(rate_name(rate), r_b, r_p, r_p / r_b - 1, tau, aa_change, z, p_value,
                    p_value < alpha, min(detectable, 1.0))


@dataclass(frozen=True)
class SpecEvidence:
    """A cell's speculative decoding, question by question: the paired answers' Counts
    (baseline, P/D), the A/A's (baseline, A/A re-run), and the decode's /metrics delta."""

    pairs: tuple[tuple[Counts, Counts], ...]
    aa_pairs: tuple[tuple[Counts, Counts], ...]
    decode_counters: Mapping[str, float]
    unpaired: int = 0       # answered questions with a count on one side only

    @property
    def positions(self) -> int:
        return max((len(c.per_pos) for pair in self.pairs for c in pair), default=0)

    def summary(self) -> dict[str, Any]:
        """What the record keeps: each side's sums and rates, the A/A's, the decode's counters."""
        base, pd = total([b for b, _ in self.pairs]), total([p for _, p in self.pairs])
        aa_base, aa = total([b for b, _ in self.aa_pairs]), total([a for _, a in self.aa_pairs])
        return {"questions": len(self.pairs), "unpaired": self.unpaired,
                "baseline": base.to_dict(), "pd": pd.to_dict(),
                "aa": ({"questions": len(self.aa_pairs), "baseline": aa_base.to_dict(),
                        "aa": aa.to_dict()} if self.aa_pairs else None),
                "decode_counters": dict(self.decode_counters),
                "counters_agree": self.counters_agree(),
                # each question's (baseline, P/D) counts, as Counts.row: re-judging reads them
                "per_question": {"pairs": [[b.row(), p.row()] for b, p in self.pairs],
                                 "aa_pairs": [[b.row(), a.row()] for b, a in self.aa_pairs]}}

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any] | None) -> "SpecEvidence | None":
        """The evidence a record's summary keeps, or None where it keeps no per-question counts
        (no drafts, or a record written before they were kept)."""
        kept = (summary or {}).get("per_question")
        if not kept:
            return None

        def rows(key: str) -> tuple[tuple[Counts, Counts], ...]:
            return tuple((Counts.of_row(x), Counts.of_row(y)) for x, y in kept.get(key) or ())

        return cls(rows("pairs"), rows("aa_pairs"), dict(summary.get("decode_counters") or {}),
                   unpaired=int(summary.get("unpaired") or 0))

    def counters_agree(self) -> bool:
        """Whether the answers' own counts sum to what the decode's /metrics counted."""
        pd = total([p for _, p in self.pairs])
        c = self.decode_counters
        return (c.get("spec_drafts") == pd.steps and c.get("spec_draft_tokens") == pd.drafted
                and c.get("spec_accepted_tokens") == pd.accepted and not self.unpaired)

    def alpha_each(self, alpha: float) -> float:
        """Each rate's share of alpha: the overall rate and every position (Bonferroni)."""
        return alpha / (1 + self.positions)

    def tests(self, margin: float, alpha: float) -> list[RateTest]:
        """Every rate's test, overall first, each at its share of alpha."""
        rates = [-1, *range(self.positions)]
        each = self.alpha_each(alpha)
        found = [rate_test(self.pairs, r, margin, each, rel_change(self.aa_pairs, r))
                 for r in rates]
        return [t for t in found if t is not None]


def evidence(pairs: Sequence[tuple[Mapping | None, Mapping | None]],
             aa_pairs: Sequence[tuple[Mapping | None, Mapping | None]],
             decode_counters: Mapping[str, float]) -> SpecEvidence | None:
    """The SpecEvidence of the answers' per-request metrics (baseline's, P/D's), or None when
    neither side carries any (no drafts, or a vLLM without per-request metrics)."""
    counted = [(counts_of(b), counts_of(p)) for b, p in pairs]
    if not any(b or p for b, p in counted):
        return None
    both = tuple((b, p) for b, p in counted if b is not None and p is not None)
    aa = tuple((b, a) for b, a in ((counts_of(x), counts_of(y)) for x, y in aa_pairs)
               if b is not None and a is not None)
    return SpecEvidence(both, aa, dict(decode_counters),
                        unpaired=sum((b is None) != (p is None) for b, p in counted))


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def describe(ev: SpecEvidence, margin: float, alpha: float) -> tuple[bool, str]:
    """(passed, the check's line): FAIL names the rates (positions) that are lower."""
    tests = ev.tests(margin, alpha)
    s = ev.summary()
    base, pd = s["baseline"], s["pd"]
    counters = ev.decode_counters
    said = (f"over {s['questions']} questions P/D accepted {pd['accepted']:,} of "
            f"{pd['drafted']:,} drafted tokens ({_pct(pd['rate'] or 0.0)}), the baseline "
            f"{base['accepted']:,} of {base['drafted']:,} ({_pct(base['rate'] or 0.0)})")
    per_pos = "/".join(f"{x:.2f}" for x in pd["per_position"] if x is not None)
    per_pos_b = "/".join(f"{x:.2f}" for x in base["per_position"] if x is not None)
    said += f"; per position P/D {per_pos or '-'} vs {per_pos_b or '-'}"
    said += (f"; the decode's /metrics agree ({counters.get('spec_draft_tokens', 0):,.0f} drafted)"
             if ev.counters_agree() else
             f"; the decode's /metrics counted {counters.get('spec_drafts', 0):,.0f} drafts, "
             f"{counters.get('spec_draft_tokens', 0):,.0f} drafted, "
             f"{counters.get('spec_accepted_tokens', 0):,.0f} accepted")
    lower = [t for t in tests if t.lower]
    if not tests:
        return True, f"the baseline accepted no draft: nothing to lose; {said}"
    if lower:
        worst = min(lower, key=lambda t: t.p_value)
        names = ", ".join(t.rate for t in lower)
        return False, (f"lower at {names}: {worst.rate} {_pct(worst.pd)} vs {_pct(worst.baseline)} "
                       f"({100 * worst.change:+.1f} %, tolerance {_pct(worst.tolerance)}, "
                       f"p={worst.p_value:.2g} < {ev.alpha_each(alpha):.2g})"
                       f"; {said}")
    overall = tests[0]
    return True, (f"{overall.rate} {100 * overall.change:+.1f} % (tolerance "
                  f"{_pct(overall.tolerance)}, a drop of {_pct(overall.detectable)} found with "
                  f"{POWER:.0%} power); {said}")


__all__ = ["Counts", "RateTest", "SpecEvidence", "counts_of", "describe", "evidence",
           "rate_test", "total"]
