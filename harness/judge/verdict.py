"""Comparison → Verdict: the decision rules, in the order they are applied.

PASS          every check passed and the run had the power to see a drop of `max_mde`.
FAIL          the P/D pair is broken: it failed to start or hand-shake while the baseline ran,
              its requests failed, no KV crossed, or its answers/generations/logprobs are worse
              than the baseline beyond chance.
INCONCLUSIVE  nothing failed, but too few questions to guarantee the stated sensitivity.
ERROR         the environment is broken (the baseline itself failed to start or to answer, or
              scores far below the model's known accuracy): retry, do not blame P/D.

A cell declared as an expected failure keeps its status; its *outcome* is XFAIL (failed as
expected) or XPASS (passed although expected to fail — the run says so, strict). A canary's
outcome is CAUGHT (FAIL for its fault's own reason) or MISSED (anything else but ERROR); see
harness.judge.canaries. An expected failure whose baseline broke stays ERROR: the environment
failed, not the cell, and a retry is right.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.judge.compare import Comparison
from harness.judge.stats import below_reference

from harness.core.outcomes import ERROR, EXIT_CODES, FAIL, INCONCLUSIVE, PASS, XFAIL, XPASS
from harness.core.reference import ReferenceAccuracy  # noqa: F401 (the judge's input type)
from harness.judge.canaries import canary_outcome


@dataclass(frozen=True)
class Policy:
    alpha: float = 0.01               # one-sided tests (McNemar, noise floor)
    max_mde: float = 0.25             # a PASS must be able to see a drop this large (80% power)
    logprob_min_threshold: float = 0.10   # nats; |Δ logprob| p95 above this AND ...
    logprob_floor_factor: float = 5.0     # ... above factor × the A/A p95 is divergence
    min_questions: int = 10
    # a baseline more than this far below the model card's accuracy (one-sided binomial test at
    # alpha) is broken itself: ERROR, the P/D comparison would be meaningless
    baseline_tolerance: float = 0.10


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Verdict:
    status: str
    reason: str
    checks: tuple[Check, ...] = ()
    expected_failure: str | None = None
    decision_path: tuple[str, ...] = field(default=())
    canary: str | None = None          # the injected fault of a canary cell

    @property
    def outcome(self) -> str:
        if self.canary:
            return canary_outcome(self.canary, self.status, self.reason)
        if self.expected_failure:
            if self.status == FAIL:
                return XFAIL
            if self.status == PASS:
                return XPASS
        return self.status

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "expected_failure": self.expected_failure,
            "canary": self.canary,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "checks": [asdict(c) for c in self.checks],
            "decision_path": list(self.decision_path),
        }


def error(reason: str, expected_failure: str | None = None) -> Verdict:
    return Verdict(ERROR, reason, expected_failure=expected_failure, decision_path=("error",))


def fail(reason: str, expected_failure: str | None = None, check: str = "startup") -> Verdict:
    return Verdict(FAIL, reason, checks=(Check(check, False, reason),),
                   expected_failure=expected_failure, decision_path=(check,))


def transfer_checks(cmp: Comparison) -> list[Check]:
    t = cmp.transfer
    c = t.counters
    allowance = t.recompute_allowance * max(t.requests, 1)
    # a decode request without params recomputes its prompt; one with another request's params
    # reads foreign KV: two different faults, told apart when the proof counts what was sent
    sent = t.requests if t.requests_sent_params is None else t.requests_sent_params
    foreign = sent - t.requests_own_params
    checks = [
        Check("proxy-saw-every-question", t.requests >= cmp.n,
              f"proxy handled {t.requests} requests for {cmp.n} questions"),
        Check("prefill-returned-params", t.requests > 0 and t.requests_with_params == t.requests,
              f"{t.requests_with_params}/{t.requests} prefill responses carried kv_transfer_params"),
        Check("decode-got-params", sent == t.requests,
              f"decode received no kv_transfer_params on {t.requests - sent} of {t.requests} "
              f"requests"),
        Check("decode-got-own-params", foreign == 0,
              f"decode received another request's transfer parameters on "
              f"{foreign} of {t.requests} requests"
              if foreign else
              f"{t.requests_own_params}/{t.requests} decode requests carried their own "
              f"prefill's parameters"),
        Check("kv-arrived-externally", c.prompt_tokens_external > 0 and c.nixl_bytes > 0,
              f"external_kv_transfer={c.prompt_tokens_external:.0f} tokens, "
              f"nixl_bytes={c.nixl_bytes:.0f}"),
        Check("decode-did-not-recompute", c.prompt_tokens_local <= allowance,
              f"decode computed {c.prompt_tokens_local:.0f} prompt tokens itself "
              f"(allowed {allowance}: {t.recompute_allowance}/request by design); "
              f"external={c.prompt_tokens_external:.0f}, cache_hit={c.prompt_tokens_cache_hit:.0f}"),
        Check("no-failed-transfers", c.nixl_failed_transfers == 0 and c.nixl_failed_notifications == 0,
              f"failed transfers={c.nixl_failed_transfers:.0f}, "
              f"failed notifications={c.nixl_failed_notifications:.0f}"),
    ]
    return checks


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def baseline_health(cmp: Comparison, reference: ReferenceAccuracy, policy: Policy) -> Check:
    correct = round(cmp.baseline_accuracy * cmp.n)
    p = below_reference(correct, cmp.n, reference.accuracy, policy.baseline_tolerance)
    return Check("baseline-health", p > policy.alpha,
                 f"baseline {_pct(cmp.baseline_accuracy)} ({correct}/{cmp.n}) vs "
                 f"{_pct(reference.accuracy)} measured by {reference.source} (n={reference.n}); "
                 f"below it by more than {100 * policy.baseline_tolerance:.0f} pts: binomial p={p:.3g}")


def decide(cmp: Comparison, policy: Policy = Policy(), expected_failure: str | None = None,
           reference: ReferenceAccuracy | None = None) -> Verdict:
    checks: list[Check] = []
    path: list[str] = []

    # 0. the baseline itself: a non-disaggregated server far below the model's known accuracy is
    #    broken on this configuration (backend, TP, build) and nothing can be said about P/D
    if reference is not None and cmp.n > 0:
        health = baseline_health(cmp, reference, policy)
        checks.append(health)
        path.append("baseline-health")
        if not health.passed:
            return Verdict(ERROR, f"the baseline itself is broken here: {health.detail}",
                           tuple(checks), expected_failure, tuple(path))

    # 1. transfer proof: a P/D pair that moved no KV is a FAIL whatever its accuracy. All checks
    #    are computed (the record shows every one); the first failing one in this order decides.
    tchecks = transfer_checks(cmp)
    checks += tchecks
    path.append("transfer")

    # 2. accuracy: exact one-sided McNemar on the discordant pairs
    m = cmp.mcnemar
    acc_detail = (f"baseline {_pct(cmp.baseline_accuracy)} vs P/D {_pct(cmp.pd_accuracy)} "
                  f"(Δ {100 * cmp.accuracy_delta:+.1f} pts, 95% CI "
                  f"[{100 * cmp.delta_ci.low:+.1f}, {100 * cmp.delta_ci.high:+.1f}]), "
                  f"discordant {m.baseline_only}↓/{m.pd_only}↑, McNemar p={m.p_value:.3g}")
    acc_ok = m.p_value > policy.alpha
    checks.append(Check("accuracy", acc_ok, acc_detail))
    path.append("accuracy")

    # 3. generations: disagreement against the A/A noise floor
    floor_ok = True
    if cmp.floor is not None:
        f = cmp.floor
        floor_ok = not f.exceeds
        checks.append(Check("noise-floor", floor_ok,
                            f"P/D generations differ on {f.pd_differing}/{f.pd_total} "
                            f"({_pct(f.pd_rate)}) vs A/A {f.aa_differing}/{f.aa_total} "
                            f"({_pct(f.aa_rate)}), Fisher p={f.p_value:.3g}"))
        path.append("noise-floor")

    # 4. logprob divergence at aligned positions, against the A/A divergence
    lp_ok = True
    if cmp.logprob is not None and cmp.logprob["n_aligned_tokens"] > 0:
        aa_p95 = (cmp.logprob_floor or {}).get("abs_delta_p95") or 0.0
        threshold = max(policy.logprob_min_threshold, policy.logprob_floor_factor * aa_p95)
        p95 = cmp.logprob["abs_delta_p95"]
        lp_ok = p95 <= threshold
        checks.append(Check("logprob-divergence", lp_ok,
                            f"|Δ logprob| p95 {p95:.4f} nats over {cmp.logprob['n_aligned_tokens']} "
                            f"aligned tokens (threshold {threshold:.4f}; A/A p95 {aa_p95:.4f})"))
        path.append("logprob")

    bad_transfer = [c for c in tchecks if not c.passed]
    if bad_transfer:
        first = bad_transfer[0]
        if first.name in ("decode-got-params", "kv-arrived-externally", "decode-did-not-recompute"):
            reason = f"decode recomputed the prompt: no KV crossed ({first.detail})"
        else:
            reason = f"transfer proof failed [{first.name}]: {first.detail}"
        return Verdict(FAIL, reason, tuple(checks), expected_failure, tuple(path))

    failed = [c for c in checks if not c.passed]
    if failed:
        first = failed[0]
        reason = {
            "accuracy": f"P/D accuracy is lower: {first.detail}",
            "noise-floor": f"P/D generations diverge beyond the A/A floor: {first.detail}",
            "logprob-divergence": f"P/D logprobs diverge from the baseline: {first.detail}",
        }[first.name]
        if cmp.examples:
            ex = cmp.examples[0]
            reason += (f"; e.g. doc {ex['doc_id']}: baseline {ex['baseline_answer']!r} vs "
                       f"P/D {ex['pd_answer']!r}")
        return Verdict(FAIL, reason, tuple(checks), expected_failure, tuple(path))

    # 5. power: never PASS what could have hidden a large regression
    path.append("power")
    mde_txt = "no drop" if not math.isfinite(cmp.mde) else f"drops ≥ {100 * cmp.mde:.1f} pts"
    powered = cmp.n >= policy.min_questions and math.isfinite(cmp.mde) and cmp.mde <= policy.max_mde
    checks.append(Check("power", powered,
                        f"n={cmp.n} detects {mde_txt} at 80% power, α={policy.alpha} "
                        f"(required ≤ {100 * policy.max_mde:.0f} pts)"))
    if not powered:
        return Verdict(INCONCLUSIVE,
                       f"underpowered: n={cmp.n} can only detect {mde_txt} "
                       f"(policy requires {100 * policy.max_mde:.0f} pts); {acc_detail}",
                       tuple(checks), expected_failure, tuple(path))
    t = cmp.transfer.counters
    return Verdict(PASS,
                   f"{acc_detail}; {cmp.generations_differing}/{cmp.n} generations differ; "
                   f"{t.prompt_tokens_external:.0f} prompt tokens arrived over NIXL; "
                   f"could miss {mde_txt.replace('drops ≥', 'drops <')}",
                   tuple(checks), expected_failure, tuple(path))

