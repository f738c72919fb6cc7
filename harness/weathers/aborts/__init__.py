"""aborts: the proxy cancels a share of requests, queued / prefilled / reading / decoding. Found by
harness.weathers' scan of its packages: its row (below), its driver (``driver``), its hops in
the harness's proxy (``proxy``) and the tag and answer both exchange (``protocol``)."""
from __future__ import annotations

from harness.weathers.facts import SHARE, WeatherParam, WeatherRow

NAME = "aborts"
ROW = WeatherRow(
    params={"share": WeatherParam(0.25, **SHARE, meaning="requests the proxy cancels"),
            "lease_s": WeatherParam(5, low=1, high=30, integer=True,
                                    meaning="the prefill's kv_lease_duration (s): how long "
                                            "it holds a cancelled request's blocks")},
    needs_connector=True, min_vllm="0.32.0",
    summary="the proxy cancels a share of requests, queued / prefilled / reading / decoding")
