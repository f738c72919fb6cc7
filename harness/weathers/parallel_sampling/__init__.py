"""parallel-sampling: each question asked again with ``n`` children (n = 2..4, seeded). Found by
harness.weathers' scan of its packages: its row (below), its driver (``driver``)."""
from __future__ import annotations

from harness.weathers.facts import WeatherParam, WeatherRow

NAME = "parallel-sampling"
ROW = WeatherRow(
    params={"n": WeatherParam(2, low=2, high=4, integer=True,
                              meaning="children per request (OpenAI n), each decoded from the "
                                      "one prefill's transferred KV"),
            "top_k": WeatherParam(1, low=1, high=50, integer=True,
                                  meaning="the children's top_k at temperature 1 (vLLM "
                                          "refuses n > 1 at temperature 0; 1: nearly greedy)")},
    summary="each question again with n children (seeded): every child's prompt KV must be "
            "its prefill's (digest per child); children's answers judged statistically")
