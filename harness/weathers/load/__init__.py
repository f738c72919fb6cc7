"""load: >= 64 requests in flight, prefix caching on, small KV caches: blocks recycle. Found by
harness.weathers' scan of its packages: its row (below), its driver (``driver``)."""
from __future__ import annotations

from harness.weathers.facts import WeatherParam, WeatherRow

NAME = "load"
ROW = WeatherRow(
    params={"in_flight": WeatherParam(64, low=64, high=512, integer=True,
                                      meaning="requests in flight (the issue's >= 64)"),
            "kv_blocks": WeatherParam(48, low=8, integer=True,
                                      meaning="KV cache blocks per P/D server, so that "
                                              "blocks are recycled many times")},
    summary=">= 64 requests in flight, prefix caching on, small KV caches: blocks recycle",
    block_params={"kv_blocks": ("prefill", "decode")})
