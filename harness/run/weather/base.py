"""What a weather's driver implements (the ``driver`` module of its package, harness/weathers/
<name>/; its ``WEATHER`` is an instance of a subclass of `Weather`). docs/weather.md says it in
prose.

A weather acts at four points of a cell's flow, each a method with a calm default:

1. ``servers(cell, params)``  before the pair starts: what it changes in the prefill and the
   decode (role -> harness.weathers.facts.ServerChanges: argv, env, kv_transfer_config keys,
   the KV cache's blocks, prefix caching, max_num_seqs). The baseline always runs calm.
2. ``workload(cell, params)`` the requests it sends: how many in flight, how many questions at
   least, and the proxy's per-request tag for a server-side injection (a harness plugin on a
   server, armed through ``ServerChanges.extra_env``, acting on the requests the tag names).
3. ``events(run)``            afterwards: what it injected, per request (read from the proxy's
   records, the servers' logs and /metrics, `WeatherRun`): every loud failure must be accounted
   to one of these.
4. ``conditions(run)``        afterwards: that it happened ("happened": blocks recycled,
   preemptions counted; else the cell is ERROR, nothing said) and what must hold under it
   ("holds": an expired count matching the events; else FAIL).

``failure_budget`` (how many requests may fail loudly) and ``accounted_checks`` (transfer checks
whose aggregate it replaces by its per-request accounting) complete it. The verdict itself
(silent wrong answers: 0, failures accounted, servers healthy, answers non-inferior) is the
judge's, the same for every weather (harness.judge.weather).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from harness.core.cell import Cell
from harness.weathers.facts import ServerChanges
from harness.judge.weather import InjectedEvent, RequestRow, WeatherCondition
from harness.connectors.driver import KvConnector
from harness.connectors import connector_for
from harness.serve.deploy import Deployment


@dataclass(frozen=True)
class Workload:
    """The requests a weather sends."""

    in_flight: int | None = None        # requests in flight; None: the run's --concurrency
    min_questions: int | None = None    # questions of the first look at least (enough weather)
    # the proxy's tag for requests a server-side plugin acts on (harness.serve.plugins.faults
    # .spec.request_tag_for); None: no request is tagged
    request_tag: str | None = None


@dataclass(frozen=True)
class WeatherRun:
    """What one weather cell's evaluation left, for `Weather.events` and `Weather.conditions`."""

    cell: Cell
    params: Mapping[str, float]                    # every parameter (defaults filled in)
    rows: tuple[RequestRow, ...]                   # per request, events not yet attached
    proxy_records: tuple[dict, ...]
    # each P/D server's /metrics samples (summed over label sets) before and after the run
    metrics_before: Mapping[str, Mapping[str, float]]
    metrics_after: Mapping[str, Mapping[str, float]]
    logs: Mapping[str, str] = field(default_factory=dict)   # server name -> log path
    # what the weather's disturbance did during the run: (what, unix time), in order
    timeline: tuple[tuple[str, float], ...] = ()

    def metric_delta(self, server: str, sample: str) -> float:
        """How much `sample` grew on `server` ("prefill-0", "decode-0") during the run."""
        after = self.metrics_after.get(server, {}).get(sample, 0.0)
        return after - self.metrics_before.get(server, {}).get(sample, 0.0)

    def metric_delta_role(self, role: str, sample: str) -> float:
        """`metric_delta` summed over every server of `role`."""
        return sum(self.metric_delta(s, sample) for s in self.metrics_after if s.startswith(role))

    @property
    def connector(self) -> KvConnector:
        return connector_for(self.cell.kv_connector)

    def counter_delta(self, counter: str) -> float:
        """How much the connector-neutral `counter` ("failed_transfers", "expired_requests")
        grew, on the servers of every role the cell's connector counts it on."""
        metrics = self.connector.metrics
        return sum(self.metric_delta_role(role, sample) for role in metrics.roles(counter)
                   for sample in metrics.samples_of(counter))

    def counter_source(self, counter: str) -> str:
        """Where `counter` is read, in words: "prefill+decode vllm:..._total"."""
        metrics = self.connector.metrics
        return (f"{'+'.join(metrics.roles(counter))} "
                f"{', '.join(metrics.samples_of(counter)) or f'(no sample for {counter})'}")

    def log_text(self, server: str) -> str:
        path = self.logs.get(server)
        try:
            return open(path, errors="replace").read() if path else ""
        except OSError:
            return ""


