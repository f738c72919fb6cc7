"""vLLM general plugin: a digest of every request's prompt KV on both sides of a NIXL transfer.

Armed by ``PD_ACCURACY_KV_DIGEST_FILE`` (the harness sets it per P/D server; unset = off), it
appends one JSON line per request and side to that file (:func:`record_line`):

* **prefill**, after the request's forward pass: the scheduler-side connector's
  ``request_finished`` returns the blocks decode will read (``remote_block_ids``, scheduler
  block ids per transfer group) and their token count (``remote_num_tokens``); they ride to the
  worker on the next step's connector metadata (attribute :data:`SEND_ATTR`, pickled with it to a
  multiprocess worker) and the worker hashes them when it binds that metadata, before the step's
  forward and before any notification can free the blocks.
* **decode**, once NIXL has finished receiving: ``get_num_new_matched_tokens`` says which prompt
  positions arrive (after the local prefix-cache hit, that many tokens); they ride to the worker
  with the ``reqs_to_recv`` entry (:data:`RECV_ATTR`), and the worker hashes the request's blocks
  when the connector's completion call reports the read done. That call wraps the worker's,
  where the canary fault plugin corrupts the KV, so a canary's damage is in the digest.

Both sides read each attention layer's cache through the layout its tensor shape shows
(:func:`harness.serve.plugins.kv_digest.layout.layout_from_shape`) and hash the canonical KV per
(K/V, head, 32-token range) (:mod:`harness.serve.plugins.kv_digest.digest`); a recurrent (SSM / GDN)
layer's state slot is hashed whole. The decode also keeps the raw bytes NIXL wrote, hashed when
the worker's read poll reports them (before post-processing), to tell the transfer from what
follows it. Never raises into vLLM: a request it cannot digest gets a line saying why.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Mapping

from harness.serve.plugins.faults.decode import (_is_attention_layer, _transfer_groups,
                                          received_request_ids)
from harness.serve.plugins.kv_digest.digest import KVDigest, digest_layer, digest_state, hash_array
from harness.serve.plugins.kv_digest.layout import KVLayout, kernel_block_ids, layout_from_shape, to_numpy

logger = logging.getLogger("vllm.pd_accuracy.kv_digest")

DIGEST_FILE_ENV = "PD_ACCURACY_KV_DIGEST_FILE"
CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector"
CONNECTOR_CLASS = "NixlConnector"
TOKEN_CHUNK = 32          # CPU_ATTN blocks are multiples of 32, GPU ones of 16: a prefix hit
                          # starts on a 32-token boundary on CPU
SEND_ATTR = "pd_accuracy_digest_send"   # {req_id: (block ids per group, num_tokens)}
RECV_ATTR = "pd_accuracy_digest_recv"   # {req_id: (first position, num_tokens)}
RAW_PIECE_TOKENS = 16     # raw-byte pieces: a 16-token share of a block's bytes (GPU blocks are
                          # multiples of 16), so P64 blocks line up with D128 block halves
WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
WORKER_CLASS = "NixlBaseConnectorWorker"
SETUP_PREFIX = "pd-accuracy kv-digest-setup:"
_MARK = "__pd_accuracy_kv_digest__"
_write_lock = threading.Lock()
_registered = False


def record_line(side: str, request_id: str, *, remote_request_id: str | None, token_offset: int,
                num_tokens: int, layers: Mapping[str, Any], skipped: Mapping[str, str],
                elapsed_s: float, tp_rank: int = 0, error: str | None = None,
                raw: Mapping[str, dict] | None = None,
                host_layers: Mapping[str, Any] | None = None) -> str:
    """One request's digest line (what harness.run.kv_digest_evidence reads back). ``raw``:
    per layer, ``{"block_tokens", "pieces"}``: hashes of the request's blocks' physical bytes in
    RAW_PIECE_TOKENS pieces, as sent (prefill) or as NIXL wrote them, before any
    post-processing (decode); through a host buffer, the buffer's bytes. ``host_layers``
    (prefill, host buffer only): the digests of the buffer NIXL sends from."""
    return json.dumps({
        "side": side, "request_id": request_id, "remote_request_id": remote_request_id,
        "tp_rank": tp_rank, "token_offset": token_offset, "num_tokens": num_tokens,
        "layers": {name: d.to_dict() for name, d in layers.items() if isinstance(d, KVDigest)},
        "states": {name: d for name, d in layers.items() if isinstance(d, str)},
        "skipped": dict(skipped),
        "raw": dict(raw or {}),
        **({"host_layers": {name: d.to_dict() for name, d in host_layers.items()
                            if isinstance(d, KVDigest)}} if host_layers else {}),
        "elapsed_s": round(elapsed_s, 6), "error": error},
        separators=(",", ":"))


def raw_pieces(cache: Any, kernel_ids: Any, tokens_per_block: int) -> list[str]:
    """Hashes of the physical bytes of blocks ``kernel_ids`` of ``cache`` (a torch tensor or a
    numpy array), in order, cut in pieces of RAW_PIECE_TOKENS tokens' share: what NIXL copies,
    whatever the layout means."""
    import numpy as np

    strides = cache.stride() if hasattr(cache, "stride") and callable(cache.stride) else (
        cache.strides)
    order = sorted(range(cache.ndim), key=lambda dim: -strides[dim])
    if order[0] != 0 or tokens_per_block % RAW_PIECE_TOKENS:
        raise ValueError(f"blocks are not outermost in memory (strides {list(strides)})")
    ids = np.asarray(kernel_ids, dtype=np.int64)
    if hasattr(cache, "index_select"):
        import torch

        index = torch.as_tensor(ids, dtype=torch.long, device=cache.device)
        blocks = to_numpy(cache.permute(*order).index_select(0, index))
    else:
        blocks = np.transpose(cache, order)[ids]
    data = np.ascontiguousarray(blocks).reshape(len(ids), -1).view(np.uint8)
    pieces = data.reshape(len(ids) * (tokens_per_block // RAW_PIECE_TOKENS), -1)
    return [hash_array(piece) for piece in pieces]


def _write(path: str, line: str) -> None:
    with _write_lock, open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


@functools.lru_cache(maxsize=None)
def _layout(shape: tuple[int, ...], dtype: Any, backend: str, kernel: int, logical: int
            ) -> KVLayout:
    """A layer's layout, read once per (shape, dtype, backend, block sizes): every request of a
    server asks again, and CPU_ATTN's page order needs vLLM's ISA choice for the dtype."""
    layout = layout_from_shape(shape, backend, kernel, logical)
    if layout.kv_split != "head_pages":
        return layout
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        isa = _get_attn_isa(dtype, layout.block_size, shape[-1] // 2)
    except Exception:  # noqa: BLE001 - older vLLM: the vec order (fp32/fp16 caches)
        isa = "vec"
    return layout_from_shape(shape, backend, kernel, logical, isa)


def state_digest(cache: Any, block_ids: Any) -> str:
    """One recurrent layer's state for a request: the bytes of its state slot(s) (rows
    ``block_ids`` of dim 0), of each state tensor where the layer holds several (conv, SSM)."""
    if not list(block_ids):
        raise ValueError("no state slot in the request's blocks")
    parts = cache if isinstance(cache, (list, tuple)) else [cache]
    return "+".join(digest_state(part, list(block_ids)) for part in parts)


def host_buffers(worker: Any) -> Mapping[str, Any] | None:
    """The worker's host transfer buffers when NIXL moves KV through them (a GPU server with
    ``kv_buffer_device: cpu``): what NIXL sends from and writes into, not what attention reads."""
    host = getattr(worker, "host_xfer_buffers", None)
    return host if getattr(worker, "use_host_buffer", False) and host else None


def digest_request(worker: Any, group_block_ids: Any, token_offset: int, num_tokens: int,
                   raw_only: bool = False, with_raw: bool = True,
                   caches: Mapping[str, Any] | None = None) -> tuple[dict, dict, dict]:
    """(layer -> KVDigest, layer -> why not, layer -> raw pieces) of one request on a NIXL
    connector ``worker``: ``group_block_ids`` are scheduler (logical) block ids per transfer
    group, holding prompt positions ``token_offset .. token_offset + num_tokens - 1``.
    Digests are of ``caches`` (default: the KV cache attention reads); raw pieces are of the
    bytes NIXL moves: the host buffers where it moves them through, else the KV cache."""
    ratio = int(getattr(worker, "_physical_blocks_per_logical_kv_block", 1) or 1)
    kernel = int(worker.block_size)
    logical = kernel * ratio
    backend = str(getattr(worker, "backend_name", ""))
    head_offset = int(getattr(worker, "tp_rank", 0) or 0)
    specs: Mapping[str, Any] = getattr(worker, "_layer_specs", {}) or {}
    caches = worker.device_kv_caches if caches is None else caches
    moved: Mapping[str, Any] = host_buffers(worker) or caches
    groups = list(group_block_ids or ())
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = [groups]
    digests: dict = {}
    skipped: dict = {}
    raw: dict = {}
    for index, group in enumerate(_transfer_groups(worker)):
        ids = list(groups[index]) if index < len(groups) else []
        for name in group.layer_names:
            if name not in caches:
                continue
            if not _is_attention_layer(specs.get(name, getattr(group, "kv_cache_spec", None))):
                if not raw_only:
                    try:
                        digests[name] = state_digest(caches[name], ids)
                    except Exception as error:  # noqa: BLE001
                        skipped[name] = f"state: {type(error).__name__}: {str(error)[:160]}"
                continue
            cache = caches[name]
            try:
                layout = _layout(tuple(int(n) for n in cache.shape), cache.dtype, backend,
                                 kernel, logical)
                inner = tuple(cache.shape[1:3] if cache.ndim == 4 else cache.shape[2:4])
                heads = int(inner[0] if layout.heads_before_tokens else inner[1])
                try:
                    if with_raw:
                        raw[name] = {"block_tokens": layout.block_size, "pieces": raw_pieces(
                            moved.get(name, cache), kernel_block_ids(ids, num_tokens, layout),
                            layout.block_size)}
                except Exception as error:  # noqa: BLE001 - the canonical digest still counts
                    skipped[f"{name}:raw"] = f"{type(error).__name__}: {str(error)[:120]}"
                if raw_only:
                    continue
                digests[name] = digest_layer(cache, ids, num_tokens, layout,
                                             token_chunk=TOKEN_CHUNK,
                                             head_offset=head_offset * heads,
                                             token_offset=token_offset)
            except Exception as error:  # noqa: BLE001 - one line per layer, never raise
                skipped[name] = f"{type(error).__name__}: {str(error)[:200]}"
    return digests, skipped, raw


def _emit(path: str, worker: Any, side: str, request_id: str, remote_id: str | None,
          block_ids: Any, token_offset: int, num_tokens: int, raw: dict | None = None,
          spent_s: float = 0.0) -> None:
    started = time.perf_counter()
    try:
        # the decode's raw bytes are the read poll's snapshot (before post-processing and any
        # canary fault), never what it holds now: none is better than a wrong attribution
        digests, skipped, own_raw = digest_request(worker, block_ids, token_offset, num_tokens,
                                                   with_raw=side == "prefill")
        host = host_buffers(worker) if side == "prefill" else None
        # the prefill's host buffer is what NIXL sends: a device-to-host copy that missed
        # tokens shows as host digests that differ from the KV cache's
        host_digests = digest_request(worker, block_ids, token_offset, num_tokens,
                                      with_raw=False, caches=host)[0] if host else {}
        error = None
    except Exception as exc:  # noqa: BLE001
        digests, skipped, own_raw, host_digests = {}, {}, {}, {}
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    _write(path, record_line(side, request_id, remote_request_id=remote_id,
                             token_offset=token_offset, num_tokens=num_tokens, layers=digests,
                             skipped=skipped, raw=own_raw if side == "prefill" else raw or {},
                             host_layers=host_digests,
                             elapsed_s=time.perf_counter() - started + spent_s,
                             tp_rank=int(getattr(worker, "tp_rank", 0) or 0), error=error))


def snapshot_received(worker: Any, done: Any) -> None:
    """Raw pieces of the reads just completed, before the worker's post-processing (block
    size, layout) and before any canary fault: kept with the request's plan."""
    plans = worker.__dict__.get("_pd_plans") or {}
    for request_id in set(done or ()) & plans.keys():
        plan = plans[request_id]
        started = time.perf_counter()
        try:
            _, _, raw = digest_request(worker, plan[1], plan[2], plan[3], raw_only=True)
        except Exception:  # noqa: BLE001
            raw = {}
        plans[request_id] = (*plan[:4], raw, time.perf_counter() - started)


