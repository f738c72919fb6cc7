"""The numbers a verdict rests on, in the units a person reads, for every place that shows them
(the console's verdict table, the Buildkite annotation, the HTML report and its forest plot).

Accuracies are percentages, their difference is in points (pts), the way the verdict's own
reason says it ("not worse than the baseline by more than 5.0 pts"). The interval shown beside a
delta is the one the verdict used when a look of the sequential gate decided the cell
(``verdict.look``): its lower end is the look's upper bound of the drop (at 1 - alpha_pass of
that look; PASS needs it within the margin), its upper end the look's lower bound of the drop
(at 1 - alpha_fail), so together they cover 1 - alpha_pass - alpha_fail. A cell decided before
any look (a transfer or weather check failed, a canary caught, an ERROR) has no such interval;
its 95 % bootstrap interval (``metrics.delta_ci``) is then shown, labelled as descriptive.
Counts (tokens, bytes, requests) are integers and are printed as integers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

VERDICT = "verdict"           # the interval of the look that decided the cell
DESCRIPTIVE = "descriptive"   # the 95 % bootstrap interval, not what the verdict rested on


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def pct(value: Any) -> str:
    """An accuracy (a fraction) as a percentage: 0.88 -> "88.0 %"."""
    value = _float(value)
    return "-" if value is None else f"{100 * value:.1f} %"


def pts(value: Any, signed: bool = True) -> str:
    """A difference of two accuracies (a fraction) in points: -0.12 -> "-12.0"."""
    value = _float(value)
    if value is None:
        return "-"
    text = f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"
    return "+0.0" if text == "-0.0" else text


def count(value: Any) -> str:
    """A count (tokens, bytes, requests) as an integer: 22997.0 -> "22997"; "-" when unknown."""
    value = _float(value)
    if value is None:
        return "-"
    return f"{int(value)}" if value.is_integer() else f"{value:g}"


def confidence_text(level: float | None) -> str:
    """0.99636 -> "99.64 %"; 0.95 -> "95 %"."""
    if level is None:
        return "-"
    text = f"{100 * level:.2f}".rstrip("0").rstrip(".")
    return f"{text} %"


@dataclass(frozen=True)
class Accuracy:
    """A cell's accuracy evidence, fractions as recorded (render with pct / pts)."""

    baseline: float | None
    pd: float | None
    delta: float | None            # pd - baseline
    lo: float | None               # interval of the delta
    hi: float | None
    confidence: float | None       # what [lo, hi] covers
    source: str | None             # VERDICT | DESCRIPTIVE | None (no interval)
    margin: float | None           # the non-inferiority margin the verdict held the drop to
    n: int | None
    look: str | None = None        # "look 2 of 3" when a look decided

    @property
    def interval(self) -> str:
        """e.g. "[-4.1, +4.1] pts (99.64 %, verdict)"; "-" without one."""
        if self.lo is None or self.hi is None:
            return "-"
        whose = "verdict" if self.source == VERDICT else "descriptive"
        return f"[{pts(self.lo)}, {pts(self.hi)}] pts ({confidence_text(self.confidence)}, {whose})"

    @property
    def short_interval(self) -> str:
        """e.g. "[-4.1, +4.1] 99.64 %" (a narrow table column); "-" without one."""
        if self.lo is None or self.hi is None:
            return "-"
        mark = "" if self.source == VERDICT else "*"
        return f"[{pts(self.lo)}, {pts(self.hi)}] {confidence_text(self.confidence)}{mark}"

    def as_points(self) -> dict[str, Any]:
        """Every number in points or percent (JSON for the report's page)."""
        scale = lambda v: None if v is None else round(100 * v, 2)  # noqa: E731
        return {"baseline_pct": scale(self.baseline), "pd_pct": scale(self.pd),
                "delta_pts": scale(self.delta), "lo_pts": scale(self.lo), "hi_pts": scale(self.hi),
                "confidence": self.confidence, "source": self.source,
                "margin_pts": scale(self.margin), "n": self.n, "look": self.look}


def accuracy_of(record: Mapping[str, Any]) -> Accuracy:
    """The accuracy evidence of one result record (see the module docstring)."""
    metrics = record.get("metrics") or {}
    verdict = record.get("verdict") or {}
    look = verdict.get("look") if isinstance(verdict.get("look"), Mapping) else None
    baseline, pd = _float(metrics.get("baseline_accuracy")), _float(metrics.get("pd_accuracy"))
    delta = _float(metrics.get("accuracy_delta"))
    n = metrics.get("n")
    if look and _float(look.get("drop_upper")) is not None and _float(look.get("drop_lower")) is not None:
        alpha = (_float(look.get("alpha_pass_look")) or 0.0) + (_float(look.get("alpha_fail_look")) or 0.0)
        drop = _float(look.get("drop"))
        return Accuracy(baseline, pd, -drop if drop is not None else delta,
                        -float(look["drop_upper"]), -float(look["drop_lower"]), 1.0 - alpha,
                        VERDICT, _float(look.get("margin")), look.get("n", n),
                        f"look {look.get('look')} of {look.get('n_looks')}")
    ci = metrics.get("delta_ci") or [None, None]
    detail = metrics.get("delta_ci_detail") or {}
    lo, hi = (_float(ci[0]), _float(ci[1])) if len(ci) == 2 else (None, None)
    margin = _float(((metrics.get("sequential") or {}).get("plan") or {}).get("margin"))
    if margin is None:
        margin = _float((record.get("options") or {}).get("margin"))
    return Accuracy(baseline, pd, delta, lo, hi,
                    _float(detail.get("confidence")) or (0.95 if lo is not None else None),
                    DESCRIPTIVE if lo is not None else None, margin, n)


def accuracy_of_row(row: Mapping[str, Any]) -> Accuracy:
    """The same from a history row alone (no record to read): its 95 % interval, descriptive."""
    lo, hi = _float(row.get("ci_lo")), _float(row.get("ci_hi"))
    return Accuracy(_float(row.get("baseline_acc")), _float(row.get("pd_acc")),
                    _float(row.get("delta")), lo, hi, 0.95 if lo is not None else None,
                    DESCRIPTIVE if lo is not None else None, None, row.get("n"))


__all__ = ["Accuracy", "DESCRIPTIVE", "VERDICT", "accuracy_of", "accuracy_of_row",
           "confidence_text", "count", "pct", "pts"]
