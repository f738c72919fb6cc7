"""What the harness knows of a weather before any server starts: its facts (:class:`WeatherRow`),
which the matrix rules check (its parameters and their bounds, the devices and vLLM it runs on,
whether it drives the connector's own machinery), what it changes in a P/D server
(:class:`ServerChanges`) and the rules of its own the matrix adds (:class:`WeatherRule`).

A weather package (harness/weathers/<name>/) holds its row; the registry of rows, and the
parsing of a cell's weather parameters against them, is harness.weathers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class WeatherParam:
    """One parameter of a weather: its default, its bounds (inclusive), what it means."""

    default: float
    low: float = 0.0
    high: float | None = None       # None: no upper bound
    integer: bool = False
    meaning: str = ""

    def problem(self, name: str, value: Any) -> str | None:
        """Why `value` is not a valid value of this parameter, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{name} must be a number, got {str(value)[:40]!r}"
        try:   # NaN, infinities and integers past a float's range are no parameter
            finite = math.isfinite(float(value)) and abs(float(value)) <= MAX_PARAM
        except OverflowError:
            finite = False
        if not finite:
            return f"{name} must be a finite number of at most {MAX_PARAM:g}, got {str(value)[:40]}"
        if self.integer and float(value) != int(value):
            return f"{name} must be a whole number, got {value!r}"
        if value < self.low or (self.high is not None and value > self.high):
            upper = "" if self.high is None else f"–{self.high:g}"
            bounds = f"{self.low:g}{upper}" if upper else f">= {self.low:g}"
            return f"{name} must be {bounds}, got {value!r}"
        return None


SHARE = dict(low=0.0, high=1.0)   # a share of the requests: 0-1
MAX_PARAM = 1e12   # no weather parameter means anything larger (requests, blocks, seconds)


@dataclass(frozen=True)
class ServerChanges:
    """What a weather changes in one P/D server (harness.serve.launch.server_spec applies it;
    the baseline never gets any: it is the calm reference)."""

    extra_args: tuple[str, ...] = ()                    # appended to the server's argv
    extra_env: tuple[tuple[str, str], ...] = ()         # added to its environment
    kv_transfer: tuple[tuple[str, Any], ...] = ()       # top-level --kv-transfer-config keys
    kv_connector_extra: tuple[tuple[str, Any], ...] = ()   # its kv_connector_extra_config keys
    num_blocks: int | None = None                       # the KV cache's size in blocks
    prefix_caching: bool | None = None                  # None: the cell's
    max_num_seqs: int | None = None                     # None: the harness's default

    def __bool__(self) -> bool:
        return self != ServerChanges()


@dataclass(frozen=True)
class WeatherRow:
    params: Mapping[str, WeatherParam] = field(default_factory=dict)
    # True: it drives the connector's own machinery, and runs only with connectors whose row
    # lists it (ConnectorRow.weathers); False: with any connector
    needs_connector: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    # the vLLM version the installed one must reach (a setting it drives appeared there), or None
    min_vllm: str | None = None
    summary: str = ""
    # parameters that size a KV cache in blocks -> the roles whose cache they size (each must
    # still hold one max_model_len request, or vLLM refuses to start)
    block_params: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # task -> the variant whose prompts this weather needs (the baseline is asked it too, so
    # the cell's baseline_key names the weather); empty: the cell's own task
    task_variants: Mapping[str, str] = field(default_factory=dict)
    # validity rules of its own, checked on its cells after rule known-weather
    rules: tuple["WeatherRule", ...] = ()


@dataclass(frozen=True)
class WeatherRule:
    """A matrix validity rule a weather adds for its own cells (kind "invalid"): its name, the
    line ``pd-accuracy list --rules`` shows, and the check (a Cell -> why it cannot run, or
    None)."""

    name: str
    summary: str
    check: Callable[[Any], "str | None"]


__all__ = ["SHARE", "ServerChanges", "WeatherParam", "WeatherRow", "WeatherRule"]
