"""vLLM general plugin: a CPU server in a world of one rank shares one gloo group among vLLM's
process groups instead of opening one per group.

vLLM 0.32's ``GroupCoordinator`` (``vllm/distributed/parallel_state.py``) opens a device group and
a gloo CPU group with ``torch.distributed.new_group`` for every parallel dimension (world, TP,
PP, DP, EP, DCP, PCP, ...), also when the world is one rank and each group holds only rank 0. On
the CPU every one of them is a gloo group, and every gloo group runs a ``gloo_tcp_loop`` thread
whose ``epoll_wait`` has a fixed 10 ms timeout: a TP1 worker carries 13 of them, waking 1,300
times a second on the one core the server is pinned to. ``pd-accuracy bench`` counted them as
0.89 runnable threads of a smoke group's P/D evaluation, beside 2.9 of vLLM's own ``python``.

``PD_ACCURACY_SHARE_GLOO_GROUPS=1`` (set by ``harness.serve.launch.thread_budget`` for CPU
servers) makes ``new_group`` hand back one shared group whenever the world has one rank and the
call asks for a gloo group of rank 0 alone: collectives over a group of one rank are copies, so
which group object carries them changes nothing, and the shared group is destroyed once, with
the world. Any other call (more ranks, another backend, options) goes to torch unchanged.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any

from harness.protocol.switches import SHARE_GLOO_GROUPS_ENV as ENV
from harness.serve.plugins.entry import vllm_plugin

logger = logging.getLogger("vllm.pd_accuracy.gloo_groups")

_SHAREABLE_KWARGS = {"timeout", "group_desc"}   # what does not change a group of one rank



def _is_gloo(backend: Any) -> bool:
    # None means the default backend, which on a CPU server is gloo (vLLM's cpu dist_backend)
    return backend is None or str(backend).lower() == "gloo"


def patch_new_group(dist: Any) -> bool:
    """Make ``dist.new_group`` share one gloo group in a world of one rank; idempotent.

    Returns True when patched (now or before)."""
    if getattr(dist.new_group, "_pd_accuracy_shared", False):
        return True
    original_new, original_destroy = dist.new_group, dist.destroy_process_group
    shared: dict[str, Any] = {}

    @functools.wraps(original_new)
    def new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
        shareable = (not args and set(kwargs) - {"backend"} <= _SHAREABLE_KWARGS
                     and _is_gloo(kwargs.get("backend"))
                     and dist.is_initialized() and dist.get_world_size() == 1
                     and (ranks is None or list(ranks) == [0]))
        if not shareable:
            return original_new(ranks, *args, **kwargs)
        if "group" not in shared:
            shared["group"] = original_new(ranks, **kwargs)
        return shared["group"]

    @functools.wraps(original_destroy)
    def destroy_process_group(group: Any = None) -> Any:
        if group is not None and group is shared.get("group"):
            return None         # shared by several coordinators: it goes with the world
        if group is None:
            shared.clear()
        return original_destroy(group)

    new_group._pd_accuracy_shared = True  # type: ignore[attr-defined]
    dist.new_group, dist.destroy_process_group = new_group, destroy_process_group
    return True


@vllm_plugin(logger, "pd-accuracy gloo_groups: register() failed; vLLM left as is",
             wanted=lambda: os.environ.get(ENV, "").strip() == "1")
def register() -> None:
    """vLLM ``general_plugins`` entry point (harness.serve.plugins.entry)."""
    import torch.distributed as dist    # vLLM imported torch already; this costs nothing

    from harness.serve.plugins import compat

    if not compat.attach("gloo-groups"):
        return
    if patch_new_group(dist):
        # WARNING, like mq_spin: INFO of a plugin loaded this early is dropped
        logger.warning("pd-accuracy gloo_groups: a world of one rank shares one gloo group")
