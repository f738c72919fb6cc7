"""soak: thousands of requests under load, small caches, judged per window. Found by
harness.weathers' scan of its packages: its row (below), its driver (``driver``; its series is
judged by harness.judge.weather)."""
from __future__ import annotations

from harness.weathers.facts import SHARE, WeatherParam, WeatherRow

NAME = "soak"
ROW = WeatherRow(
    params={"requests": WeatherParam(0, low=0, high=1_000_000, integer=True,
                                     meaning="requests of the soak after the first look, "
                                             "cycling its questions; 0: the device's default "
                                             "(2,000 on CPU, 20,000 on a GPU)"),
            "in_flight": WeatherParam(64, low=2, high=512, integer=True,
                                      meaning="requests in flight (load's)"),
            "kv_blocks": WeatherParam(48, low=8, integer=True,
                                      meaning="KV cache blocks per P/D server (load's): every "
                                              "block recycled many times"),
            "window": WeatherParam(100, low=20, high=10_000, integer=True,
                                   meaning="requests per window of the agreement series"),
            "fail_share": WeatherParam(0, **SHARE,
                                       meaning="questions whose every read is reported "
                                               "failed (fail-transfer): blocks of a failed "
                                               "read reused by the next requests")},
    summary="thousands of requests under load, small caches; digest and agreement per "
            "window of 100, a trend test on agreement",
    block_params={"kv_blocks": ("prefill", "decode")})
