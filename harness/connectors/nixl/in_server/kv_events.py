"""What vLLM's NIXL connectors (pull: the decode READs; push: the prefill WRITEs into blocks the
decode allocated first) do their own way, for :mod:`harness.serve.plugins.kv_events.interface`.

* ``sent_blocks`` / ``receiving``: the blocks NIXL moves are its own clipped lists (sliding
  windows keep their in-window tail, an SSM group its state slot: ``get_exchange_clipped_blocks``),
  which the interface's arguments do not show: the prefill's come back in ``request_finished``'s
  ``kv_transfer_params`` (``remote_block_ids``, ``remote_num_tokens``), the decode's ride in its
  ``NixlConnectorMetadata.reqs_to_recv`` (``ReqMeta.local_block_ids``, scheduler block ids).
* ``moved_buffers``: a GPU server with ``kv_buffer_device: cpu`` moves KV through host buffers.
* ``install``: the worker's read poll ``NixlBaseConnectorWorker._pop_done_transfers(
  _recving_transfers)`` is the one moment the received bytes are in place and not yet
  post-processed (host-buffer copy, block size / layout), and the one place a read can fail the
  way a real one does (``_handle_failed_transfer``: the failed-transfer stat, ``failed_recving``,
  the blocks queued as invalid). vLLM's connector interface has no such moment, so it stays here:
  the interface's ``arrived`` event. In push mode the decode has no read handle: NIXL puts an
  empty entry in ``_recving_transfers`` when the prefill's last write notification arrives, and
  the same poll reports it done.
* ``hold_leases``: the prefill worker's send leases (``_reqs_to_send``: request id -> the
  deadline after which vLLM releases its blocks, extended by the decode's heartbeats), checked
  once per step by ``_reap_expired_send_leases``; a hook there can shorten them (the
  early-release canary), and the release then runs through vLLM's own path for a lease that
  ran out.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping

logger = logging.getLogger("vllm.pd_accuracy.kv_events")

CONNECTOR_CLASSES = ("NixlConnector", "NixlPullConnector", "NixlPushConnector",
                     "NixlBaseConnector")
# each P/D server's own handshake port; vLLM 0.26 and 0.32 leave it in the compile cache key
PER_SERVER_ENV = ("VLLM_NIXL_SIDE_CHANNEL_PORT",)
WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
WORKER_CLASS = "NixlBaseConnectorWorker"
POLL = "_pop_done_transfers"
_BACKREF = "_pd_accuracy_connector"
_MARK = "__pd_accuracy_nixl_poll__"
# What the wrapper tells vLLM's structured failure log (a real one names the handle's state).
FAIL_REASON = "reported failed by the pd-accuracy fail-transfer canary (the read completed)"


def sent_blocks(connector: Any, request: Any, block_ids: Any, params: Mapping | None):
    """(blocks, prompt tokens) the prefill keeps for the decode, or None when not a P/D send."""
    if not params or not params.get("do_remote_prefill"):
        return None
    return (list(params.get("remote_block_ids") or ()),
            int(params.get("remote_num_tokens") or request.num_computed_tokens))


def receiving(metadata: Any) -> dict[str, tuple[str | None, Any]]:
    """{request id: (the prefill's request id, local scheduler block ids per group)} of the
    reads this step's metadata starts."""
    return {request_id: (getattr(getattr(meta, "remote", None), "request_id", None),
                         meta.local_block_ids)
            for request_id, meta in (getattr(metadata, "reqs_to_recv", None) or {}).items()}


def moved_buffers(connector: Any) -> Mapping[str, Any] | None:
    worker = connector.connector_worker
    host = getattr(worker, "host_xfer_buffers", None)
    return host if getattr(worker, "use_host_buffer", False) and host else None


def link_worker(connector: Any) -> None:
    """Let the worker's read poll find its connector (the worker holds no reference to it)."""
    worker = getattr(connector, "connector_worker", None)
    if worker is not None:
        worker.__dict__[_BACKREF] = connector


def stop_lease_renewal(connector: Any, request_id: str) -> bool:
    """The decode scheduler's heartbeats extend the prefill's lease on a waiting request's
    blocks; stop them for ``request_id`` (the late-read weather fault). True when stopped."""
    scheduler = getattr(connector, "connector_scheduler", None)
    stop = getattr(scheduler, "_stop_heartbeat", None)
    if stop is None:
        return False
    stop(request_id)
    return True


def report_failed(worker: Any, request_id: str, failed: set[str]) -> None:
    """What vLLM does for a read handle in an error state, without the handle (vLLM released
    it already)."""
    log_failure = getattr(worker, "_log_failure", None)
    if log_failure is not None:
        log_failure(failure_type="transfer_failed", req_id=request_id, msg=FAIL_REASON)
    handle_failed = getattr(worker, "_handle_failed_transfer", None)
    if handle_failed is not None and failed is None:
        handle_failed(request_id, None)   # vLLM 0.26: the worker queues its failed reads itself
    elif handle_failed is not None:
        handle_failed(request_id, None, failed)
    else:
        worker.xfer_stats.record_failed_transfer()
        failed.add(request_id)


def wrap_poll(original: Callable, announce: Callable) -> Callable:
    """``_pop_done_transfers`` that announces the reads it reports done (``announce(connector,
    done, failed, fail)``); a push producer's sends (another dict) are left alone."""
    @functools.wraps(original)
    def pop_done_transfers(self: Any, transfers: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, transfers, *args, **kwargs)
        # vLLM 0.32 returns (done, failed); 0.26 returns done and queues its failures itself
        done, failed = result if isinstance(result, tuple) else (result, None)
        connector = self.__dict__.get(_BACKREF)
        if done and connector is not None and transfers is getattr(
                self, "_recving_transfers", None):
            try:
                announce(connector, done, set() if failed is None else failed,
                         lambda request_id: report_failed(self, request_id, failed))
            except Exception:  # noqa: BLE001
                logger.exception("pd-accuracy kv-events: read-poll hook failed")
        return result

    setattr(pop_done_transfers, _MARK, True)
    return pop_done_transfers


def patch_worker_class(worker_class: type, announce: Callable) -> bool:
    """Wrap ``worker_class``'s read poll; True when newly patched. AttributeError when the
    class has none (older vLLM)."""
    original = getattr(worker_class, POLL)
    if getattr(original, _MARK, False):
        return False
    setattr(worker_class, POLL, wrap_poll(original, announce))
    return True


def install(connector_cls: Any) -> None:
    """Wrap the NIXL worker's read poll (the connector class's module imported it already)."""
    import importlib

    from harness.serve.plugins import compat
    from harness.serve.plugins.kv_events.interface import arrived

    if not compat.attach("nixl-read-poll"):
        return      # the interface's events still come; no `arrived`
    try:
        patch_worker_class(getattr(importlib.import_module(WORKER_MODULE), WORKER_CLASS), arrived)
    except Exception:  # noqa: BLE001 - the interface's events still come; no `arrived`
        logger.exception("pd-accuracy kv-events: no read-poll hook on %s.%s", WORKER_MODULE,
                         WORKER_CLASS)


REAPER = "_reap_expired_send_leases"
# vLLM 0.26 has no REAPER: get_finished checks the leases inline, oldest first, and stops at the
# first live one, so there a cut lease must also move to the front to be reaped
INLINE_REAPER = "get_finished"
LEASES = "_reqs_to_send"
_LEASE_MARK = "__pd_accuracy_nixl_leases__"


def hold_leases(cut: Callable[[Any, dict, float], None]) -> bool:
    """Before each step's lease check on a NIXL worker, ``cut(worker, leases, now)`` (``leases``:
    request id -> deadline, on vLLM's perf_counter clock; changed in place). A post-import
    hook on the worker module; True when registered. Never raises."""
    import time

    def patch(module: Any) -> None:
        from harness.serve.plugins import compat

        if not compat.attach("nixl-leases"):
            return
        cls = getattr(module, WORKER_CLASS)
        name = REAPER if hasattr(cls, REAPER) else INLINE_REAPER
        original = getattr(cls, name, None)
        if original is None:
            logger.error("pd-accuracy kv-events: %s has neither %s nor %s: no lease hook",
                         WORKER_CLASS, REAPER, INLINE_REAPER)
            return
        if getattr(original, _LEASE_MARK, False):
            return

        @functools.wraps(original)
        def reap(self: Any, *args: Any) -> Any:
            leases = getattr(self, LEASES, None)
            if leases:
                try:
                    cut(self, leases, time.perf_counter())
                    if name == INLINE_REAPER:
                        ordered = sorted(leases.items(), key=lambda item: item[1])
                        leases.clear()
                        leases.update(ordered)
                except Exception:  # noqa: BLE001 - a hook never takes the server down
                    logger.exception("pd-accuracy kv-events: lease hook failed")
            return original(self, *args)

        setattr(reap, _LEASE_MARK, True)
        setattr(cls, name, reap)

    try:
        import wrapt

        wrapt.register_post_import_hook(patch, WORKER_MODULE)
    except Exception:  # noqa: BLE001
        logger.exception("pd-accuracy kv-events: no lease hook on %s", WORKER_MODULE)
        return False
    return True
