"""EvalRun × EvalRun (+ transfer evidence) → Comparison.

Pairs baseline and P/D answers question by question and computes every number the verdict
needs: accuracies, the paired McNemar test and bootstrap CI, the minimum detectable effect, the
generation disagreement against the A/A noise floor, logprob divergence, and the transfer proof
(decode /metrics deltas plus the proxy's per-request records). Nothing here decides PASS/FAIL.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from harness.judge import logprobs, spec_acceptance, stats
from harness.eval.lmeval import EvalRun, QuestionRecord
from harness.eval.metrics import TransferCounters


@dataclass(frozen=True)
class TransferProof:
    """Evidence that KV crossed the wire for this cell's P/D evaluation."""

    requests: int                   # requests the proxy handled during the evaluation
    requests_with_params: int       # prefill returned usable kv_transfer_params
    requests_own_params: int        # decode received exactly the params its own prefill returned
    counters: TransferCounters      # decode-side /metrics delta over the evaluation
    recompute_allowance: int        # prompt tokens per request the design recomputes (hybrid: 1)
    fault_lines: int = 0            # "pd-accuracy fault:" lines in decode logs (canaries)
    # decode requests that carried any usable kv_transfer_params (own or foreign); None: unknown,
    # then every request not carrying its own params is counted as foreign
    requests_sent_params: int | None = None
    # exact byte accounting of the connector's transfer (harness.judge.byte_accounting.ByteAccount.to_dict), or None with
    # the reason it was not computed in `byte_account_skipped` (geometry not modelled, say)
    byte_account: dict | None = None
    byte_account_skipped: str | None = None
    # network: netns cells: the bytes the decode's P<->D link received over the evaluation, the
    # namespaces' addresses and the UCX transports each server ran with (harness.serve.net.netns
    # TwoHostTopology.evidence); None for a cell on one host
    link: dict | None = None
    # both sides' KV digests joined per request (harness.run.evidence.kv_digest_evidence), or None
    # with the reason in `kv_digest_skipped` (digests off, or servers the harness did not start)
    kv_digest: dict | None = None
    kv_digest_skipped: str | None = None
    # requests whose params the proxy named itself, because the connector's prefill answers
    # none (a transfer id, the prefill's engine and bootstrap address)
    params_named_by_proxy: int = 0
    # whether the connector counts the bytes it moves (False: ExampleConnector, no /metrics of
    # its own; kv-arrived-externally then rests on vLLM's external prompt-token count)
    kv_bytes_counted: bool = True
    # a pair of several prefill or decode instances: per role, each instance's name, URL and the
    # requests the proxy routed to it (harness.run.evidence.transfer_evidence.instance_counts);
    # None for one prefill and one decode
    instances: dict | None = None
    # the sequences the decode ran: a request of n children (OpenAI n) is n, each
    # recomputing what the design recomputes; None: one per request
    sequences: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "counters"}
        d.update(self.counters.to_dict())
        return d


