"""What vLLM's ExampleConnector does its own way, for :mod:`harness.serve.plugins.kv_events.interface`.

It moves KV through files, synchronously inside a step, and answers none of the interface's
asynchronous calls: its ``request_finished`` keeps no blocks (the prefill saved them already)
and its ``get_finished`` reports nothing (the decode loaded them already). So:

* ``stores`` (scheduler): the requests whose KV this step's forward saves, with their blocks,
  read off the step's ``ExampleConnectorMetadata`` (its requests name no request id: they come
  in the order of ``scheduled_new_reqs``); only on a producer (a consumer also saves prompts it
  found no file for, which is not a send).
* ``receiving_blocks`` (scheduler): the blocks a load lands in (all of the request's past its
  local prefix hit: the synchronous load's blocks are hashed as soon as they are allocated).
* ``install`` (worker): ``wait_for_save`` runs after the step's forward, when every layer of the
  saved requests is written (``save_kv_layer``, one file per layer): event ``sent`` there, the
  prefill's digest of the KV it saved. ``start_load_kv`` writes the files' KV into the decode's
  blocks before the forward reads them: event ``received`` there (a canary fault breaks it then,
  the digest hashes it after), the decode's digest of the KV it loaded.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable

logger = logging.getLogger("vllm.pd_accuracy.kv_events")

CONNECTOR_CLASSES = ("ExampleConnector",)
_MARK = "__pd_accuracy_example__"
# it loads synchronously: no read poll, no moment to fail a read the way a transfer fails
GIVES_ARRIVAL = False


def stores(connector: Any, meta: Any, scheduler_output: Any) -> dict[str, tuple[Any, int]]:
    """{request id: (scheduler block ids per group, tokens saved)} of the requests this step's
    metadata saves."""
    config = getattr(connector, "_kv_transfer_config", None)
    if config is not None and not getattr(config, "is_kv_producer", True):
        return {}
    requests = list(getattr(meta, "requests", None) or ())
    found: dict[str, tuple[Any, int]] = {}
    index = 0
    for new_req in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
        if index >= len(requests):
            break
        request = requests[index]
        tokens = list(new_req.prompt_token_ids or [])
        # build_connector_meta adds a load or a save per new request, in order, or nothing
        if [int(t) for t in request.token_ids.tolist()] != tokens[:len(request.token_ids)]:
            continue
        index += 1
        if request.is_store:
            found[new_req.req_id] = (new_req.block_ids, len(request.slot_mapping))
    return found


def receiving_blocks(connector: Any, blocks: Any, first_position: int) -> list[list[int]]:
    """The blocks a load lands in, from prompt position ``first_position`` (after a local
    prefix hit) on. Its load is synchronous: the scheduler counts the loaded tokens computed at
    once and hashes their full blocks on allocation, so "unhashed" (the interface's default)
    would leave out all but the last; the request's blocks past the local hit are the ones."""
    skip = first_position // int(connector._block_size)
    return [list(group)[skip:] for group in blocks.get_block_ids()]


def _after(original: Callable, announce: Callable[[Any, Any], None], when: Callable[..., bool]
           ) -> Callable:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            if when(*args, **kwargs):
                announce(self, self._get_connector_metadata())
        except Exception:  # noqa: BLE001 - a hook never takes the server down
            logger.exception("pd-accuracy kv-events: %s hook failed", original.__name__)
        return result

    setattr(method, _MARK, True)
    return method


def _has_attention(forward_context: Any = None, *args: Any, **kwargs: Any) -> bool:
    # ExampleConnector loads nothing without attention metadata (it logs a warning)
    return getattr(forward_context, "attn_metadata", None) is not None


def install(connector_cls: Any) -> None:
    """Announce saves after ``wait_for_save`` and loads after ``start_load_kv``."""
    from harness.serve.plugins.kv_events.interface import loaded, saved

    for name, announce, when in (("wait_for_save", saved, lambda *a, **k: True),
                                 ("start_load_kv", loaded, _has_attention)):
        original = getattr(connector_cls, name)
        if not getattr(original, _MARK, False):
            setattr(connector_cls, name, _after(original, announce, when))
