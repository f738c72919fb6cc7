"""A CPU server that nobody waits for yet yields its cores: its session's autogroup runs at nice
19 from launch until the harness waits for it, then at nice 0 again.

Why: on CPU the runner starts the next P/D pair, and the next group's baseline and first pair,
while the current pair is evaluated (harness.run.plan.groups_ahead). Those start-ups had minutes of
slack, yet at equal priority their threads took the cores from the evaluation and from the
baseline's A/A re-run that every look waits for (docs/startup.md). At nice 19 they
run on what the evaluation leaves idle; once waited for they are what the run waits on.

Why the autogroup and not each thread's nice: every server is its own session (``setsid``), and
Linux schedules a session's threads as one group (``/proc/sys/kernel/sched_autogroup_enabled``).
One write to ``/proc/PID/autogroup`` sets every present and future thread and child process of
the server, and setting it back to 0 needs no privilege (only a nice below 0 does; sched(7)).
Where the kernel has no autogroups the servers start as before.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

YIELD_NICE = 19
SWITCH_ENV = "PD_ACCURACY_YIELD_STARTUPS"     # "0": start-ups keep nice 0 (the A/B's other side)
PROC = Path("/proc")
# an unprivileged writer may change an autogroup's nice once per 100 ms (kernel/sched/autogroup.c)
RATE_LIMIT_RETRIES = 20
# a forked server calls setsid() right after fork; until then its autogroup is the template's
SESSION_WAIT_S = 2.0


def in_root_cpu_group(cgroup_text: str) -> bool:
    """Whether a /proc/PID/cgroup text puts the process in the root CPU cgroup: the kernel
    schedules by autogroup only there (a container's or a systemd slice's CPU group bypasses it;
    one behind a private cgroup namespace also reads "/" and cannot be told apart)."""
    cpu_paths = [line.split(":", 2)[2] for line in cgroup_text.splitlines()
                 if line.count(":") >= 2 and "cpu" in line.split(":", 2)[1].split(",")]
    if cpu_paths:                       # cgroup v1: the cpu controller's hierarchy
        return all(path == "/" for path in cpu_paths)
    return all(line.split(":", 2)[2] == "/" for line in cgroup_text.splitlines()
               if line.startswith("0::"))


def enabled() -> bool:
    """Whether start-ups yield on this host: autogroups on and in force for this process's
    servers, and not switched off."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    try:
        return ((PROC / "sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
                and in_root_cpu_group((PROC / "self/cgroup").read_text()))
    except OSError:
        return False


def autogroup_nice(pid: int) -> int | None:
    """The nice of `pid`'s autogroup ("/autogroup-25 nice 19"), None if it cannot be read."""
    try:
        return int((PROC / str(pid) / "autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _own_session(pid: int, wait_s: float) -> bool:
    """Whether `pid` leads its own session (within `wait_s`): only then is its autogroup its own."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if os.getsid(pid) == pid:
                return True
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def set_autogroup_nice(pid: int, nice: int, session_wait_s: float = SESSION_WAIT_S) -> bool:
    """Set the nice of `pid`'s own session's autogroup; False where that is not possible (no
    autogroups, `pid` gone or not a session leader)."""
    if not _own_session(pid, session_wait_s):
        return False
    for _ in range(RATE_LIMIT_RETRIES):
        try:
            (PROC / str(pid) / "autogroup").write_text(str(nice))
            return True
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                return False
            time.sleep(0.1)
    return False


def claim(pids: list[int | None]) -> bool:
    """Set every yielding process of `pids` back to nice 0; whether any was yielding."""
    claimed = False
    for pid in pids:
        if pid is not None and autogroup_nice(pid):
            claimed = set_autogroup_nice(pid, 0) or claimed
    return claimed


__all__ = ["SWITCH_ENV", "YIELD_NICE", "autogroup_nice", "claim", "enabled",
           "set_autogroup_nice"]
