"""The weathers a cell can be judged in: the one table of each ``weather`` value's facts, the
parameters it takes and the devices it can run on. Its driver (what it changes in the pair's
servers, what workload it sends, which events it injects and records, what must hold
afterwards) is a module of harness.run.weather, which registers it under the same name. A
weather that drives a connector's own machinery (its lease, its read poll) runs with the
connectors whose row in harness.connectors lists it; the others run with any. Adding a
weather is one row here and one registered module there (docs/weather.md).

``calm`` is today's polite, steady workload against roomy KV caches: the default, absent from
cell ids. Every other weather is judged by the verdict under weather (harness.judge.weather):
*silent wrong answers: 0*.

It lives in core, not next to the weather modules, because the matrix validates cells before
anything of run/ is imported (harness.matrix may only import core).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from harness.connectors import KV_CONNECTORS, connector_row


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
            return f"{name} must be a number, got {value!r}"
        if self.integer and float(value) != int(value):
            return f"{name} must be a whole number, got {value!r}"
        if value < self.low or (self.high is not None and value > self.high):
            upper = "" if self.high is None else f"–{self.high:g}"
            bounds = f"{self.low:g}{upper}" if upper else f">= {self.low:g}"
            return f"{name} must be {bounds}, got {value!r}"
        return None


SHARE = dict(low=0.0, high=1.0)   # a share of the requests: 0-1


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


# block-boundary's prompts land on k*BOUNDARY_UNIT - 1, k*BOUNDARY_UNIT, k*BOUNDARY_UNIT + 1
# tokens (harness.zoo.boundary): a boundary of every block size that divides it
BOUNDARY_UNIT = 128
BOUNDARY_MIN_MODEL_LEN = 1024   # the padded prompts (<= 4*128+1) and gsm_synth's 192 new tokens


DEFAULT_WEATHER = "calm"
WEATHERS: dict[str, WeatherRow] = {
    "calm": WeatherRow(
        summary="today's steady workload (--concurrency in flight), roomy KV caches"),
    "load": WeatherRow(
        params={"in_flight": WeatherParam(64, low=64, high=512, integer=True,
                                          meaning="requests in flight (the issue's >= 64)"),
                "kv_blocks": WeatherParam(48, low=8, integer=True,
                                          meaning="KV cache blocks per P/D server, so that "
                                                  "blocks are recycled many times")},
        summary=">= 64 requests in flight, prefix caching on, small KV caches: blocks recycle",
        block_params={"kv_blocks": ("prefill", "decode")}),
    "preemption": WeatherRow(
        params={"in_flight": WeatherParam(32, low=2, high=512, integer=True,
                                          meaning="requests in flight"),
                "decode_kv_blocks": WeatherParam(20, low=1, integer=True,
                                                 meaning="KV cache blocks of the decode: "
                                                         "too few for the requests it runs")},
        summary="a decode KV cache too small for its requests: vLLM preempts and resumes them",
        block_params={"decode_kv_blocks": ("decode",)}),
    # the fault weathers: the connector's lease, read poll and heartbeats are what they drive
    "expiry": WeatherRow(
        params={"share": WeatherParam(0.25, **SHARE, meaning="requests whose read is late"),
                "lease_s": WeatherParam(2, low=1, high=30, integer=True,
                                        meaning="the prefill's kv_lease_duration (s); the late "
                                                "reads start 2 s after it ran out")},
        needs_connector=True, min_vllm="0.26.0",   # ran on vLLM 0.26.0 on the H200
        summary="a short KV lease; a share of the decode's reads start after it ran out"),
    "load-failures": WeatherRow(
        params={"share": WeatherParam(0.25, **SHARE, meaning="requests whose read fails"),
                "recompute": WeatherParam(0, low=0, high=1, integer=True,
                                          meaning="kv_load_failure_policy: 0 fail, 1 recompute")},
        needs_connector=True,
        summary="a share of the decode's reads fail; policy fail (loud) or recompute (right)"),
    "aborts": WeatherRow(
        params={"share": WeatherParam(0.25, **SHARE, meaning="requests the proxy cancels"),
                "lease_s": WeatherParam(5, low=1, high=30, integer=True,
                                        meaning="the prefill's kv_lease_duration (s): how long "
                                                "it holds a cancelled request's blocks")},
        needs_connector=True, min_vllm="0.32.0",
        summary="the proxy cancels a share of requests, queued / prefilled / reading / decoding"),
    "restart": WeatherRow(
        params={"after_s": WeatherParam(4, low=1, high=120,
                                        meaning="seconds of traffic before each kill"),
                "min_questions": WeatherParam(100, low=50, integer=True,
                                              meaning="questions of the first look: traffic "
                                                      "before, during and after both restarts")},
        needs_connector=True,
        summary="the prefill, then the decode, killed and restarted mid-run"),
    "block-boundary": WeatherRow(
        params={"min_questions": WeatherParam(99, low=3, integer=True,
                                              meaning="questions of the first look: a third at "
                                                      "each of k*block-1, k*block, k*block+1")},
        task_variants={"gsm_synth": "gsm_synth_boundary"},
        summary="prompts of k*block-1, k*block and k*block+1 tokens (vLLM #50558)"),
    "soak": WeatherRow(
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
        block_params={"kv_blocks": ("prefill", "decode")}),
}


def weather_row(value: str) -> WeatherRow:
    """The row of ``value``; KeyError names the known values."""
    try:
        return WEATHERS[value]
    except KeyError:
        raise KeyError(f"unknown weather {value!r}; use one of {', '.join(WEATHERS)}") from None


def runs_with(weather: str, kv_connector: str) -> bool:
    """Whether a cell of `kv_connector` can be judged in `weather` (both known)."""
    return not weather_row(weather).needs_connector or weather in connector_row(kv_connector).weathers


def weather_connectors(weather: str) -> tuple[str, ...]:
    """The kv_connector values `weather` runs with (every one unless it needs its connector)."""
    return tuple(v for v in KV_CONNECTORS if runs_with(weather, v))


def weather_problem(weather: str, params: Mapping[str, Any]) -> str | None:
    """Why (`weather`, `params`) is not a weather the table knows, in one line; None if it is."""
    row = WEATHERS.get(weather)
    if row is None:
        return f"unknown weather {weather!r}; use one of {', '.join(WEATHERS)}"
    for name, value in params.items():
        spec = row.params.get(name)
        if spec is None:
            known = ", ".join(row.params) or "none"
            return f"weather {weather} takes no parameter {name!r} (it takes: {known})"
        problem = spec.problem(name, value)
        if problem:
            return f"weather {weather}: {problem}"
    return None


def resolved_params(weather: str, params: Mapping[str, Any]) -> dict[str, float]:
    """Every parameter of `weather`: the given ones, the row's defaults for the rest."""
    row = weather_row(weather)
    return {name: (int if spec.integer else float)(params.get(name, spec.default))
            for name, spec in row.params.items()}


def params_token(params: tuple[tuple[str, Any], ...]) -> str:
    """The id suffix of explicitly set parameters ("in_flight=96" -> "in_flight96")."""
    return "".join(f"_{k}{v:g}" if isinstance(v, (int, float)) else f"_{k}{v}" for k, v in params)


__all__ = ["BOUNDARY_MIN_MODEL_LEN", "BOUNDARY_UNIT", "DEFAULT_WEATHER", "SHARE", "ServerChanges", "WEATHERS", "WeatherParam", "WeatherRow", "params_token",
           "resolved_params", "runs_with", "weather_connectors", "weather_problem", "weather_row"]
