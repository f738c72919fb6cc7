"""preemption: a decode KV cache too small for its requests: vLLM preempts and resumes them. Found
by harness.weathers' scan of its packages: its row (below), its driver (``driver``)."""
from __future__ import annotations

from harness.weathers.facts import WeatherParam, WeatherRow

NAME = "preemption"
ROW = WeatherRow(
    params={"in_flight": WeatherParam(32, low=2, high=512, integer=True,
                                      meaning="requests in flight"),
            "decode_kv_blocks": WeatherParam(20, low=1, integer=True,
                                             meaning="KV cache blocks of the decode: "
                                                     "too few for the requests it runs")},
    summary="a decode KV cache too small for its requests: vLLM preempts and resumes them",
    block_params={"decode_kv_blocks": ("decode",)})
