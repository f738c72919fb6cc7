"""vLLM general plugin: a digest of every request's prompt KV on both sides of a KV transfer.

Armed by ``PD_ACCURACY_KV_DIGEST_FILE`` (the harness sets it per P/D server; unset = off), it
appends one JSON line per request and side to that file (:func:`record_line`). It listens on
the connector interface (:mod:`harness.serve.plugins.kv_events.interface`), so it serves any
connector that moves KV:

* **prefill** (event ``sent``): the blocks the connector keeps to send and their token count,
  hashed when the worker binds the next step's metadata, before that step's forward and before
  any notification can free the blocks.
* **decode** (event ``received``): the prompt positions that arrived (after the local
  prefix-cache hit), hashed once the connector reports the request's KV in place. The canary
  fault plugin subscribes before this one, so a canary's damage is in the digest.

Both sides read each attention layer's cache through the layout its tensor shape shows
(:func:`harness.serve.plugins.kv_digest.layout.layout_from_shape`) and hash the canonical KV per
(K/V, head, 32-token range) (:mod:`harness.serve.plugins.kv_digest.digest`); a recurrent (SSM / GDN)
layer's state slot is hashed whole. With the device hash (the default; PD_ACCURACY_KV_DIGEST_HASH)
the work is queued on the step's stream where the KV lives and, on a GPU, the line is written by
a daemon thread once the digests' host copy lands, so the step never waits for it. Where the connector's own module gives the moment its bytes
arrive before post-processing (event ``arrived``), the decode also keeps the raw bytes then, to
tell the transfer from what follows it. Never raises into vLLM: a request it cannot digest gets
a line saying why.
"""
from __future__ import annotations

import atexit
import functools
import logging
import os
import queue
import threading
import time
from typing import Any, Mapping

from harness.protocol.kv_digest import (DIGEST_FILE_ENV, HASH_FUNCTIONS, RAW_PIECE_TOKENS,
                                        hash_choice, record_line)
from harness.serve.plugins.kv_digest.device_hash import index_tensor
from harness.serve.plugins.kv_digest.digest import make_hasher
from harness.serve.plugins.kv_events import interface
from harness.serve.plugins.kv_events.interface import KVView, Received, Sent
from harness.serve.plugins.kv_events.view import is_attention_layer
from harness.serve.plugins.kv_digest.layout import KVLayout, kernel_block_ids, layout_from_shape
from harness.serve.plugins.entry import vllm_plugin

logger = logging.getLogger("vllm.pd_accuracy.kv_digest")

TOKEN_CHUNK = 32          # CPU_ATTN blocks are multiples of 32, GPU ones of 16: a prefix hit
                          # starts on a 32-token boundary on CPU
SETUP_PREFIX = "pd-accuracy kv-digest-setup:"
_write_lock = threading.Lock()


def raw_blocks(cache: Any, kernel_ids: Any, tokens_per_block: int) -> Any:
    """Blocks ``kernel_ids`` of ``cache`` (a torch tensor, gathered on its device, or a numpy
    array), block axis first and the rest in memory order: the bytes a connector copies,
    whatever the layout means."""
    import numpy as np

    strides = cache.stride() if hasattr(cache, "stride") and callable(cache.stride) else (
        cache.strides)
    order = sorted(range(cache.ndim), key=lambda dim: -strides[dim])
    if order[0] != 0 or tokens_per_block % RAW_PIECE_TOKENS:
        raise ValueError(f"blocks are not outermost in memory (strides {list(strides)})")
    ids = np.asarray(kernel_ids, dtype=np.int64)
    if hasattr(cache, "index_select"):
        return cache.detach().permute(*order).index_select(0, index_tensor(ids, cache.device))
    return np.transpose(cache, order)[ids]


