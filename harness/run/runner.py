"""Run a list of cells: the only module that walks the whole flow
Cell → Deployment → Endpoint → EvalRun → Comparison → Verdict → Record.

Servers are shared: one baseline per `baseline_key` (its EvalRun is reused by every cell of the
group), one P/D pair per `pair_key` (cells that differ only in a proxy-side fault reuse it). The
next pair of a group is launched while the current one is being evaluated, and on CPU the next
group's baseline and first pair while the group's last pair is (harness.run.plan.groups_ahead).
"""
from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.judge.verdict import Policy, Verdict, error, fail
from harness.run.evaluation.aa_rerun import AAReruns, BaselineGate
from harness.run.evaluation.baseline_rounds import BaselineRounds
from harness.run.evaluation.cell_eval import CellEvaluator
from harness.run.evidence.effective_config_evidence import record_judged
from harness.run.plan.group_plan import GroupPlan, GroupPlanner
from harness.run.plan.groups_ahead import GroupsAhead, first_group
from harness.run.record import CellResult, Recorder, write_record
from harness.run.evaluation.stages import BaselineRound, EndpointAsker
from harness.serve.deploy import DeployContext, Deployment, Endpoint, Placement, ProxyDeployment
from harness.serve.host.ports import PortAllocator
from harness.serve.host.start_slots import StartSlots
from harness.serve.launch.server_spec import Features
from harness.serve.proxy.hops import PROXY_FAULTS
from harness.serve.supervision.process import ManagedProcessError
from harness.serve.template.client import stop_templates

__all__ = ["BaselineRound", "CellResult", "Runner", "new_run_id"]

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass
class _Turn:
    """One group's turn: its plan, and the times and shared state of its servers."""

    plan: GroupPlan
    started: float                   # time.monotonic() when its servers began to be planned
    # time.monotonic() when its turn came (the previous group done): its own wall time counts
    # from here, its servers may have been started ahead of it (`started`)
    began: float = field(default_factory=time.monotonic)
    waited: dict[str, float] = field(default_factory=dict)   # start-up the flow blocked on, once
    gate: BaselineGate = field(default_factory=BaselineGate)  # the baseline's requests, one at a time


class _GroupAborted(Exception):
    """The group's baseline failed: `results` holds the ERROR record of every cell."""

    def __init__(self, results: list[CellResult]) -> None:
        super().__init__(f"{len(results)} cell(s) aborted")
        self.results = results


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