@dataclass(frozen=True)
class Comparison:
    n: int
    unpaired: int                   # questions present in only one run (should be 0)
    baseline_accuracy: float
    pd_accuracy: float
    accuracy_delta: float
    delta_ci: stats.DeltaCI
    mcnemar: stats.McNemarResult
    base_discordance: float         # chance correctness discordance used for the MDE (from A/A)
    mde: float                      # math.inf when no drop is detectable at this n
    generations_differing: int
    agreement: float
    floor: stats.FloorTest | None
    logprob: dict[str, Any] | None
    logprob_floor: dict[str, Any] | None
    transfer: TransferProof
    alpha: float
    examples: tuple[dict[str, Any], ...] = field(default=())
    # speculative decoding's acceptance, question by question (harness.judge.spec_acceptance);
    # None without drafts, or with the reason it cannot be judged in `spec_skipped`
    spec: spec_acceptance.SpecEvidence | None = None
    spec_skipped: str | None = None
    # a hybrid cell's vLLM CI consistency numbers (harness.judge.logprobs.summarize_consistency),
    # beside `logprob`, the harness's own divergence; None for another model
    consistency: dict[str, Any] | None = None

    def metrics_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "unpaired": self.unpaired,
            "baseline_accuracy": self.baseline_accuracy,
            "pd_accuracy": self.pd_accuracy,
            "accuracy_delta": self.accuracy_delta,
            "delta_ci": [self.delta_ci.low, self.delta_ci.high],
            "delta_ci_detail": self.delta_ci.to_dict(),
            "mcnemar_p": self.mcnemar.p_value,
            "discordant": {"baseline_only": self.mcnemar.baseline_only,
                           "pd_only": self.mcnemar.pd_only},
            "mde": self.mde if math.isfinite(self.mde) else None,
            "base_discordance": self.base_discordance,
            "agreement": self.agreement,
            "generations_differing": self.generations_differing,
            "noise_floor": self.floor.to_dict() if self.floor else None,
            "logprob": _finite(self.logprob),
            "logprob_floor": _finite(self.logprob_floor),
            "consistency": self.consistency,
            "transfer": self.transfer.to_dict(),
            "alpha": self.alpha,
            "examples": list(self.examples),
            "spec_acceptance": self.spec.summary() if self.spec is not None else None,
            "spec_acceptance_skipped": self.spec_skipped,
        }


