"""How the CPU was used while a run ran: the host's run queue, system and steal time, and which
threads of the run's own processes were runnable.

A `CpuLoadSampler` reads ``/proc`` every ``interval_s`` in a daemon thread:

* host-wide: ``procs_running`` of ``/proc/stat`` (threads runnable right now, less the sampler,
  which is always running while it reads) and the CPU time split (user, system, steal, idle) between the first and last sample;
* per process of the run (the root process and its descendants): how many of its threads were in
  state R (the sampler's own thread left out), by thread name (``comm``), its CPU seconds and context switches;
* the run queue again over the samples taken while a P/D proxy was up (``during_pd``): a P/D
  pair is evaluated then, its baseline beside it, while start-up and teardown are not; and
  that run queue less the runnable threads of servers whose autogroup yields (nice > 0: a
  server started ahead that nobody waits for yet, harness.serve.supervision.autogroup), which
  run only on what the others leave idle and so do not fight for the cores. A server's processes
  (API server, engine core, worker) are named after the log their stdout goes to (``decode-0``),
  because a forked server keeps its template's command line.

Per-thread states and CPU seconds depend little on what else runs on the host; wall time does.
"""
from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.serve.supervision.autogroup import autogroup_nice

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROXY_LABEL = "proxy"       # the P/D proxy's log is proxy-<port>.log
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_proc_stat(text: str) -> tuple[dict[str, int], int]:
    """(the aggregate `cpu` line's times in ticks, procs_running) of a /proc/stat text."""
    times: dict[str, int] = {}
    running = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            times = dict(zip(CPU_FIELDS, map(int, line.split()[1:1 + len(CPU_FIELDS)])))
        elif line.startswith("procs_running"):
            running = int(line.split()[1])
    return times, running


