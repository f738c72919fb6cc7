"""A made-up weather, as a package of its own outside the harness: what adding one takes
(tests/weathers/test_made_up_weather.py registers it). It drives the connector's own machinery
(only the made-up connector lists it), has a rule of its own, a parameter, a hook into vLLM, a
fault in the decode and hops in the proxy."""
from __future__ import annotations

from harness.core.vllm_hooks import Hook, Need
from harness.weathers.facts import SHARE, WeatherParam, WeatherRow, WeatherRule

NAME = "drizzle"


def equal_blocks(cell) -> str | None:
    """drizzle runs only where the prefill's and the decode's block sizes are equal."""
    if cell.prefill_block_size != cell.decode_block_size:
        return "weather drizzle needs equal block sizes"
    return None


ROW = WeatherRow(
    params={"share": WeatherParam(0.5, **SHARE, meaning="requests the proxy drizzles on")},
    needs_connector=True, summary="a made-up weather",
    rules=(WeatherRule("drizzle-blocks", equal_blocks.__doc__.splitlines()[0], equal_blocks),))
HOOKS = (Hook("drizzle-hook", ("weather drizzle",), needs=(Need("json", "loads"),),
              weathers=(NAME,), what="a made-up hook"),)
HOOK_PLUGINS = {"drizzle-hook": "in_server"}