@dataclass(frozen=True)
class SeriesQuestion:
    """A question a weather's series asks again: the request lm-eval sent for it, and the baseline's
    answer to it (extracted by the task's strict-match filter)."""

    doc_id: int
    payload: dict
    baseline_answer: str


class Sustain:
    """What a weather sends on its own after the first look, its request series: `run` sends
    its requests through the proxy and returns one row per request (series_index, status, answer,
    agrees with the baseline's; the witness adds each one's digest). The judge reads the series
    in windows (harness.judge.weather's agreement-trend) and the record keeps it under
    metrics.weather.series."""

    window: int = 100     # requests per window of the series the judge reads
    noun: tuple[str, str] = ("request", "requests")   # what the verdict calls one, many

    def run(self, proxy_url: str, questions: list[SeriesQuestion]) -> tuple[RequestRow, ...]:
        raise NotImplementedError


class Disturbance:
    """What a weather does to the running pair during the evaluation (a thread of its own):
    `run(pair, proxy_url, note)` acts, calling `note(what)` at each step (the timeline)."""

    def __init__(self, act: Callable[[Deployment, str, Callable[[str], None]], None]) -> None:
        self.act = act
        self.timeline: list[tuple[str, float]] = []
        self.thread: threading.Thread | None = None

    def note(self, what: str) -> None:
        self.timeline.append((what, time.time()))

    def start(self, pair: Deployment, proxy_url: str) -> "Disturbance":
        def run() -> None:
            try:
                self.act(pair, proxy_url, self.note)
            except Exception as exc:  # noqa: BLE001 - the timeline says it; conditions judge
                self.note(f"error: {type(exc).__name__}: {exc}")
        self.thread = threading.Thread(target=run, name="weather-disturbance", daemon=True)
        self.thread.start()
        return self

    def finish(self, timeout_s: float) -> tuple[tuple[str, float], ...]:
        """Wait for it to end (at most `timeout_s`); what it did."""
        if self.thread is not None:
            self.thread.join(timeout_s)
            if self.thread.is_alive():
                self.note("error: still running when judged")
        return tuple(self.timeline)


class Weather:
    """The calm defaults; a weather overrides what it changes."""

    name = "calm"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        """role ("prefill" | "decode") -> what this weather changes in its servers."""
        return {}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload()

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        return ()

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        return ()

    def sustain(self, cell: Cell, params: Mapping[str, float]) -> Sustain | None:
        """What it sends on its own after the first look (None: nothing)."""
        return None

    def disturbance(self, cell: Cell, params: Mapping[str, float]) -> Disturbance | None:
        """What it does to the running pair during the evaluation (None: nothing)."""
        return None

    def settle_s(self, params: Mapping[str, float]) -> float:
        """Seconds to wait after a look before reading what must hold afterwards (/metrics)."""
        return 0.0

    def failure_budget(self, run: WeatherRun, events: tuple[InjectedEvent, ...]) -> int:
        """The most requests that may fail loudly: one per request an event may fail."""
        return len({e.request_id for e in events if e.may_fail and e.request_id})

    def accounted_checks(self, params: Mapping[str, float]) -> dict[str, str]:
        """Transfer checks this weather accounts for per request: name -> why."""
        return {}


__all__ = ["Disturbance", "SeriesQuestion", "Sustain", "Weather", "WeatherRun", "Workload"]