def cpu_shares(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Each CPU time field's share of the time between two parse_proc_stat readings."""
    spent = {k: after.get(k, 0) - before.get(k, 0) for k in CPU_FIELDS}
    total = sum(spent.values())
    if total <= 0:
        return {}
    busy = total - spent["idle"] - spent["iowait"]
    return {"user": (spent["user"] + spent["nice"]) / total, "system": spent["system"] / total,
            "irq": (spent["irq"] + spent["softirq"]) / total, "steal": spent["steal"] / total,
            "idle": (spent["idle"] + spent["iowait"]) / total, "busy": busy / total}


def parse_task_stat(text: str) -> tuple[str, str, int, int]:
    """(comm, state, utime+stime ticks, ppid) of a /proc/PID[/task/TID]/stat line."""
    head, _, tail = text.rpartition(")")
    comm = head.partition("(")[2]
    fields = tail.split()
    return comm, fields[0], int(fields[11]) + int(fields[12]), int(fields[1])


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def process_label(pid: int) -> str:
    """The log file stem a process writes its stdout to (a server's name), else its comm."""
    try:
        target = os.readlink(PROC / str(pid) / "fd" / "1")
    except OSError:
        target = ""
    name = os.path.basename(target)
    if name.endswith(".log"):
        return name[:-len(".log")]
    stat = _read(PROC / str(pid) / "stat")
    return parse_task_stat(stat)[0] if stat else str(pid)


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches summed over the threads of `pid`."""
    vol = invol = 0
    try:
        tids = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return 0, 0
    for tid in tids:
        for line in (_read(PROC / str(pid) / "task" / tid / "status") or "").splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol += int(line.split()[1])
    return vol, invol


@dataclass
class ProcessLoad:
    """What one process of the run did across the samples that saw it."""

    label: str
    comm: str
    samples: int = 0
    runnable: int = 0                      # runnable threads summed over samples
    peak_runnable: int = 0
    threads_peak: int = 0
    runnable_by_thread: Counter = field(default_factory=Counter)   # comm -> samples in state R
    first_ticks: int | None = None
    last_ticks: int = 0
    switches: tuple[int, int] = (0, 0)
    autogroup_nice: int = 0
    yielding_runnable: int = 0             # runnable threads summed over samples while nice > 0

    def summary(self, total_samples: int) -> dict[str, Any]:
        return {"process": self.label, "comm": self.comm, "samples": self.samples,
                "runnable_mean": self.runnable / total_samples if total_samples else 0.0,
                "runnable_peak": self.peak_runnable, "threads_peak": self.threads_peak,
                "cpu_s": (self.last_ticks - (self.first_ticks or 0)) / CLOCK_TICKS,
                "yielding_runnable_mean": (self.yielding_runnable / total_samples
                                           if total_samples else 0.0),
                "voluntary_switches": self.switches[0],
                "involuntary_switches": self.switches[1],
                "runnable_threads": {name: n / total_samples
                                     for name, n in self.runnable_by_thread.most_common(8)}}


def spread(name: str, values: list[int]) -> dict[str, float | int | None]:
    """`name`_mean, _p95 and _max of `values` (None when there are none)."""
    ordered = sorted(values)
    n = len(ordered)
    return {f"{name}_mean": sum(ordered) / n if n else None,
            f"{name}_p95": ordered[min(n - 1, int(0.95 * n))] if n else None,
            f"{name}_max": ordered[-1] if n else None}


class CpuLoadSampler:
    """Samples /proc every `interval_s` from start() to stop(); summary() gives the numbers."""

    def __init__(self, root_pid: int | None = None, interval_s: float = 0.1) -> None:
        self.root_pid = root_pid or os.getpid()
        self.interval_s = interval_s
        self.samples = 0
        self.running: list[int] = []        # procs_running per sample
        self.running_pd: list[int] = []     # procs_running per sample taken while a proxy was up
        self.runnable_pd: list[int] = []    # the run's runnable threads, same samples
        self.contending_pd: list[int] = []  # procs_running less the yielding servers' threads
        self.processes: dict[int, ProcessLoad] = {}
        self._stat_first: dict[str, int] = {}
        self._stat_last: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-load-sampler", daemon=True)
        self._started = 0.0
        self._own_tid: int | None = None    # the sampler's thread: runnable only because it samples
        self.wall_s = 0.0

    def start(self) -> "CpuLoadSampler":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self.wall_s = time.monotonic() - self._started
        return self.summary()

    def __enter__(self) -> "CpuLoadSampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = defaultdict(list)
        for entry in os.listdir(PROC):
            if entry.isdigit():
                stat = _read(PROC / entry / "stat")
                if stat:
                    children[parse_task_stat(stat)[3]].append(int(entry))
        found, todo = [], [self.root_pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, ()))
        return found

    def sample(self) -> None:
        """One reading of the host and of every process of the run."""
        text = _read(PROC / "stat")
        if text:
            times, running = parse_proc_stat(text)
            running = max(0, running - 1)      # the reader itself, running while it reads
            self._stat_first = self._stat_first or times
            self._stat_last = times
            self.running.append(running)
        self.samples += 1
        runnable = yielding = 0
        proxy_up = False
        for pid in self._descendants():
            sampled = self._sample_process(pid)
            if sampled is not None:
                load, now = sampled
                runnable += now
                yielding += now if load.autogroup_nice > 0 else 0
                proxy_up = proxy_up or load.label.startswith(PROXY_LABEL)
        if proxy_up and text:
            self.running_pd.append(running)
            self.runnable_pd.append(runnable)
            self.contending_pd.append(max(0, running - yielding))

    def _sample_process(self, pid: int) -> tuple[ProcessLoad, int] | None:
        """(`pid`'s load with this sample in it, its runnable threads now); None when it is gone."""
        task_dir = PROC / str(pid) / "task"
        try:
            tids = os.listdir(task_dir)
        except OSError:
            return None
        load = self.processes.get(pid)
        if load is None:
            stat = _read(PROC / str(pid) / "stat")
            if not stat:
                return None
            load = self.processes[pid] = ProcessLoad(process_label(pid), parse_task_stat(stat)[0])
        runnable = 0
        for tid in tids:
            if self._own_tid is not None and tid == str(self._own_tid):
                continue
            stat = _read(task_dir / tid / "stat")
            if stat:
                comm, state, _, _ = parse_task_stat(stat)
                if state == "R":
                    runnable += 1
                    load.runnable_by_thread[comm] += 1
        stat = _read(PROC / str(pid) / "stat")
        if stat:
            ticks = parse_task_stat(stat)[2]
            load.first_ticks = ticks if load.first_ticks is None else load.first_ticks
            load.last_ticks = ticks
        if self.samples % 10 == 1:      # every 10th sample: a full /proc/PID/task walk
            load.switches = context_switches(pid)
            # a server forked from the template points fd 1 at its own log only after the fork
            load.label = process_label(pid)
        load.autogroup_nice = autogroup_nice(pid) or 0   # a waited-for server's changes at once
        load.samples += 1
        load.runnable += runnable
        load.yielding_runnable += runnable if load.autogroup_nice > 0 else 0
        load.peak_runnable = max(load.peak_runnable, runnable)
        load.threads_peak = max(load.threads_peak, len(tids))
        return load, runnable

    def _loop(self) -> None:
        self._own_tid = threading.get_native_id()
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def summary(self) -> dict[str, Any]:
        """Host run queue and CPU split, and per process its runnable threads and CPU seconds."""
        procs = sorted((p.summary(self.samples) for p in self.processes.values()),
                       key=lambda s: (s["process"], s["comm"]))
        during_pd = {**spread("run_queue", self.running_pd),
                     **spread("run_runnable", self.runnable_pd),
                     **spread("contending_run_queue", self.contending_pd),
                     "samples": len(self.running_pd)}
        return {"interval_s": self.interval_s, "samples": self.samples, "wall_s": self.wall_s,
                "cores": os.cpu_count(), **spread("run_queue", self.running),
                "during_pd": during_pd,
                "cpu_shares": cpu_shares(self._stat_first, self._stat_last),
                "run_runnable_mean": sum(p["runnable_mean"] for p in procs),
                "run_cpu_s": sum(p["cpu_s"] for p in procs),
                "processes": procs}


__all__ = ["CpuLoadSampler", "cpu_shares", "parse_proc_stat", "parse_task_stat"]
