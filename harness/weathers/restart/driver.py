"""restart: the prefill, then the decode, killed (SIGKILL to the server's process group, the
harness's own supervision: harness.serve.deploy.Deployment.kill) and started again on the same
ports mid-run (vllm #49238, llm-d/llm-d #2187: after a prefill restart the decode segfaulted or
kept a stale connector agent). While a server restarts the proxy holds new requests (POST /pd/hold,
as a router draining it would); the requests in flight at the kill must fail loudly, every
later one must be answered with its own prefill's KV (the new prefill's: no stale agent).

Accounted: the transfer counters restart from 0 with a server, so the aggregate /metrics checks
are replaced by the per-request digests and statuses.
"""
from __future__ import annotations

import datetime as dt
import time
from typing import Callable, Mapping

from harness.core import exact_headers
from harness.core.cell import Cell
from harness.judge.weather import InjectedEvent, WeatherCondition
from harness.run.weather.base import Disturbance, Weather, WeatherRun, Workload
from harness.serve.deploy import Deployment

ROLES = ("prefill", "decode")
COUNTER_CHECKS = ("no-failed-transfers", "kv-arrived-externally", "decode-did-not-recompute",
                  "kv-bytes-exact")
POST_TIMEOUT_S = 10.0


def restart_roles(after_s: float) -> Callable[[Deployment, str, Callable[[str], None]], None]:
    """Each role in turn: `after_s` of traffic, hold new requests, kill, relaunch, release."""
    def act(pair: Deployment, proxy_url: str, note: Callable[[str], None]) -> None:
        for role in ROLES:
            time.sleep(after_s)
            exact_headers.post(f"{proxy_url}/pd/hold", timeout=POST_TIMEOUT_S)
            try:
                note(f"{role}:kill")
                pair.kill(role)
                pair.relaunch(role)
                note(f"{role}:healthy")
            finally:
                exact_headers.post(f"{proxy_url}/pd/release", timeout=POST_TIMEOUT_S)
    return act


def span(record: dict) -> tuple[float, float] | None:
    """When the proxy held `record`'s request: (start, end) in unix seconds."""
    try:
        start = dt.datetime.fromisoformat(record["started_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None
    return start, start + ((record.get("prefill_ms") or 0) + (record.get("decode_ms") or 0)) / 1e3


def moments(run: WeatherRun) -> dict[str, float]:
    return {what: at for what, at in run.timeline}


def answered(record: dict) -> bool:
    return record.get("decode_status") == 200 and not record.get("error")


class Restart(Weather):
    name = "restart"

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload(min_questions=int(params["min_questions"]))

    def disturbance(self, cell: Cell, params: Mapping[str, float]) -> Disturbance:
        return Disturbance(restart_roles(float(params["after_s"])))

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        at = moments(run)
        out = []
        for role in ROLES:
            kill, up = at.get(f"{role}:kill"), at.get(f"{role}:healthy", float("inf"))
            if kill is None:
                continue
            for record in run.proxy_records:
                when = span(record)
                if when and when[0] <= up and when[1] >= kill:
                    out.append(InjectedEvent(f"{role}-killed", record.get("request_id"),
                                             f"in flight when the {role} was killed"))
        return tuple(out)

    def accounted_checks(self, params: Mapping[str, float]) -> dict[str, str]:
        why = "a restarted server's counters start again from 0; each request's digest instead"
        return {name: why for name in COUNTER_CHECKS}

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        at = moments(run)
        errors = [what for what, _ in run.timeline if what.startswith("error")]
        out = [WeatherCondition("happened", "restarted", not errors and all(
            f"{r}:healthy" in at for r in ROLES), "; ".join(
            f"{what} at +{when - run.timeline[0][1]:.1f} s" for what, when in run.timeline)
            if run.timeline else "nothing was done")]
        events = self.events(run)
        hit = {e.kind for e in events}
        struck = {e.request_id for e in events}   # in flight at a (later) kill: accounted there
        for role in ROLES:
            up = at.get(f"{role}:healthy")
            later = [r for r in run.proxy_records if up and (span(r) or (0, 0))[0] > up
                     and r.get("request_id") not in struck]
            out.append(WeatherCondition(
                "happened", f"traffic[{role}]", f"{role}-killed" in hit and bool(later),
                f"requests in flight at the {role} kill: "
                f"{sum(e.kind == f'{role}-killed' for e in events)}; started after it was "
                f"healthy again (and not struck by a later kill): {len(later)}"))
            out.append(WeatherCondition(
                "holds", f"answered-after[{role}]", all(answered(r) for r in later),
                f"{sum(answered(r) for r in later)} of {len(later)} requests after the {role} "
                f"restart answered 200"))
        return tuple(out)


WEATHER = Restart()
