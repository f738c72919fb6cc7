"""expiry: a short KV lease; a share of the decode's reads start after it ran out. Found by
harness.weathers' scan of its packages: its row (below), its driver (``driver``), its fault
inside the decode (``in_server``: the late read), the words both exchange (``protocol``) and its
hook into vLLM (``HOOKS``)."""
from __future__ import annotations

from harness.core.vllm_hooks import Hook, base_need
from harness.weathers.facts import SHARE, WeatherParam, WeatherRow

NAME = "expiry"
# it drives the connector's own lease and read: only with connectors whose row lists it
ROW = WeatherRow(
    params={"share": WeatherParam(0.25, **SHARE, meaning="requests whose read is late"),
            "lease_s": WeatherParam(2, low=1, high=30, integer=True,
                                    meaning="the prefill's kv_lease_duration (s); the late "
                                            "reads start 2 s after it ran out")},
    needs_connector=True, min_vllm="0.26.0",   # ran on vLLM 0.26.0 on the H200
    summary="a short KV lease; a share of the decode's reads start after it ran out")
HOOKS = (
    Hook("late-read",
         ("weather expiry (a decode read held past the lease)",),
         needs=(base_need("on_new_request", "request"),
                base_need("get_num_new_matched_tokens", "request", "num_computed_tokens")),
         requires=("kv-events",), weathers=(NAME,),
         what="holds a tagged request's read until its delay has passed"),
)
# which module of this package attaches each hook (doctor says where a hook lives)
HOOK_PLUGINS = {"late-read": "in_server"}