def _pending(connector: Any, name: str) -> dict:
    table = connector.__dict__.get(name)
    if table is None:
        table = connector.__dict__[name] = {}
    return table


def _wrap(cls: type, method: str, make: Callable[[Callable], Callable]) -> None:
    original = getattr(cls, method, None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapped = functools.wraps(original)(make(original))
    setattr(wrapped, _MARK, True)
    setattr(cls, method, wrapped)


def patch_connector_class(cls: type, path: str) -> None:
    """Wrap ``cls`` (vLLM's NixlConnector) so both roles digest (see the module docstring)."""

    def finished(original: Callable) -> Callable:       # scheduler, prefill side
        def request_finished(self, request, block_ids, *args, **kwargs):
            result = original(self, request, block_ids, *args, **kwargs)
            try:
                delay, params = result
                if delay and params and params.get("do_remote_prefill"):
                    _pending(self, "_pd_send")[request.request_id] = (
                        [list(g) for g in params.get("remote_block_ids") or ()],
                        int(params.get("remote_num_tokens") or request.num_computed_tokens))
            except Exception:  # noqa: BLE001
                logger.exception("kv-digest: request_finished hook failed")
            return result
        return request_finished

    def matched(original: Callable) -> Callable:        # scheduler, decode side
        def get_num_new_matched_tokens(self, request, num_computed_tokens, *args, **kwargs):
            result = original(self, request, num_computed_tokens, *args, **kwargs)
            try:
                count = result[0]
                params = request.kv_transfer_params or {}
                if count and params.get("do_remote_prefill"):
                    _pending(self, "_pd_recv")[request.request_id] = (int(num_computed_tokens),
                                                                     int(count))
            except Exception:  # noqa: BLE001
                logger.exception("kv-digest: get_num_new_matched_tokens hook failed")
            return result
        return get_num_new_matched_tokens

    def build(original: Callable) -> Callable:          # scheduler: hand both to the worker
        def build_connector_meta(self, scheduler_output, *args, **kwargs):
            meta = original(self, scheduler_output, *args, **kwargs)
            try:
                send = _pending(self, "_pd_send")
                recv = _pending(self, "_pd_recv")
                setattr(meta, SEND_ATTR, dict(send))
                send.clear()
                wanted = getattr(meta, "reqs_to_recv", {}) or {}
                setattr(meta, RECV_ATTR, {r: recv.pop(r) for r in list(recv) if r in wanted})
            except Exception:  # noqa: BLE001
                logger.exception("kv-digest: build_connector_meta hook failed")
            return meta
        return build_connector_meta

    def bind(original: Callable) -> Callable:           # worker: prefill digests, decode plans
        def bind_connector_metadata(self, metadata, *args, **kwargs):
            result = original(self, metadata, *args, **kwargs)
            try:
                worker = self.connector_worker
                for request_id, (block_ids, num_tokens) in (
                        getattr(metadata, SEND_ATTR, None) or {}).items():
                    _emit(path, worker, "prefill", request_id, None, block_ids, 0, num_tokens)
                recv = getattr(metadata, RECV_ATTR, None) or {}
                plans = _pending(self, "_pd_plans")
                worker.__dict__["_pd_plans"] = plans
                for request_id, meta in (getattr(metadata, "reqs_to_recv", {}) or {}).items():
                    if request_id in recv:
                        remote = getattr(meta, "remote", None)
                        plans[request_id] = (getattr(remote, "request_id", None),
                                             meta.local_block_ids, *recv[request_id])
            except Exception:  # noqa: BLE001
                logger.exception("kv-digest: bind_connector_metadata hook failed")
            return result
        return bind_connector_metadata

    def completion(original: Callable) -> Callable:     # worker, decode side
        def completed(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            try:
                plans = _pending(self, "_pd_plans")
                if plans:
                    done = received_request_ids(result)
                    for request_id in sorted(done & plans.keys()):
                        remote_id, block_ids, offset, count, *seen = plans.pop(request_id)
                        _emit(path, self.connector_worker, "decode", request_id, remote_id,
                              block_ids, offset, count, *(seen or (None, 0.0)))
                    failed = set(getattr(result, "failed_recving", ()) or ())
                    for request_id in failed & plans.keys():
                        plans.pop(request_id)
            except Exception:  # noqa: BLE001
                logger.exception("kv-digest: completion hook failed")
            return result
        return completed

    _wrap(cls, "request_finished", finished)
    _wrap(cls, "request_finished_all_groups", finished)
    _wrap(cls, "get_num_new_matched_tokens", matched)
    _wrap(cls, "build_connector_meta", build)
    _wrap(cls, "bind_connector_metadata", bind)
    _wrap(cls, "get_transfer_results", completion)
    _wrap(cls, "get_finished", completion)


def patch_worker_class(cls: type) -> None:
    """Wrap the worker's read poll: raw pieces of what just arrived, before post-processing."""

    def pop(original: Callable) -> Callable:
        def _pop_done_transfers(self, transfers, *args, **kwargs):
            result = original(self, transfers, *args, **kwargs)
            try:
                if transfers is getattr(self, "_recving_transfers", None):
                    snapshot_received(self, result[0] if isinstance(result, tuple) else result)
            except Exception:  # noqa: BLE001
                logger.exception("kv-digest: _pop_done_transfers hook failed")
            return result
        return _pop_done_transfers

    _wrap(cls, "_pop_done_transfers", pop)


def _hook(path: str) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        try:
            cls = getattr(module, CONNECTOR_CLASS)
            patch_connector_class(cls, path)
            import importlib

            patch_worker_class(getattr(importlib.import_module(WORKER_MODULE), WORKER_CLASS))
            logger.warning("%s digests to %s (pid %d)", SETUP_PREFIX, path, os.getpid())
        except Exception:  # noqa: BLE001
            logger.exception("%s patching %s failed; no digests", SETUP_PREFIX, CONNECTOR_MODULE)
    return hook


def register() -> None:
    """vLLM ``general_plugins`` entry point: a no-op unless PD_ACCURACY_KV_DIGEST_FILE is set."""
    global _registered
    if _registered:
        return
    _registered = True
    path = os.environ.get(DIGEST_FILE_ENV, "").strip()
    if not path:
        return
    try:
        import wrapt

        wrapt.register_post_import_hook(_hook(path), CONNECTOR_MODULE)
    except Exception:  # noqa: BLE001
        logger.exception("%s register() failed; no digests", SETUP_PREFIX)
