"""The CPU load sampler's /proc parsing and its summary, on this process and on fixed texts."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from harness.run.evidence.cpu_load import (CpuLoadSampler, cpu_shares, parse_proc_stat,
                                           parse_task_stat)

STAT = """cpu  100 0 50 800 10 0 0 40 0 0
cpu0 50 0 25 400 5 0 0 20 0 0
intr 1 2 3
procs_running 7
procs_blocked 0
"""


def test_proc_stat_run_queue_and_times():
    times, running = parse_proc_stat(STAT)
    assert running == 7
    assert (times["user"], times["system"], times["idle"], times["steal"]) == (100, 50, 800, 40)


def test_cpu_shares_between_two_readings():
    before, _ = parse_proc_stat(STAT)
    after = {**before, "user": before["user"] + 50, "system": before["system"] + 30,
             "steal": before["steal"] + 10, "idle": before["idle"] + 10}
    shares = cpu_shares(before, after)
    assert shares["system"] == 0.3 and shares["steal"] == 0.1 and shares["busy"] == 0.9
    assert cpu_shares(before, before) == {}


def test_task_stat_with_spaces_and_parens_in_comm():
    line = "4242 (VLLM::Eng (1)) R 4200 4200 4200 0 -1 4194304 0 0 0 0 120 30 0 0 20 0 9 0"
    assert parse_task_stat(line) == ("VLLM::Eng (1)", "R", 150, 4200)


def test_sampler_sees_a_spinning_child_process():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with CpuLoadSampler(interval_s=0.02) as sampler:
            time.sleep(0.6)
    finally:
        spinner.kill()
        spinner.wait()
    summary = sampler.summary()
    child = [p for p in summary["processes"] if p["samples"] and p["cpu_s"] > 0.05
             and p["runnable_peak"] >= 1]
    assert child and summary["samples"] >= 3
    assert summary["run_queue_max"] >= 1 and summary["cores"] == os.cpu_count()


def test_spread_and_the_pd_window():
    from harness.run.evidence.cpu_load import spread

    assert spread("q", [3, 1, 2]) == {"q_mean": 2.0, "q_p95": 3, "q_max": 3}
    assert spread("q", []) == {"q_mean": None, "q_p95": None, "q_max": None}
    with CpuLoadSampler(interval_s=0.02) as sampler:
        time.sleep(0.1)
    assert sampler.summary()["during_pd"]["samples"] == 0      # no proxy in this process tree


def test_the_sampler_does_not_count_itself():
    # the sampler's thread is in state R whenever it reads /proc; a sleeping process is not busy
    sampler = CpuLoadSampler(interval_s=0.01).start()
    time.sleep(0.3)
    summary = sampler.stop()
    assert summary["samples"] >= 5
    assert summary["run_runnable_mean"] < 0.5
