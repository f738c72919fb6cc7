"""vLLM general plugin: stop NIXL's UCX progress thread from spinning while idle.

NIXL's Python binding (``nixl_agent.__init__`` in ``nixl_cu12/_api.py``, NIXL 1.5.1) builds the
C++ ``nixlAgentConfig`` itself and hard-codes ``pthrDelay = 0``. The UCX backend's shared
progress thread turns that delay into the timeout of its ``poll()`` on the UCX worker event fds
(rounded *up* to whole milliseconds), so 0 means a busy loop: every idle P/D server burns a core,
which on a 2-core machine slows the other server down several-fold. A non-zero delay only bounds
how long the thread sleeps when no event fd fires (a workaround for missed UCX wake-ups), so
transfers should still wake it at once (the stall below says this is not the whole story).

Measured on the 2-core CPU machine (tiny Llama P/D pair, vLLM 0.32.0, NIXL 1.5.1,
scripts/check_plugins.sh idle): idle CPU of each server's process tree 3 % with the plugin vs
67-91 % without. P/D latency did not improve: back-to-back requests show a recurring ~400 ms
stall in the prefill hop with the delay set (none with 2 s between requests), which offsets
the faster decode hop; not root-caused. ``PD_ACCURACY_NIXL_PTHR_DELAY_US=0`` restores NIXL's
spinning behaviour where latency matters more than CPU.

The plugin replaces ``nixlBind`` *inside ``nixl._api`` only* with a proxy whose ``nixlAgent``
constructor raises ``pthrDelay`` from 0 to ``PD_ACCURACY_NIXL_PTHR_DELAY_US`` (default
:data:`DEFAULT_PTHR_DELAY_US`; ``0`` leaves NIXL alone) before the C++ agent is built. The patch
is applied by a post-import hook, so ``register()`` never imports NIXL itself: vLLM must import it
first, after setting ``UCX_RCACHE_MAX_UNRELEASED`` (``vllm/distributed/nixl_utils.py``).
"""
from __future__ import annotations

from harness.connectors.nixl.variables import DEFAULT_PTHR_DELAY_US, DELAY_ENV, parse_delay_us

import importlib.util
import logging
import os
from typing import Any, Mapping

import wrapt
from harness.serve.plugins.entry import vllm_plugin


# Child of vLLM's "vllm" logger so lines carry vLLM's format and reach the server log.
logger = logging.getLogger("vllm.pd_accuracy.nixl_idle")

# DELAY_ENV and its parse live in ../variables.py: the command line checks them before a run
# The per-flavour modules that nixl/__init__.py installs as `nixl._api` (and vLLM's ROCm path
# imports directly). Hooking them rather than `nixl` also covers code importing them directly.
NIXL_API_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")



def apply_progress_delay(agent_config: Any, delay_us: int) -> bool:
    """Set ``agent_config.pthrDelay`` to ``delay_us`` if NIXL left it at the spinning 0.

    Returns True when the config was changed. A non-zero value already there was chosen on
    purpose by whoever built the config (a future NIXL, a caller), so it is kept.
    """
    if delay_us <= 0 or getattr(agent_config, "pthrDelay", None) != 0:
        return False
    agent_config.pthrDelay = delay_us
    return True


class IdleDelayBindings:
    """Stand-in for ``nixl._api.nixlBind``: delegates everything to the real bindings module
    except the ``nixlAgent`` constructor, which first applies the progress-thread delay."""

    def __init__(self, bindings: Any, delay_us: int) -> None:
        self._bindings = bindings
        self._delay_us = delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, agent_name: str, agent_config: Any, *args: Any, **kwargs: Any) -> Any:
        """Build the C++ agent with ``pthrDelay`` raised to the configured delay."""
        try:
            if apply_progress_delay(agent_config, self._delay_us):
                logger.info(
                    "pd-accuracy nixl_idle: agent %s progress-thread delay 0 -> %d us",
                    agent_name, self._delay_us,
                )
        except Exception:  # never stop vLLM from building its agent
            logger.exception("pd-accuracy nixl_idle: could not set pthrDelay; NIXL default kept")
        return self._bindings.nixlAgent(agent_name, agent_config, *args, **kwargs)


def patch_nixl_api(api_module: Any, delay_us: int) -> bool:
    """Swap ``api_module.nixlBind`` for an :class:`IdleDelayBindings`. Idempotent.

    Returns True when the module is (now or already) patched, False when it does not look like
    the NIXL ``_api`` this plugin was written against (it is then left untouched).
    """
    bindings = getattr(api_module, "nixlBind", None)
    if isinstance(bindings, IdleDelayBindings):
        return True
    if bindings is None or not hasattr(bindings, "nixlAgent") or not hasattr(
        api_module, "nixl_agent"
    ):
        logger.warning(
            "pd-accuracy nixl_idle: %s has no nixlBind.nixlAgent; progress thread left spinning",
            getattr(api_module, "__name__", api_module),
        )
        return False
    api_module.nixlBind = IdleDelayBindings(bindings, delay_us)
    return True


def _make_hook(delay_us: int):
    def hook(module: Any) -> None:
        from harness.serve.plugins import compat

        if not compat.attach("nixl-idle"):
            return
        try:
            patch_nixl_api(module, delay_us)
        except Exception:
            logger.exception("pd-accuracy nixl_idle: patching %s failed", module.__name__)

    return hook


@vllm_plugin(logger, "pd-accuracy nixl_idle: register() failed; NIXL left as is")
def register() -> None:
    """vLLM ``general_plugins`` entry point (harness.serve.plugins.entry)."""
    delay_us = parse_delay_us(os.environ)
    if delay_us == 0:
        return
    if importlib.util.find_spec("nixl") is None:
        return
    for name in NIXL_API_MODULES:
        wrapt.register_post_import_hook(_make_hook(delay_us), name)
