"""`pd-accuracy bench`'s arithmetic on readings (no run)."""
from __future__ import annotations

from collections import namedtuple

import pytest

from harness.cli.bench import busy_share

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def times(user=0.0, system=0.0, idle=0.0, iowait=0.0, steal=0.0) -> Times:
    return Times(user, 0.0, system, idle, iowait, 0.0, 0.0, steal, 0.0, 0.0)


def test_busy_share_counts_idle_and_iowait_as_idle():
    before = times(user=100, system=10, idle=50, iowait=5)
    after = times(user=160, system=20, idle=70, iowait=15)     # 70 busy, 30 idle
    assert busy_share(before, after) == pytest.approx(0.7)


def test_stolen_time_is_not_idle():
    assert busy_share(times(), times(user=50, steal=25, idle=25)) == pytest.approx(0.75)


def test_no_time_passed_says_nothing():
    assert busy_share(times(user=1), times(user=1)) is None


def test_cpu_load_is_printed(capsys):
    import time as _time

    from harness.cli.bench import print_cpu_load
    from harness.run.cpu_load import CpuLoadSampler
    from rich.console import Console

    with CpuLoadSampler(interval_s=0.02) as sampler:
        _time.sleep(0.1)
    print_cpu_load(Console(width=200), sampler.summary())
    out = capsys.readouterr().out
    assert "run queue (procs_running): mean" in out and "steal" in out and "system" in out
