"""The axes of a grid: their names, how each maps onto Cell fields, and the values one takes.

The names and their order come from the schema ($defs.axes.properties); the order is the order
of the cartesian product, hence of the cells. Values reach these functions already checked
against the schema, so they only convert:

- scalar axes (model, runner, backend, ...) set the Cell field of the same name;
- pair axes (block_size, tp, instances, kv_cache_dtype) set a prefill and a decode field:
  ``128`` | ``[16, 64, [64, 128]]`` | ``{prefill: [..], decode: [..]}`` (also as a list item),
  and likewise ``fp8`` | ``[auto, fp8, [auto, fp8]]`` for the KV cache dtype;
- list axes (extra_args, extra_env, weather_params) hold one variant or a list of variants.
"""
from __future__ import annotations

from typing import Any, Mapping

from harness.core.cell import weather_items
from harness.matrix.schema import SCHEMA

AXES: tuple[str, ...] = tuple(SCHEMA["$defs"]["axes"]["properties"])
PAIR_AXES = {  # YAML key -> (prefill field, decode field)
    "block_size": ("prefill_block_size", "decode_block_size"),
    "tp": ("prefill_tp", "decode_tp"),
    "instances": ("num_prefill", "num_decode"),
    "kv_cache_dtype": ("prefill_kv_cache_dtype", "decode_kv_cache_dtype"),
}
LIST_AXES = ("extra_args", "extra_env", "weather_params")
SCALAR_AXES = tuple(a for a in AXES if a not in PAIR_AXES and a not in LIST_AXES)
REQUIRED_BLOCK = "required"   # block_size value: the hybrid model's minimum block on that device


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def pairs(value: Any) -> list[Any]:
    """A pair axis's value -> [(prefill, decode), ...] (and REQUIRED_BLOCK as it stands)."""
    out: list[Any] = []
    for item in as_list(value):
        if isinstance(item, Mapping):
            out.extend((p, d) for p in as_list(item["prefill"]) for d in as_list(item["decode"]))
        elif item == REQUIRED_BLOCK:
            out.append(REQUIRED_BLOCK)
        elif isinstance(item, (int, str)):     # a size, or a dtype: both sides
            out.append((item, item))
        else:
            out.append((item[0], item[1]))
    return out


def env_items(env: Mapping[Any, Any]) -> tuple[tuple[str, str], ...]:
    """An env mapping as Cell.extra_env holds it: sorted (name, value) strings."""
    return tuple(sorted((str(k), str(v)) for k, v in env.items()))


def axis_values(key: str, value: Any) -> list[Any]:
    """The values one axis takes in a grid (one cell per value)."""
    if key in PAIR_AXES:
        return pairs(value)
    if key == "extra_args":
        items = as_list(value)
        if all(isinstance(v, str) for v in items):
            return [tuple(items)]
        return [tuple(str(a) for a in v) for v in items]
    if key == "extra_env":
        return [env_items(m) for m in (value if isinstance(value, list) else [value])]
    if key == "weather_params":
        return [weather_items(m) for m in (value if isinstance(value, list) else [value])]
    return as_list(value)
