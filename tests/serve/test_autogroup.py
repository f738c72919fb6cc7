"""A yielding server's autogroup, on real processes and the kernel's scheduler: at nice 19 a
busy session gets almost none of a core another busy session wants; at nice 0 again, its half."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

import pytest

from harness.run.evidence.cpu_load import CpuLoadSampler
from harness.serve.supervision import autogroup

needs_autogroups = pytest.mark.skipif(not autogroup.enabled(),
                                reason="no autogroups in force here (kernel or CPU cgroup)")

SPIN = "import os; os.sched_setaffinity(0, {0}); exec('while True: pass')"


@contextlib.contextmanager
def spinners(*stdouts) -> Iterator[list[subprocess.Popen]]:
    """Busy processes on core 0 (one per `stdouts` entry, None: inherited), each in a session
    (so an autogroup) of its own; killed on the way out."""
    procs: list[subprocess.Popen] = []
    try:
        for out in stdouts:
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True,
                                          stdout=out))
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shares(a: subprocess.Popen, b: subprocess.Popen, seconds: float = 1.0,
           attempts: int = 5) -> tuple[float, float]:
    """CPU seconds `a` and `b` got over `seconds`. A window in which the two together got under a
    fifth of it says nothing about their shares (core 0 went to something else: in CI, another
    worker's servers; seen as (0.0, 0.0)): it is measured again, up to `attempts` windows."""
    for _ in range(attempts):
        before = cpu_s(a.pid), cpu_s(b.pid)
        time.sleep(seconds)
        got = cpu_s(a.pid) - before[0], cpu_s(b.pid) - before[1]
        if sum(got) >= 0.2 * seconds:
            break
    return got


@needs_autogroups
def test_a_yielding_session_runs_only_on_what_the_other_leaves():
    with spinners(None, None) as (starting, serving):
        time.sleep(0.3)
        assert autogroup.set_autogroup_nice(starting.pid, autogroup.YIELD_NICE)
        assert autogroup.autogroup_nice(starting.pid) == autogroup.YIELD_NICE
        assert autogroup.autogroup_nice(serving.pid) == 0
        yielded, served = shares(starting, serving)
        assert yielded < 0.1 * served, (yielded, served)     # weight 15 against 1024
        assert autogroup.set_autogroup_nice(starting.pid, 0)   # no privilege needed for 0
        time.sleep(0.2)
        equal_a, equal_b = shares(starting, serving)
        assert equal_a > 0.5 * equal_b, (equal_a, equal_b)


@needs_autogroups
def test_claiming_sets_yielding_servers_back_and_says_whether_any_yielded():
    with spinners(None, None) as (a, b):
        assert not autogroup.claim([a.pid, b.pid, None])   # nothing yielded: deadline unchanged
        assert autogroup.set_autogroup_nice(a.pid, autogroup.YIELD_NICE)
        assert autogroup.claim([a.pid, b.pid])
        assert autogroup.autogroup_nice(a.pid) == 0
        assert not autogroup.claim([a.pid, b.pid])


def test_autogroups_are_in_force_only_in_the_root_cpu_cgroup():
    assert autogroup.in_root_cpu_group("4:memory:/x\n1:cpu:/\n0::/\n")
    assert autogroup.in_root_cpu_group("2:cpu,cpuacct:/\n0::/\n")
    assert not autogroup.in_root_cpu_group("2:cpu,cpuacct:/docker/abc\n0::/\n")
    assert autogroup.in_root_cpu_group("0::/\n")                          # v2 only
    assert not autogroup.in_root_cpu_group("0::/user.slice/session-1.scope\n")


@needs_autogroups
def test_a_process_in_the_callers_session_is_left_alone():
    own = autogroup.autogroup_nice(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert not autogroup.set_autogroup_nice(child.pid, autogroup.YIELD_NICE,
                                                session_wait_s=0.05)
        assert autogroup.autogroup_nice(os.getpid()) == own
    finally:
        child.kill()
        child.wait()


@needs_autogroups
def test_the_sampler_takes_yielding_threads_out_of_the_contending_run_queue(tmp_path):
    with open(tmp_path / "proxy-1.log", "w") as log, \
            spinners(None, log) as (starting, _):   # a "proxy" up: the P/D window's samples
        assert autogroup.set_autogroup_nice(starting.pid, autogroup.YIELD_NICE)
        with CpuLoadSampler(interval_s=0.02) as sampler:
            time.sleep(0.6)
    pd = sampler.summary()["during_pd"]
    assert pd["samples"] >= 5
    # the starved spinner is runnable all along, and only its thread is taken out
    assert 0.5 < pd["run_queue_mean"] - pd["contending_run_queue_mean"] <= 1.0 + 1e-9, pd
    yielding = [p for p in sampler.processes.values() if p.autogroup_nice == autogroup.YIELD_NICE]
    assert len(yielding) == 1 and yielding[0].yielding_runnable > 0