def _finite(d: dict[str, Any] | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _token_logprobs(q: QuestionRecord) -> list[logprobs.TokenLogprob] | None:
    if not q.logprobs:
        return None
    try:
        return logprobs.parse_completion_logprobs({"logprobs": q.logprobs})
    except ValueError:
        return None


def pair_runs(a: EvalRun, b: EvalRun) -> tuple[list[tuple[QuestionRecord, QuestionRecord]], int]:
    """Questions answered by both runs with the same prompt, in doc order; and how many were not."""
    a_by, b_by = a.by_doc(), b.by_doc()
    pairs = [(a_by[d], b_by[d]) for d in sorted(a_by.keys() & b_by.keys())
             if a_by[d].prompt_hash == b_by[d].prompt_hash]
    unpaired = len(a_by.keys() | b_by.keys()) - len(pairs)
    return pairs, unpaired


def divergences(pairs: Sequence[tuple[QuestionRecord, QuestionRecord]]) -> dict[int, logprobs.Divergence]:
    """Logprob divergence per doc id, for the pairs where both sides carry logprobs."""
    out = {}
    for qa, qb in pairs:
        la, lb = _token_logprobs(qa), _token_logprobs(qb)
        if la is not None and lb is not None:
            out[qa.doc_id] = logprobs.logprob_divergence(la, lb)
    return out


def consistency(pairs: Sequence[tuple[QuestionRecord, QuestionRecord]]) -> dict | None:
    """vLLM CI's hybrid consistency numbers over the pairs where both sides carry logprobs."""
    per_question = {}
    for qa, qb in pairs:
        la, lb = _token_logprobs(qa), _token_logprobs(qb)
        delta = None if la is None or lb is None else logprobs.first_tokens_delta(la, lb)
        if delta is not None:
            per_question[qa.doc_id] = delta
    return logprobs.summarize_consistency(per_question)


def noise_floor(baseline: EvalRun, baseline_aa: EvalRun | None) -> tuple[int, int, float, dict | None]:
    """(differing generations, n, correctness discordance rate, logprob summary) of A/A."""
    if baseline_aa is None:
        return 0, 0, 0.0, None
    pairs, _ = pair_runs(baseline, baseline_aa)
    differing = sum(qa.generated != qb.generated for qa, qb in pairs)
    discordant = sum(qa.correct != qb.correct for qa, qb in pairs)
    divs = divergences(pairs)
    summary = logprobs.summarize_divergences(list(divs.values())) if divs else None
    return differing, len(pairs), (discordant / len(pairs) if pairs else 0.0), summary


SPEC_COUNTERS = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")


def spec_evidence(pairs: Sequence[tuple[QuestionRecord, QuestionRecord]],
                  baseline: EvalRun, baseline_aa: EvalRun | None,
                  transfer: TransferProof) -> tuple[spec_acceptance.SpecEvidence | None, str | None]:
    """The answers' draft acceptance paired by question (and the A/A's), or why a decode that
    drafted cannot be judged on it."""
    aa = pair_runs(baseline, baseline_aa)[0] if baseline_aa is not None else []
    counters = {k: getattr(transfer.counters, k) for k in SPEC_COUNTERS}
    found = spec_acceptance.evidence([(qa.spec, qb.spec) for qa, qb in pairs],
                                     [(qa.spec, qb.spec) for qa, qb in aa], counters)
    if found is None and transfer.counters.spec_draft_tokens > 0:
        return None, ("the decode drafted, but no answer carries its own acceptance (a vLLM "
                      "without --per-request-spec-decode-metrics)")
    if found is not None and not found.pairs:
        return None, "no question was answered with its acceptance by both the baseline and P/D"
    return found, None


def compare(
    baseline: EvalRun,
    pd: EvalRun,
    transfer: TransferProof,
    *,
    baseline_aa: EvalRun | None = None,
    alpha: float = 0.01,
    power: float = 0.8,
    max_examples: int = 5,
    bootstrap_seed: int = 0,
    hybrid: bool = False,
) -> Comparison:
    """`hybrid`: the model has recurrent layers: vLLM CI's consistency numbers are computed."""
    pairs, unpaired = pair_runs(baseline, pd)
    if not pairs:
        raise ValueError("baseline and P/D runs share no question with the same prompt")
    base_correct = [qa.correct for qa, _ in pairs]
    pd_correct = [qb.correct for _, qb in pairs]
    n = len(pairs)
    b = sum(x and not y for x, y in zip(base_correct, pd_correct))
    c = sum(y and not x for x, y in zip(base_correct, pd_correct))
    mcn = stats.mcnemar_worse(b, c)
    ci = stats.paired_bootstrap_delta_ci(base_correct, pd_correct, seed=bootstrap_seed)

    aa_diff, aa_n, aa_discordance, aa_logprob = noise_floor(baseline, baseline_aa)
    mde = stats.minimum_detectable_effect(n, alpha, power=power, base_discordance=aa_discordance)

    differing = [(qa, qb) for qa, qb in pairs if qa.generated != qb.generated]
    floor = (stats.disagreement_exceeds_floor(len(differing), n, aa_diff, aa_n, alpha)
             if aa_n else None)
    div_by_doc = divergences(pairs)
    logprob = logprobs.summarize_divergences(list(div_by_doc.values())) if div_by_doc else None

    examples = []
    for qa, qb in differing[:max_examples]:
        d = div_by_doc.get(qa.doc_id)
        examples.append({
            "doc_id": qa.doc_id,
            "prompt_hash": qa.prompt_hash,
            "target": qa.target.split("####")[-1].strip(),
            "baseline_answer": qa.answer_strict,
            "pd_answer": qb.answer_strict,
            "baseline_correct": qa.correct,
            "pd_correct": qb.correct,
            "first_divergent_token": None if d is None else d.first_divergent_index,
            "baseline_token": None if d is None else d.base_token_at_divergence,
            "pd_token": None if d is None else d.pd_token_at_divergence,
            "baseline_logprob": None if d is None else _num(d.base_logprob_at_divergence),
            "pd_logprob": None if d is None else _num(d.pd_logprob_at_divergence),
        })
    spec, spec_skipped = spec_evidence(pairs, baseline, baseline_aa, transfer)
    return Comparison(
        n=n, unpaired=unpaired,
        baseline_accuracy=sum(base_correct) / n, pd_accuracy=sum(pd_correct) / n,
        accuracy_delta=(sum(pd_correct) - sum(base_correct)) / n,
        delta_ci=ci, mcnemar=mcn, base_discordance=aa_discordance, mde=mde,
        generations_differing=len(differing), agreement=1 - len(differing) / n,
        floor=floor, logprob=logprob, logprob_floor=aa_logprob, transfer=transfer,
        alpha=alpha, examples=tuple(examples), spec=spec, spec_skipped=spec_skipped,
        consistency=consistency(pairs) if hybrid else None,
    )


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)
