"""The ``fail-transfer`` canary: the decode server's NIXL worker reports an intact read as failed.

vLLM must never serve a failed KV read as a success (the upstream bug class: HTTP 200 with
garbage, or the previous prompt's answer). This canary makes a tagged request's read fail the
way a real one does, so that everything after it is vLLM's own failure handling, and the
harness must see the failure (:mod:`harness.serve.plugins.faults.spec` names the fault, its tag
and its log lines; :mod:`harness.serve.plugins.faults.decode` registers this hook).

Where it hooks (vLLM 0.32, ``kv_connector/v1/nixl/base_worker.py``):
``NixlBaseConnectorWorker._pop_done_transfers(transfers)`` polls each outstanding read handle and
returns ``(done, failed)``. For a handle in an error state vLLM logs it (``_log_failure``) and
calls ``_handle_failed_transfer(req_id, handle, failed)``: the failed-transfer stat
(``vllm:nixl_num_failed_transfers_total``), the remote engine queued for a metadata check, the
request added to ``failed``. The wrapper does the same for a chosen request whose reads all
completed, with no handle (vLLM released it already). ``get_transfer_results``, which called it
with ``self._recving_transfers``, then runs its failure path: the request is reported in
``failed_recving``, its blocks are queued as ``_invalid_block_ids`` (layouts without HMA), its
KV post-processing is skipped; the scheduler fails the request (``kv_load_failure_policy``
"fail", the default: finish reason ``error``, which the OpenAI server answers with HTTP 500) or
recomputes its prompt ("recompute"). Requests that failed already, untagged ones and a push-mode
producer's sends (another dict) are left alone.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

from harness.serve.plugins.faults.spec import (
    ARMED_PREFIX,
    BY_REQUEST,
    FAIL_TRANSFER,
    SKIPPED_PREFIX,
    FaultOutcome,
    FaultSpec,
    format_fault_line,
    parse_request_fault,
)

logger = logging.getLogger("vllm.pd_accuracy.fail_transfer")

WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
WORKER_CLASS = "NixlBaseConnectorWorker"
METHOD = "_pop_done_transfers"
_PATCH_MARK = "__pd_accuracy_fail_transfer__"
# What the wrapper tells vLLM's structured failure log (a real one names the handle's state).
LOG_REASON = "reported failed by the pd-accuracy fail-transfer canary (the read completed)"


def wants_failure(request_id: str, spec: FaultSpec) -> bool:
    """Whether ``spec`` fails this request's read: every request under PD_ACCURACY_FAULT=
    fail-transfer, only the ones tagged with it under by-request."""
    if spec.kind == FAIL_TRANSFER:
        return True
    if spec.kind != BY_REQUEST:
        return False
    tagged = parse_request_fault(request_id)
    return tagged is not None and tagged.kind == FAIL_TRANSFER


def _block_ids(meta: Any) -> tuple[tuple[int, ...], ...]:
    """The request's local (logical) block ids per group: the blocks vLLM is told did not load."""
    groups = list(getattr(meta, "local_block_ids", None) or [])
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = [groups]
    return tuple(tuple(int(b) for b in group) for group in groups)


def _report_failed(worker: Any, request_id: str, failed: set[str]) -> None:
    """What vLLM does for a read handle in an error state, without the handle."""
    log_failure = getattr(worker, "_log_failure", None)
    if log_failure is not None:
        log_failure(failure_type="transfer_failed", req_id=request_id, msg=LOG_REASON)
    handle_failed = getattr(worker, "_handle_failed_transfer", None)
    if handle_failed is not None:
        handle_failed(request_id, None, failed)
    else:
        worker.xfer_stats.record_failed_transfer()
        failed.add(request_id)


def fail_completed_reads(worker: Any, done: set[str], failed: set[str],
                         spec: FaultSpec) -> list[str]:
    """Report every request of ``done`` that has not failed and that ``spec`` wants failed as
    a failed read (added to ``failed``, counted in the worker's stats); one fault line each.
    Returns those request ids, sorted. Never raises for one request."""
    chosen = [r for r in sorted(set(done) - set(failed)) if wants_failure(r, spec)]
    line_spec = FaultSpec(FAIL_TRANSFER)
    metadata = getattr(worker, "_recving_metadata", None) or {}
    for request_id in chosen:
        try:
            _report_failed(worker, request_id, failed)
            outcome = FaultOutcome(applied=True, block_ids=_block_ids(metadata.get(request_id)))
        except Exception as error:  # a canary must never take the server down
            logger.exception("%s request %s", SKIPPED_PREFIX, request_id)
            outcome = FaultOutcome(applied=False, reason=type(error).__name__)
        logger.warning("%s", format_fault_line(request_id, line_spec, outcome))
    return chosen


def _wrap_pop_done_transfers(original: Callable, spec: FaultSpec) -> Callable:
    @functools.wraps(original)
    def pop_done_transfers(self: Any, transfers: Any, *args: Any, **kwargs: Any) -> Any:
        done, failed = original(self, transfers, *args, **kwargs)
        if done and transfers is getattr(self, "_recving_transfers", None):
            try:
                fail_completed_reads(self, done, failed, spec)
            except Exception:
                logger.exception("%s fail-transfer hook failed", SKIPPED_PREFIX)
        return done, failed

    setattr(pop_done_transfers, _PATCH_MARK, True)
    return pop_done_transfers


def patch_worker_class(worker_class: type, spec: FaultSpec) -> bool:
    """Wrap ``worker_class._pop_done_transfers``; True when newly patched, False when it
    already was. Raises AttributeError when the class has no such method (older vLLM)."""
    original = getattr(worker_class, METHOD)
    if getattr(original, _PATCH_MARK, False):
        return False
    setattr(worker_class, METHOD, _wrap_pop_done_transfers(original, spec))
    return True


def _make_hook(spec: FaultSpec) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        try:
            worker_class = getattr(module, WORKER_CLASS, None)
            if worker_class is None or not hasattr(worker_class, METHOD):
                logger.error("%s %s has no %s.%s; fail-transfer NOT armed", ARMED_PREFIX,
                             module.__name__, WORKER_CLASS, METHOD)
                return
            if patch_worker_class(worker_class, spec):
                logger.warning("%s fault=%s mode=%s class=%s.%s.%s pid=%d", ARMED_PREFIX,
                               FAIL_TRANSFER, spec.kind, module.__name__, WORKER_CLASS,
                               METHOD, os.getpid())
        except Exception:
            logger.exception("%s patching %s failed; fail-transfer NOT armed", ARMED_PREFIX,
                             getattr(module, "__name__", module))

    return hook


def arm(spec: FaultSpec) -> bool:
    """Patch the NIXL worker when vLLM imports it (a post-import hook), for PD_ACCURACY_FAULT=
    fail-transfer or by-request; True when armed. Never raises."""
    if spec.kind not in (FAIL_TRANSFER, BY_REQUEST):
        return False
    try:
        import wrapt

        wrapt.register_post_import_hook(_make_hook(spec), WORKER_MODULE)
    except Exception:
        logger.exception("%s could not arm fail-transfer", ARMED_PREFIX)
        return False
    return True
