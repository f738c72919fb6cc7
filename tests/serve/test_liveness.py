"""owner_alive: the one rule for whether a port reservation's or GPU lease's owner still holds it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from harness.serve.host.liveness import (
    CREATE_TIME_TOLERANCE_S,
    owner_alive,
    process_create_time,
    this_host,
)


def test_this_process_is_alive_with_its_own_create_time():
    me = os.getpid()
    started = process_create_time(me)
    # since boot: psutil's create_time less the boot time (as psutil read it, to the tick)
    assert abs(started - (psutil.Process(me).create_time() - psutil.boot_time())) < 0.02
    assert owner_alive(me, started, this_host())
    assert owner_alive(me, started + CREATE_TIME_TOLERANCE_S / 2, None)


def test_a_wall_clock_step_does_not_kill_a_live_owner(monkeypatch):
    """On 2026-12-03 a VM's clock moved 13 s after a harness recorded itself: psutil's
    create_time (boot time + ticks) then differed by 13 s in every other reader, which swept
    the live harness's servers. The start since boot does not move with the clock."""
    me = os.getpid()
    started = process_create_time(me)
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 13.0)
    assert process_create_time(me) == started
    assert owner_alive(me, started, this_host())


def test_a_record_of_an_older_harness_is_read_in_its_own_terms():
    me = os.getpid()
    epoch_started = psutil.Process(me).create_time()
    assert owner_alive(me, epoch_started, this_host())
    assert not owner_alive(me, epoch_started - 1000, this_host())


def test_reused_pid_is_not_the_owner():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = process_create_time(child.pid)
        assert owner_alive(child.pid, started, this_host())
        assert not owner_alive(child.pid, started - 1000, this_host())
    finally:
        child.kill()
        child.wait()


def test_no_recorded_create_time_trusts_the_pid():
    assert owner_alive(os.getpid(), None)
    assert owner_alive(os.getpid(), 0.0)


def test_exited_and_zombie_processes_are_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_create_time(child.pid)
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert process_create_time(child.pid) is None
    assert not owner_alive(child.pid, started)
    child.wait()
    assert not owner_alive(child.pid, started)
    assert not owner_alive(-1, None)


def test_another_hosts_owner_is_kept():
    assert owner_alive(2**22 + 12345, 1.0, this_host() + "-elsewhere")