def raw_pieces(cache: Any, kernel_ids: Any, tokens_per_block: int,
               function: str | None = None) -> list[str]:
    """Hashes of the physical bytes of blocks ``kernel_ids`` of ``cache``, in order, cut in
    pieces of RAW_PIECE_TOKENS tokens' share (``function``: ``blake2b`` or ``device``)."""
    hasher = make_hasher(function or hash_choice())
    result = hasher.raw(raw_blocks(cache, kernel_ids, tokens_per_block),
                        tokens_per_block // RAW_PIECE_TOKENS)
    hasher.start()
    hasher.wait()
    return result()


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


def state_digest(cache: Any, block_ids: Any, function: str | None = None) -> str:
    """One recurrent layer's state for a request: the bytes of its state slot(s) (rows
    ``block_ids`` of dim 0), of each state tensor where the layer holds several (conv, SSM)."""
    hasher = make_hasher(function or hash_choice())
    result = _state(hasher, cache, block_ids)
    hasher.start()
    hasher.wait()
    return result()


def _state(hasher: Any, cache: Any, block_ids: Any) -> Any:
    if not list(block_ids):
        raise ValueError("no state slot in the request's blocks")
    parts = cache if isinstance(cache, (list, tuple)) else [cache]
    return hasher.state(parts, list(block_ids))


def _device_of(caches: Mapping[str, Any]) -> Any:
    """The device of the first torch cache (the GPU time is timed on it), or None."""
    for cache in caches.values():
        for part in cache if isinstance(cache, (list, tuple)) else [cache]:
            if hasattr(part, "device"):
                return part.device
    return None


def digest_request(view: KVView, group_block_ids: Any, token_offset: int, num_tokens: int,
                   raw_only: bool = False, with_raw: bool = True,
                   caches: Mapping[str, Any] | None = None,
                   hasher: Any = None) -> tuple[dict, dict, dict]:
    """(layer -> KVDigest, layer -> why not, layer -> raw pieces) of one request:
    ``group_block_ids`` are scheduler (logical) block ids per transfer group, holding prompt
    positions ``token_offset .. token_offset + num_tokens - 1``. Digests are of ``caches``
    (default: the KV cache attention reads); raw pieces are of the bytes the connector moves:
    the buffers it moves them through (``view.moved``), else the KV cache. Without ``hasher``
    the environment's function hashes and the results are returned; with one, the dicts hold
    callables that give the results once the hasher has started and waited (:func:`resolve`)."""
    own = hasher is None
    caches = view.caches if caches is None else caches
    if own:
        hasher = make_hasher(hash_choice(), _device_of(caches))
    moved: Mapping[str, Any] = view.moved or caches
    groups = list(group_block_ids or ())
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = [groups]
    digests: dict = {}
    skipped: dict = {}
    raw: dict = {}
    for index, group in enumerate(view.groups):
        ids = list(groups[index]) if index < len(groups) else []
        for name in group.layer_names:
            if name not in caches:
                continue
            if not is_attention_layer(view.layer_specs.get(name, group.kv_cache_spec)):
                if not raw_only:
                    try:
                        digests[name] = _state(hasher, caches[name], ids)
                    except Exception as error:  # noqa: BLE001
                        skipped[name] = f"state: {type(error).__name__}: {str(error)[:160]}"
                continue
            try:
                _attention_layer(view, name, caches[name], moved.get(name, caches[name]), ids,
                                 token_offset, num_tokens, raw_only, with_raw,
                                 digests, skipped, raw, hasher)
            except Exception as error:  # noqa: BLE001 - one line per layer, never raise
                skipped[name] = f"{type(error).__name__}: {str(error)[:200]}"
    if own:
        hasher.start()
        hasher.wait()
        return resolve(digests), skipped, resolve(raw)
    return digests, skipped, raw


def resolve(found: Mapping[str, Any]) -> dict:
    """``found`` with each pending result (a callable) replaced by its value."""
    out = {}
    for name, value in found.items():
        if isinstance(value, dict):
            out[name] = resolve(value)
        else:
            out[name] = value() if callable(value) else value
    return out


def _attention_layer(view: KVView, name: str, cache: Any, moved: Any, ids: list,
                     token_offset: int, num_tokens: int, raw_only: bool, with_raw: bool,
                     digests: dict, skipped: dict, raw: dict, hasher: Any) -> None:
    layout = _layout(tuple(int(n) for n in cache.shape), cache.dtype, view.backend,
                     view.kernel_block_size, view.kernel_block_size * view.blocks_per_logical)
    try:
        if with_raw:
            raw[name] = {"block_tokens": layout.block_size, "pieces": hasher.raw(
                raw_blocks(moved, kernel_block_ids(ids, num_tokens, layout), layout.block_size),
                layout.block_size // RAW_PIECE_TOKENS)}
    except Exception as error:  # noqa: BLE001 - the canonical digest still counts
        skipped[f"{name}:raw"] = f"{type(error).__name__}: {str(error)[:120]}"
    if raw_only:
        return
    inner = tuple(cache.shape[1:3] if cache.ndim == 4 else cache.shape[2:4])
    heads = int(inner[0] if layout.heads_before_tokens else inner[1])
    digests[name] = hasher.layer(cache, ids, num_tokens, layout, TOKEN_CHUNK,
                                 view.tp_rank * heads, token_offset)


class _Writer:
    """Finishes GPU digests off the engine's step: waits for their host copy, turns them into
    a line and writes it, one request after another in one daemon thread."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Any) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pd-kv-digest",
                                                daemon=True)
                self._thread.start()
                atexit.register(self.drain)
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception:  # noqa: BLE001 - a lost line shows as a missing digest
                logger.exception("pd-accuracy kv-digest: a digest line was not written")
            finally:
                self._jobs.task_done()

    def drain(self) -> None:
        """Wait for the lines still queued (process exit)."""
        self._jobs.join()


_writer = _Writer()


def _finish(path: str, line_of: Any, hashers: list, pending: tuple, step_s: float,
            spent_s: float) -> None:
    """Wait for the hashes, resolve them and write the line."""
    started = time.perf_counter()
    error = None
    try:
        for hasher in hashers:
            hasher.wait()
        started = time.perf_counter()
        resolved = tuple(resolve(part) if part else part for part in pending)
    except Exception as exc:  # noqa: BLE001 - never raise into vLLM: the line says why
        resolved, error = ({}, {}, {}, {}), f"{type(exc).__name__}: {str(exc)[:300]}"
    resolve_s = time.perf_counter() - started
    device_s = sum(hasher.device_s for hasher in hashers)
    _write(path, line_of(*resolved, error, step_s + resolve_s + device_s + spent_s,
                         {"step_s": step_s, "device_s": device_s, "resolve_s": resolve_s}))


def _emit(path: str, view: KVView, side: str, request_id: str, remote_id: str | None,
          block_ids: Any, token_offset: int, num_tokens: int, kept: Any = None,
          spent_s: float = 0.0) -> None:
    started = time.perf_counter()
    hasher = make_hasher(hash_choice(), _device_of(view.caches))
    try:
        # the decode's raw bytes are those kept at arrival (before post-processing and any
        # canary fault), never what it holds now: none is better than a wrong attribution
        digests, skipped, own_raw = digest_request(view, block_ids, token_offset, num_tokens,
                                                   with_raw=side == "prefill", hasher=hasher)
        host = view.moved if side == "prefill" else None
        # the prefill's host buffer is what the connector sends: a device-to-host copy that
        # missed tokens shows as host digests that differ from the KV cache's
        host_digests = digest_request(view, block_ids, token_offset, num_tokens,
                                      with_raw=False, caches=host, hasher=hasher)[0] if host else {}
        hasher.start()
        error = None
    except Exception as exc:  # noqa: BLE001
        digests, skipped, own_raw, host_digests = {}, {}, {}, {}
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    hashers, arrived = [hasher], None
    if kept is not None:        # (raw pieces, their hasher) from the arrival
        arrived, raw_hasher = kept
        hashers.append(raw_hasher)

    def line_of(digests, own_raw, host_digests, arrived, late_error, elapsed_s, timings):
        return record_line(side, request_id, remote_request_id=remote_id,
                           token_offset=token_offset, num_tokens=num_tokens, layers=digests,
                           skipped=skipped, raw=own_raw if side == "prefill" else arrived or {},
                           host_layers=host_digests, elapsed_s=elapsed_s,
                           tp_rank=view.tp_rank, error=error or late_error,
                           hash_function=hasher.name, timings=timings,
                           draft_layers=view.draft_layers)

    job = functools.partial(_finish, path, line_of, hashers,
                            (digests, own_raw, host_digests, arrived),
                            time.perf_counter() - started, spent_s)
    if any(getattr(h, "on_gpu", False) for h in hashers):
        _writer.submit(job)     # the step goes on; the line follows once the copies land
    else:
        job()


def on_sent(path: str, connector: Any, view: KVView | None, sent: Sent) -> None:
    """Event ``sent``: the prefill's digest line."""
    if view is not None:
        _emit(path, view, "prefill", sent.request_id, None, sent.block_ids, 0, sent.num_tokens)


def on_arrived(connector: Any, view: KVView | None, request: Received, fail: Any) -> None:
    """Event ``arrived``: raw pieces of what just arrived, before the connector's
    post-processing (block size, layout) and before any canary fault: hashed on the step's
    stream now, so later kernels cannot change what is hashed; read at ``received``."""
    if view is None:
        return
    started = time.perf_counter()
    try:
        hasher = make_hasher(hash_choice(), _device_of(view.caches))
        _, _, raw = digest_request(view, request.block_ids, request.token_offset,
                                   request.num_tokens, raw_only=True, hasher=hasher)
        hasher.start()
        kept = (raw, hasher)
    except Exception:  # noqa: BLE001
        kept = None
    request.notes["kv_digest_raw"] = (kept, time.perf_counter() - started)


def on_received(path: str, connector: Any, view: KVView | None, request: Received) -> None:
    """Event ``received``: the decode's digest line (raw bytes: those kept at arrival)."""
    if view is not None:
        kept, spent_s = request.notes.get("kv_digest_raw", (None, 0.0))
        _emit(path, view, "decode", request.request_id, request.remote_request_id,
              request.block_ids, request.token_offset, request.num_tokens, kept, spent_s)


DIGEST_ORDER = 90     # after the canary faults (order 10): their damage is in the digest


@vllm_plugin(logger, f"{SETUP_PREFIX} register() failed; no digests")
def register() -> None:
    """vLLM ``general_plugins`` entry point: a no-op unless PD_ACCURACY_KV_DIGEST_FILE is set."""
    path = os.environ.get(DIGEST_FILE_ENV, "").strip()
    if not path:
        return
    function = hash_choice()     # a bad PD_ACCURACY_KV_DIGEST_HASH: one line, no digests
    interface.subscribe("sent", functools.partial(on_sent, path), DIGEST_ORDER)
    interface.subscribe("arrived", on_arrived, DIGEST_ORDER)
    interface.subscribe("received", functools.partial(on_received, path), DIGEST_ORDER)
    interface.install()
    logger.warning("%s digests to %s with %s (pid %d)", SETUP_PREFIX, path,
                   HASH_FUNCTIONS[function], os.getpid())
