"""load-failures: a share of the decode's reads fail; policy fail (loud) or recompute (right).
Found by harness.weathers' scan of its packages: its row (below), its driver (``driver``; the
decode's fail-transfer fault it arms is the canary's, harness.serve.plugins.faults)."""
from __future__ import annotations

from harness.weathers.facts import SHARE, WeatherParam, WeatherRow

NAME = "load-failures"
ROW = WeatherRow(
    params={"share": WeatherParam(0.25, **SHARE, meaning="requests whose read fails"),
            "recompute": WeatherParam(0, low=0, high=1, integer=True,
                                      meaning="kv_load_failure_policy: 0 fail, 1 recompute")},
    needs_connector=True,
    summary="a share of the decode's reads fail; policy fail (loud) or recompute (right)")