# ---- the run --------------------------------------------------------------------------------
class Runner:
    def __init__(self, options: RunOptions, policy: Policy, *, features: Features | None = None,
                 placement: Placement | None = None, run_id: str | None = None,
                 progress: Progress | None = None, hybrid_models: Sequence[str] = ()) -> None:
        self.options = options
        self.policy = policy
        self.run_id = run_id or new_run_id()
        self.progress = progress or (lambda msg: log.info(msg))
        self.results_root = Path(options.results_dir)
        self.run_dir = self.results_root / self.run_id
        self.log_dir = self.run_dir / "logs"
        self.deploy = DeployContext(
            allocator=PortAllocator(), placement=placement or Placement.detect(options.gpu_layout),
            log_dir=self.log_dir, features=features or Features(),
            startup_timeout_s=options.startup_timeout_s, kv_cache_bytes=options.kv_cache_bytes,
            start_slots=StartSlots.from_limit(options.max_starting),
            server_start=options.server_start, kv_digest=options.kv_digest)
        self.allocator = self.deploy.allocator
        self.peak_rss_bytes = 0
        self.planner = GroupPlanner(options, self.deploy, frozenset(hybrid_models))
        self.recorder = Recorder(options, asdict(policy), self.run_id, self.results_root,
                                 self.progress)
        self.ask = EndpointAsker(options)
        self.baseline_rounds = BaselineRounds(options, self.ask, self.results_root, self.run_id,
                                              self.progress)
        self.cells = CellEvaluator(policy, self.deploy, self.results_root, self.ask,
                                   self.recorder, self.progress)
        self.ahead = GroupsAhead(self.planner, self.progress)   # started during a last pair

    def record(self, cell: Cell, verdict: Verdict, **parts: Any) -> CellResult:
        """`cell`'s record, `verdict` judged as declared and as ran (record_judged)."""
        return record_judged(self.recorder, cell, verdict, **parts)

    # -- running servers for a caller's own requests (the pytest plugin's fixtures) --------------
    @contextmanager
    def running_baseline(self, cell: Cell) -> Iterator[Endpoint]:
        """`cell`'s non-disaggregated server, healthy; stopped on exit."""
        with self.planner.baseline(self.planner.plan([cell])) as baseline:
            yield baseline.baseline_endpoint()

    @contextmanager
    def running_pair(self, cell: Cell) -> Iterator[Endpoint]:
        """`cell`'s P/D pair behind the harness's proxy (its proxy-side fault applied):
        `.base_url` is the proxy, `.metrics_urls` the decode servers', `.proxy_records` the
        per-request transfer records. Everything is stopped on exit."""
        proxy_fault = cell.fault if cell.fault in PROXY_FAULTS else None
        records = self.run_dir / cell.cell_id / "proxy-records.jsonl"
        with self.planner.pair(self.planner.plan([cell]), 0, arm_faults=False) as pair:
            port = self.allocator.reserve(1, owner=f"proxy:{cell.cell_id}")[0]
            with ProxyDeployment(pair, port=port, log_dir=self.log_dir, fault=proxy_fault,
                                 records_path=records, allocator=self.allocator) as proxy:
                yield proxy.endpoint()

    def run(self, cells: Sequence[Cell], *, then: Sequence[Cell] = ()) -> list[CellResult]:
        """Run every cell; never raises for a cell's failure (it becomes its verdict). `then`:
        the cells the caller will run next (a hint): on CPU their group's servers start during
        this run's last pair, and the next run() takes them (close() stops what is not taken)."""
        groups: dict[str, list[Cell]] = {}
        for cell in cells:
            groups.setdefault(cell.baseline_key, []).append(cell)
        # each group's successor: the next one here, after the last the caller's next group
        upcoming = [*groups.values(), first_group([c for c in then if c.baseline_key not in groups])]
        results: list[CellResult] = []
        try:
            for i, group in enumerate(groups.values()):
                results += self._run_group(group, upcoming[i + 1])
        except BaseException:
            self.ahead.close()
            raise
        return results

    def close(self) -> None:
        """Stop the servers of a group started ahead that no run() took, and the server
        templates this run's servers forked from (harness.serve.template.client)."""
        self.ahead.close()
        stop_templates(self.log_dir)

    def _run_group(self, cells: list[Cell], next_cells: Sequence[Cell] = ()) -> list[CellResult]:
        """The group's servers (maybe started ahead), its baseline rounds, then its pairs."""
        planned = time.monotonic()
        plan = self.planner.plan(cells)
        launched: list[Deployment] = []
        turn = _Turn(plan, started=planned)
        aa_reruns = AAReruns(turn.gate)
        try:
            servers = self.ahead.servers_for(plan, planned, launched)
            turn.started = servers.launched_at   # started ahead: its start-up counts from then
            self._wait_for_baseline(turn, servers.baseline)
            rounds = self._evaluate_baseline(turn, servers.baseline, aa_reruns)
            results = self._run_pairs(turn, servers.baseline, rounds, servers.first_pair,
                                      launched, next_cells)
        except _GroupAborted as aborted:
            return aborted.results
        finally:
            for d in launched:
                d.stop()
            aa_reruns.close()   # after the baseline stopped: a re-run still asking it ends
        group_total = time.monotonic() - turn.began
        for r in results:   # known once the group is done: the records are written again
            r.record["timings"]["group_total_s"] = group_total
            write_record(self.results_root, r.record)
        return results

    def _wait_for_baseline(self, turn: _Turn, baseline: Deployment) -> None:
        """Wait for the baseline; a baseline that cannot start is every cell's ERROR."""
        waiting = time.monotonic()
        try:
            baseline.wait()
        except ManagedProcessError as exc:
            reason = f"baseline failed to start: {exc}"
            waited = {"startup_s": time.monotonic() - turn.started}  # what the attempt cost
            raise _GroupAborted([self.record(c, error(reason, c.expected_failure), timings=waited,
                                              artifacts={"logs": baseline.logs()})
                                 for c in turn.plan.cells]) from exc
        turn.waited["baseline"] = time.monotonic() - waiting

    def _evaluate_baseline(self, turn: _Turn, baseline: Deployment,
                           aa_reruns: AAReruns) -> list[BaselineRound]:
        """Every repeat's baseline round (harness.run.evaluation.baseline_rounds); a baseline that
        fails to answer is every cell's ERROR."""
        try:
            return self.baseline_rounds.evaluate(turn.plan, baseline.baseline_endpoint(),
                                                 turn.gate, aa_reruns)
        except Exception as exc:  # noqa: BLE001 - any failure of the baseline is environmental
            reason = f"baseline evaluation failed: {type(exc).__name__}: {exc}"
            raise _GroupAborted([self.record(c, error(reason, c.expected_failure),
                                              artifacts={"logs": baseline.logs()})
                                 for c in turn.plan.cells]) from exc

    def _launch_pair(self, turn: _Turn, index: int,
                     launched: list[Deployment]) -> Deployment | None:
        """Plan and launch the turn's pair number `index`; None past the last pair."""
        if index >= len(turn.plan.pairs):
            return None
        pair = self.planner.pair(turn.plan, index)
        launched.append(pair)
        pair.launch()
        return pair

    def _run_pairs(self, turn: _Turn, baseline: Deployment, rounds: list[BaselineRound],
                   first_pair: Deployment, launched: list[Deployment],
                   next_cells: Sequence[Cell] = ()) -> list[CellResult]:
        """Each pair in turn: wait for it, launch the next one (after the last: the next
        turn's servers), run its cells on every round."""
        base_samples = rounds[0].samples_path
        # the first run's: each A/A re-run's time is in its cell's timings (it overlaps the pair)
        baseline_eval_s = sum(b.run.wall_s for b in rounds) / self.options.repeats
        results: list[CellResult] = []
        pair: Deployment | None = first_pair
        for i, cells_of_pair in enumerate(turn.plan.pairs):
            assert pair is not None   # _launch_pair gave one for every index below len(pairs)
            waiting = time.monotonic()
            try:
                pair.wait()
            except ManagedProcessError as exc:
                pair.stop()
                for c in cells_of_pair:
                    results.append(self.record(
                        c, fail(f"P/D pair failed to start while the baseline ran: {exc}",
                                c.expected_failure, check="pd-startup"),
                        timings={"startup_s": time.monotonic() - turn.started},
                        artifacts={"logs": pair.logs(), "baseline_samples": str(base_samples)}))
                pair = self._launch_pair(turn, i + 1, launched)
                continue
            # blocked on servers: the baseline's start-up (the first pair's cells) + this pair's
            pair_wait = time.monotonic() - waiting + (turn.waited.pop("baseline", 0.0))
            self.peak_rss_bytes = max(self.peak_rss_bytes, baseline.rss_bytes() + pair.rss_bytes())
            following = self._launch_pair(turn, i + 1, launched)  # starts while this one is evaluated
            if following is None:
                self.ahead.start(next_cells, baseline.rss_bytes() + pair.rss_bytes())
            for cell in cells_of_pair:
                for rnd in rounds:
                    results.append(self.cells.evaluate(
                        cell, pair, rnd, turn.plan,
                        timings={"startup_s": max(baseline.startup_s or 0, pair.startup_s or 0),
                                 "startup_wait_s": pair_wait, "baseline_eval_s": baseline_eval_s},
                        baseline_logs=baseline.logs()))
                    pair_wait = 0.0   # the wait is the first cell's; the others found servers up
            pair.stop()
            pair = following
        return results
