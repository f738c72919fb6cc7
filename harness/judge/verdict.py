"""Comparison → Verdict: the decision rules, in the order they are applied.

PASS          the transfer is proven, generations and logprobs are within the A/A floor, and P/D
              is not worse than the baseline by more than the margin (default 5 pts): the upper
              confidence bound of the accuracy drop is within it (harness.judge.sequential).
FAIL          the P/D pair is broken: it failed to start or hand-shake while the baseline ran,
              its requests failed, no KV crossed, or its answers/generations/logprobs are worse
              than the baseline beyond chance.
CONTINUE      (not an outcome) undecided at this look: the runner asks more questions.
INCONCLUSIVE  nothing failed, but at the question budget the bound still exceeds the margin.
ERROR         the environment is broken (the baseline itself failed to start or to answer, or
              scores far below the model's known accuracy): retry, do not blame P/D.

A cell declared as an expected failure keeps its status; its *outcome* is XFAIL (failed as
expected) or XPASS (passed although expected to fail — the run says so, strict). A canary's
outcome is CAUGHT (FAIL for its fault's own reason) or MISSED (anything else but ERROR); see
harness.judge.canaries. An expected failure whose baseline broke stays ERROR: the environment
failed, not the cell, and a retry is right.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from harness.core.cell import Cell
from harness.core.outcomes import (CONTINUE, ERROR, EXIT_CODES, FAIL, INCONCLUSIVE, PASS, XFAIL,
                                   XPASS)
from harness.core.reference import ReferenceAccuracy  # noqa: F401 (the judge's input type)
from harness.judge.canaries import canary_outcome
from harness.judge.compare import Comparison
from harness.judge.kv_digest_check import describe as describe_digest
from harness.judge.spec_acceptance import describe as describe_spec
from harness.judge.sequential import SequentialPlan, evaluate_look
from harness.judge.stats import below_reference
from harness.judge.weather import WeatherJudgement, series_line, weather_checks


@dataclass(frozen=True)
class Policy:
    alpha: float = 0.01               # FAIL: one-sided tests (McNemar, noise floor); PASS: the
                                      # non-inferiority bound's error, each over all looks
    margin: float = 0.05              # PASS: the accuracy drop is at most this (5 pts)
    stages: tuple[int, ...] = (50, 100, 200, 400)   # questions at each look; the last: budget
    logprob_min_threshold: float = 0.10   # nats; |Δ logprob| p95 above this AND ...
    logprob_floor_factor: float = 5.0     # ... above factor × the A/A p95 is divergence
    # a baseline more than this far below the model card's accuracy (one-sided binomial test at
    # alpha) is broken itself: ERROR, the P/D comparison would be meaningless
    baseline_tolerance: float = 0.10
    # speculative decoding: P/D's draft acceptance (overall, each position) may be lower than
    # the baseline's by this much relative, or by the A/A's own difference if larger (a policy;
    # vLLM's P/D + EAGLE3 test holds acceptance to a standalone reference within a tolerance)
    spec_margin: float = 0.05

    @classmethod
    def from_options(cls, options: Any) -> "Policy":
        """The judge's half of a run's RunOptions."""
        return cls(alpha=options.alpha, margin=options.margin, stages=options.stages)

    @property
    def plan(self) -> SequentialPlan:
        return SequentialPlan(stages=self.stages, margin=self.margin, alpha_fail=self.alpha,
                              alpha_pass=self.alpha)


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
    look: dict | None = None           # the sequential look that decided (LookDecision.to_dict)
    expected_failure_match: str | None = None   # the declared failure's reason regex (None: any)
    # checks this deployment cannot support, one line each ("<check>: not available with an
    # external router (why)"): neither passed nor failed, and said so in the record
    not_available: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        if self.canary:
            return canary_outcome(self.canary, self.status, self.reason)
        if self.expected_failure:
            if self.failed_as_declared:
                return XFAIL
            if self.status == PASS:
                return XPASS
        return self.status

    @property
    def failed_as_declared(self) -> bool:
        """An expected failure failed the way its declaration says: a FAIL whose reason matches
        the declared pattern (any FAIL when none is declared), or an ERROR the pattern names
        (a declaration that the baseline itself is broken upstream). A FAIL for another reason
        stays FAIL, a broken environment stays ERROR."""
        pattern = self.expected_failure_match
        if self.status == FAIL:
            return pattern is None or re.search(pattern, self.reason) is not None
        return self.status == ERROR and pattern is not None and re.search(pattern, self.reason) is not None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        """The verdict a record holds (`to_dict`'s output; the derived fields are recomputed)."""
        return cls(status=data["status"], reason=data.get("reason", ""),
                   checks=tuple(Check(c["name"], bool(c["passed"]), c.get("detail", ""))
                                for c in data.get("checks") or ()),
                   expected_failure=data.get("expected_failure"),
                   decision_path=tuple(data.get("decision_path") or ()),
                   canary=data.get("canary"), look=data.get("look"),
                   expected_failure_match=data.get("expected_failure_match"),
                   not_available=tuple(data.get("not_available") or ()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "expected_failure": self.expected_failure,
            "canary": self.canary,
            "expected_failure_match": self.expected_failure_match,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "checks": [asdict(c) for c in self.checks],
            "decision_path": list(self.decision_path),
            "look": self.look,
            "not_available": list(self.not_available),
        }


def as_declared(verdict: Verdict, cell: Cell) -> Verdict:
    """`verdict` with what `cell` declares, which decides its outcome: a canary is CAUGHT or
    MISSED, an expected failure XFAIL only when it failed as declared."""
    return replace(verdict, canary=cell.fault, expected_failure=cell.expected_failure,
                   expected_failure_match=cell.expected_failure_match)


def error(reason: str, expected_failure: str | None = None) -> Verdict:
    return Verdict(ERROR, reason, expected_failure=expected_failure, decision_path=("error",))


def fail(reason: str, expected_failure: str | None = None, check: str = "startup") -> Verdict:
    return Verdict(FAIL, reason, checks=(Check(check, False, reason),),
                   expected_failure=expected_failure, decision_path=(check,))


@dataclass(frozen=True)
class CheckRow:
    """One check of the verdict: its name (in records and README), the stage it belongs to, how
    it is computed, and what its failure means (the verdict's reason; ``{detail}`` is the
    check's own line). The table's order is the order checks are judged in: the first failing
    one decides."""

    name: str
    stage: str          # baseline | transfer | kv | accuracy
    computed: str
    failure: str
    status: str = FAIL

    def reason(self, detail: str) -> str:
        return self.failure.format(detail=detail, name=self.name)


NO_KV = "decode recomputed the prompt: no KV crossed ({detail})"
CHECKS: tuple[CheckRow, ...] = (
    CheckRow("baseline-health", "baseline", "one-sided binomial test of the baseline's accuracy "
             "against the model card's, minus the tolerance", "the baseline itself is broken "
             "here: {detail}", ERROR),
    # a cell judged under weather (harness.judge.weather): per request, before the aggregates
    CheckRow("weather-happened", "weather", "the weather's own conditions that it blew (blocks "
             "recycled, preemptions counted, events injected)", "the weather did not happen, "
             "nothing is said about P/D under it: {detail}", ERROR),
    CheckRow("silent-wrong-answers", "weather", "every HTTP 200's prompt KV equals its "
             "prefill's, per request (digest)", "silent wrong answers under weather: {detail}"),
    CheckRow("failures-accounted", "weather", "every failure loud and after an event the "
             "weather injected into that request; at most the weather's budget",
             "P/D failed under weather beyond what was injected: {detail}"),
    CheckRow("weather-holds", "weather", "what the weather says must hold under it (counts "
             "matching its events)", "under weather [{name}]: {detail}"),
    CheckRow("servers-healthy", "weather", "every P/D server alive and answering /health "
             "afterwards", "a P/D server is not healthy after the weather: {detail}"),
    CheckRow("agreement-trend", "weather", "a weather's request series (its windows): "
             "one-sided Mann-Kendall test of the windows' agreement with the baseline's "
             "answers against their order, alpha 0.01",
             "agreement falls over the series beyond chance: {detail}"),
    CheckRow("proxy-saw-every-question", "transfer", "proxy records >= questions asked",
             "transfer proof failed [{name}]: {detail}"),
    # 1P2D, 2P1D ...: a topology is judged only if every one of its servers took part
    CheckRow("every-instance-served", "transfer", "a pair of several prefill or decode "
             "instances: each instance got >= 1 request (proxy records)",
             "an instance of the pair served no request: {detail}"),
    CheckRow("prefill-returned-params", "transfer", "every prefill answer carried "
             "kv_transfer_params (proxy records)", "transfer proof failed [{name}]: {detail}"),
    CheckRow("decode-got-params", "transfer", "every decode request carried usable params "
             "(proxy records)", NO_KV),
    CheckRow("decode-got-own-params", "transfer", "the params each decode got are the "
             "connector's from its own prefill's answer", "transfer proof failed [{name}]: {detail}"),
    CheckRow("no-failed-transfers", "transfer", "the connector's failed transfers and "
             "notifications did not grow (/metrics)", "transfer proof failed [{name}]: {detail}"),
    CheckRow("kv-arrived-externally", "transfer", "prompt tokens of source external_kv_transfer "
             "and connector bytes > 0 (/metrics; bytes where the connector counts them)", NO_KV),
    CheckRow("decode-did-not-recompute", "transfer", "local_compute prompt tokens <= the "
             "design's recompute allowance (/metrics)", NO_KV),
    CheckRow("kv-bytes-exact", "transfer", "the connector's bytes == the blocks that crossed x "
             "the KV geometry (judge/byte_accounting)", "transfer proof failed [{name}]: {detail}"),
    CheckRow("kv-crossed-the-link", "transfer", "netns: the decode's P<->D link received at "
             "least the connector's bytes", "the KV did not cross the network link: {detail}"),
    CheckRow("kv-digest", "kv", "both sides' per-request hashes of the prompt KV are equal",
             "the decode's prompt KV is not the prefill's [{name}]: {detail}"),
    # lossless: wrong drafts answer right, only slower; no answer check can see them
    CheckRow("spec-acceptance", "drafts", "speculative decoding: the decode's draft acceptance "
             "(overall and per position, each answer's own) vs the baseline's on the same "
             "questions: one-sided paired test that it is lower by more than max(5 % relative, "
             "the A/A's difference)", "P/D's drafts are accepted less than the baseline's "
             "[{name}]: {detail}"),
    CheckRow("accuracy", "accuracy", "sequential non-inferiority: exact McNemar (FAIL), Tango "
             "bound within the margin (PASS)", "P/D accuracy is lower: {detail}"),
    CheckRow("noise-floor", "accuracy", "generations differing vs the A/A re-run, Fisher's exact "
             "test", "P/D generations diverge beyond the A/A floor: {detail}"),
    CheckRow("logprob-divergence", "accuracy", "|d logprob| p95 at aligned tokens vs a "
             "threshold and the A/A p95", "P/D logprobs diverge from the baseline: {detail}"),
)
CHECK_ROWS = {row.name: row for row in CHECKS}


def check_row(name: str) -> CheckRow:
    """The table's row of ``name``; a check the table does not list fails with its own line."""
    return CHECK_ROWS.get(name) or CheckRow(name, "accuracy", "(not in the table)",
                                            "check {name} failed: {detail}")


def first_failing(checks: list[Check]) -> Check | None:
    """The failing check that decides: the earliest in the table (unknown names last)."""
    order = {row.name: i for i, row in enumerate(CHECKS)}
    failing = [c for c in checks if not c.passed]
    return min(failing, key=lambda c: order.get(c.name, len(order)), default=None)


def transfer_checks(cmp: Comparison) -> list[Check]:
    t = cmp.transfer
    c = t.counters
    # each child of an n > 1 request is a sequence of its own on the decode
    allowance = t.recompute_allowance * max(t.sequences or t.requests, 1)
    # a decode request without params recomputes its prompt; one with another request's params
    # reads foreign KV: two different faults, told apart when the proof counts what was sent
    sent = t.requests if t.requests_sent_params is None else t.requests_sent_params
    foreign = sent - t.requests_own_params
    checks = [
        Check("proxy-saw-every-question", t.requests >= cmp.n,
              f"proxy handled {t.requests} requests for {cmp.n} questions"),
        Check("prefill-returned-params", t.requests > 0 and t.requests_with_params == t.requests,
              f"{t.requests_with_params}/{t.requests} prefill responses carried kv_transfer_params"
              + (f" ({t.params_named_by_proxy} named by the proxy once the prefill answered: "
                 f"the connector's prefill answers none)" if t.params_named_by_proxy else "")),
        Check("decode-got-params", sent == t.requests,
              f"decode received no kv_transfer_params on {t.requests - sent} of {t.requests} "
              f"requests"),
        Check("decode-got-own-params", foreign == 0,
              f"decode received another request's transfer parameters on "
              f"{foreign} of {t.requests} requests"
              if foreign else
              f"{t.requests_own_params}/{t.requests} decode requests carried their own "
              f"prefill's parameters"),
        # before the recompute checks: a read that failed makes the decode recompute (policy
        # "recompute"), and the failed read is the cause to name
        Check("no-failed-transfers", c.failed_transfers == 0 and c.failed_notifications == 0,
              f"failed transfers={c.failed_transfers:.0f}, "
              f"failed notifications={c.failed_notifications:.0f}"),
        # a connector that counts no bytes (ExampleConnector) is held to vLLM's own count alone
        Check("kv-arrived-externally", c.prompt_tokens_external > 0
              and (c.kv_bytes > 0 or not t.kv_bytes_counted),
              f"external_kv_transfer={c.prompt_tokens_external:.0f} tokens, "
              + (f"kv_bytes={c.kv_bytes:.0f}" if t.kv_bytes_counted
                 else "kv_bytes not counted by the connector")),
        Check("decode-did-not-recompute", c.prompt_tokens_local <= allowance,
              f"decode computed {c.prompt_tokens_local:.0f} prompt tokens itself "
              f"(allowed {allowance}: {t.recompute_allowance}/request by design"
              + (f", a child of n > 1 a request of its own: {t.sequences} sequences"
                 if t.sequences and t.sequences != t.requests else "") + "); "
              f"external={c.prompt_tokens_external:.0f}, cache_hit={c.prompt_tokens_cache_hit:.0f}"),
    ]
    if t.instances is not None:
        checks.insert(1, instances_check(t.instances))
    if t.byte_account is not None:
        # last, so a canary that already fails an earlier check keeps its reason
        checks.append(Check("kv-bytes-exact", bool(t.byte_account["exact"]),
                            str(t.byte_account["detail"])))
    if t.link is not None:
        checks.append(link_check(t.link, c.kv_bytes))
    return checks


def instances_check(instances: dict) -> Check:
    """every-instance-served: each prefill and decode instance of the pair got a request."""
    def says(row: dict) -> str:
        tokens = row.get("external_tokens")
        return (f"{row['name']} {row['requests']}"
                + (f" ({tokens:.0f} prompt tokens through the connector)" if tokens is not None
                   else ""))

    idle = [row["name"] for rows in instances.values() for row in rows if not row["requests"]]
    detail = "; ".join(f"{role}: " + ", ".join(says(row) for row in rows)
                       for role, rows in instances.items())
    return Check("every-instance-served", not idle,
                 (f"{', '.join(idle)} got none; " if idle else "") + f"requests per instance: {detail}")


def link_check(link: dict, kv_bytes: float) -> Check:
    """network: netns: the decode's P<->D link received at least the bytes the connector says it moved
    (else they went another way: shared memory is not isolated by network namespaces)."""
    rx = link.get("decode_rx_bytes")
    ucx = ", ".join(f"{name} UCX_TLS={env.get('UCX_TLS')}"
                    for name, env in sorted((link.get("ucx") or {}).items()))
    where = f"the decode's {link.get('device')} ({link.get('decode_netns')})"
    if rx is None:
        return Check("kv-crossed-the-link", False,
                     f"{where} byte counter could not be read: the KV's path is unproven")
    return Check("kv-crossed-the-link", rx >= kv_bytes,
                 f"{where} received {rx:,} bytes over the evaluation, the connector moved "
                 f"{kv_bytes:,.0f}; {ucx or 'UCX settings unknown'}")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def baseline_health(cmp: Comparison, reference: ReferenceAccuracy, policy: Policy) -> Check:
    correct = round(cmp.baseline_accuracy * cmp.n)
    tolerance = policy.baseline_tolerance if reference.tolerance is None else reference.tolerance
    p = below_reference(correct, cmp.n, reference.accuracy, tolerance)
    if reference.tolerance is not None:   # an expected value (vLLM's CI), not a measurement here
        return Check("baseline-health", p > policy.alpha,
                     f"baseline {cmp.baseline_accuracy:.2f} ({correct}/{cmp.n}), expected "
                     f"{reference.accuracy:.2f} ± {reference.tolerance:.2f} by {reference.source}; "
                     f"below it by more than the tolerance: binomial p={p:.3g}: the environment "
                     f"(weights, task, template), not P/D")
    return Check("baseline-health", p > policy.alpha,
                 f"baseline {_pct(cmp.baseline_accuracy)} ({correct}/{cmp.n}) vs "
                 f"{_pct(reference.accuracy)} measured by {reference.source} (n={reference.n}); "
                 f"below it by more than {100 * policy.baseline_tolerance:.0f} pts: binomial p={p:.3g}")


def accuracy_checks(cmp: Comparison, policy: Policy, look: Any) -> tuple[list[Check], list[str]]:
    """Stage "accuracy": the look's gate, then generations against the A/A floor (at the look's
    FAIL level, like the accuracy test) and logprob divergence against the A/A divergence."""
    checks = [Check("accuracy", look.decision != FAIL, f"{look.text}; {accuracy_detail(cmp)}")]
    path = [f"accuracy (look {look.look}/{look.n_looks}, n={look.n})"]
    if cmp.floor is not None:
        f = cmp.floor
        checks.append(Check("noise-floor", f.p_value > look.alpha_fail_look,
                            f"P/D generations differ on {f.pd_differing}/{f.pd_total} "
                            f"({_pct(f.pd_rate)}) vs A/A {f.aa_differing}/{f.aa_total} "
                            f"({_pct(f.aa_rate)}), Fisher p={f.p_value:.3g}"))
        path.append("noise-floor")
    if cmp.logprob is not None and cmp.logprob["n_aligned_tokens"] > 0:
        aa_p95 = (cmp.logprob_floor or {}).get("abs_delta_p95") or 0.0
        threshold = max(policy.logprob_min_threshold, policy.logprob_floor_factor * aa_p95)
        p95 = cmp.logprob["abs_delta_p95"]
        checks.append(Check("logprob-divergence", p95 <= threshold,
                            f"|Δ logprob| p95 {p95:.4f} nats over {cmp.logprob['n_aligned_tokens']} "
                            f"aligned tokens (threshold {threshold:.4f}; A/A p95 {aa_p95:.4f})"
                            + consistency_line(cmp.consistency)))
        path.append("logprob")
    return checks, path


def consistency_line(consistency: dict | None) -> str:
    """vLLM CI's hybrid consistency number, said beside the harness's own divergence (a
    number to compare with upstream's, not a gate of its own)."""
    if not consistency:
        return ""
    c = consistency
    return (f"; vLLM CI's hybrid consistency: first {c['tokens']} tokens' top-1 |Δ logprob| "
            f"max {c['max_nats']:.3f} nats over {c['questions']} questions (median "
            f"{c['median_nats']:.3f}; upstream's bound {c['bound_nats']}: {c['over_bound']} at "
            f"or over it)")


def accuracy_detail(cmp: Comparison) -> str:
    m = cmp.mcnemar
    return (f"baseline {_pct(cmp.baseline_accuracy)} vs P/D {_pct(cmp.pd_accuracy)} "
            f"(Δ {100 * cmp.accuracy_delta:+.1f} pts, 95% CI "
            f"[{100 * cmp.delta_ci.low:+.1f}, {100 * cmp.delta_ci.high:+.1f}]), "
            f"discordant {m.baseline_only}↓/{m.pd_only}↑, McNemar p={m.p_value:.3g}")


def failure_reason(first: Check, cmp: Comparison, digest: Check | None) -> str:
    """The reason of a verdict `first` decided: its row's, and for the answers' checks what the
    digest adds (identical bytes: the KV is read wrongly) and one differing answer."""
    reason = check_row(first.name).reason(first.detail)
    if check_row(first.name).stage != "accuracy":
        return reason
    if digest is not None and digest.passed:
        reason += ("; the decode holds the prefill's KV byte for byte (kv-digest identical): "
                   "it is read wrongly (block table, kernel vs logical block ids)")
    if cmp.examples:
        ex = cmp.examples[0]
        reason += (f"; e.g. doc {ex['doc_id']}: baseline {ex['baseline_answer']!r} vs "
                   f"P/D {ex['pd_answer']!r}")
    return reason


# a random-weight model's cell (harness.zoo.shapes) PASSes on these alone; its answers say nothing
RANDOM_WEIGHT_EVIDENCE = ("kv-bytes-exact", "kv-digest")


def random_weights_verdict(cmp: Comparison, checks: list[Check], path: list[str],
                           expected_failure: str | None, na: tuple[str, ...]) -> Verdict:
    """The verdict of a random-weight cell: its transfer proof, exact bytes and KV digest decide;
    its accuracy is recorded, never judged (random weights answer nothing, and near-tie logits
    flip between the two paths). Without the bytes or the digest it cannot pass."""
    said = (f"random weights (--load-format dummy): accuracy says nothing (baseline "
            f"{_pct(cmp.baseline_accuracy)} vs P/D {_pct(cmp.pd_accuracy)}, "
            f"{cmp.generations_differing}/{cmp.n} generations differ), the verdict rests on the "
            f"transfer proof, the exact bytes and the KV digest")
    path = [*path, "random-weights"]
    first = first_failing(checks)
    if first is not None:
        row = check_row(first.name)
        return Verdict(row.status, f"{row.reason(first.detail)}; {said}", tuple(checks),
                       expected_failure, tuple(path), not_available=na)
    have = {c.name: c for c in checks}
    missing = [name for name in RANDOM_WEIGHT_EVIDENCE if name not in have]
    if missing:
        return Verdict(INCONCLUSIVE, f"{said}, and {' and '.join(missing)} did not run here "
                       f"(--no-kv-digest, or a geometry the byte account does not know)",
                       tuple(checks), expected_failure, tuple(path), not_available=na)
    found = "; ".join(f"[{name}] {have[name].detail}" for name in RANDOM_WEIGHT_EVIDENCE)
    return Verdict(PASS, f"{said}: {found}; {cmp.transfer.counters.prompt_tokens_external:.0f} "
                   f"prompt tokens arrived through the connector", tuple(checks),
                   expected_failure, tuple(path), not_available=na)


def _left_out(cmp: Comparison, not_available: Mapping[str, str] | None,
              weather: WeatherJudgement | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """The transfer checks left out of this verdict (name -> why) and the record's lines for
    every check not available, the byte account that could not be stated among them."""
    skipped = dict(not_available or {})
    if weather is not None:
        skipped.update({name: f"{name}: accounted per request by the weather ({why})"
                        for name, why in weather.accounted_checks.items()})
    na = tuple(skipped.values())
    why_no_bytes = cmp.transfer.byte_account_skipped
    if cmp.transfer.byte_account is None and why_no_bytes and "kv-bytes-exact" not in skipped:
        # an expectation that cannot be exact is said, never passed (geometry not modelled)
        na += (f"kv-bytes-exact: not available: {why_no_bytes}",)
    if cmp.spec_skipped:
        na += (f"spec-acceptance: not available: {cmp.spec_skipped}",)
    return skipped, na


def decide(cmp: Comparison, policy: Policy = Policy(), expected_failure: str | None = None,
           reference: ReferenceAccuracy | None = None, previous_n: int | None = None,
           not_available: Mapping[str, str] | None = None,
           random_weights: bool = False,
           weather: WeatherJudgement | None = None) -> Verdict:
    """The verdict at this look (cmp holds every question so far; `previous_n`: the questions
    of the look before, when it was not made at its planned stage). CONTINUE: ask more.
    `not_available`: transfer check name -> the line saying why this deployment cannot support
    it (an external router keeps no proxy records); those checks are left out, not passed. A
    byte account the proof could not state (its byte_account_skipped: a geometry not modelled)
    is listed there too, with its reason.

    Every check of CHECKS that applies is computed, stage by stage (the record shows each); the
    first failing one in the table's order decides, with its row's status and reason. The
    baseline's health decides alone: a broken baseline says nothing about P/D. `random_weights`:
    the model has no trained weights, so the transfer checks and the digest decide alone at the
    first look (random_weights_verdict). `weather`: the per-request judgement of a cell under
    weather (its checks come first; `cmp` then holds the answered questions only)."""
    skipped, na = _left_out(cmp, not_available, weather)
    checks: list[Check] = []
    path: list[str] = []
    if reference is not None and cmp.n > 0:
        checks.append(baseline_health(cmp, reference, policy))
        path.append("baseline-health")
        if not checks[0].passed:
            return Verdict(ERROR, check_row(checks[0].name).reason(checks[0].detail),
                           tuple(checks), expected_failure, tuple(path), not_available=na)

    if weather is not None:
        checks += [Check(name, passed, detail) for name, passed, detail in weather_checks(weather)]
        path.append("weather")
    tchecks = transfer_checks(cmp)
    # a check the table has but this proof does not compute (kv-bytes-exact without a byte
    # account) may be said not available too: the record says why
    unknown = set(skipped) - {row.name for row in CHECKS if row.stage in ("transfer", "kv")}
    if unknown:
        raise ValueError(f"not_available names no transfer check: {sorted(unknown)}")
    checks += [c for c in tchecks if c.name not in skipped]
    path.append("transfer")
    digest = None
    # before accuracy: a wrong byte is a FAIL anyway (a weather may judge it per request)
    if cmp.transfer.kv_digest is not None and "kv-digest" not in skipped:
        digest = Check("kv-digest", *describe_digest(cmp.transfer.kv_digest))
        checks.append(digest)
        path.append("kv-digest")
    if random_weights:
        return random_weights_verdict(cmp, checks, path, expected_failure, na)
    look = evaluate_look(policy.plan, cmp.mcnemar.baseline_only, cmp.mcnemar.pd_only, cmp.n,
                         previous_n=previous_n)
    if cmp.spec is not None:   # at the look's FAIL level, like the answers' tests
        checks.append(Check("spec-acceptance",
                            *describe_spec(cmp.spec, policy.spec_margin, look.alpha_fail_look)))
        path.append("spec-acceptance")
    answers, answer_path = accuracy_checks(cmp, policy, look)
    checks += answers
    path += answer_path

    first = first_failing(checks)
    if first is not None:
        row = check_row(first.name)
        return Verdict(row.status, failure_reason(first, cmp, digest), tuple(checks),
                       expected_failure, tuple(path), not_available=na,
                       look=None if row.stage in ("transfer", "weather") else look.to_dict())
    # nothing failed: the accuracy gate decides (the MDE stays in the record for reading)
    found = (f"{accuracy_detail(cmp)}; {cmp.generations_differing}/{cmp.n} generations differ; "
             f"{cmp.transfer.counters.prompt_tokens_external:.0f} prompt tokens arrived through "
             f"the connector")
    if weather is not None and weather.series_window:   # what the series saw leads: its point
        found = f"{weather.weather}: {series_line(weather)}; {found}"
    status = {PASS: PASS, CONTINUE: CONTINUE}.get(look.decision, INCONCLUSIVE)
    if status == PASS and weather is not None and "kv-digest" in skipped:
        # silent wrong answers are counted per request by the digest: without it, no pass
        return Verdict(INCONCLUSIVE, f"{skipped['kv-digest']}; a weather's silent wrong answers "
                       f"rest on it; {look.text}; {found}", tuple(checks), expected_failure,
                       tuple(path), look=look.to_dict(), not_available=na)
    return Verdict(status, f"{look.text}; {found}", tuple(checks), expected_failure, tuple(path),
                   look=look.to_dict(), not_available=na)
