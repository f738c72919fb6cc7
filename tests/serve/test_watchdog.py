"""Nothing outlives a harness, however it dies: the watchdog process (SIGKILL of the harness at
any moment), the host ledger's sweep (the watchdog killed too), and what they may kill."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from harness.serve.host.liveness import process_create_time
from harness.serve.supervision import ledger as process_ledger
from harness.serve.supervision import registry as process_registry
from harness.serve.supervision import watchdog as watchdog_mod
from harness.serve.supervision.process import ManagedProcess, live_processes
from harness.serve.supervision.groups import TrackedGroup, terminate_groups
from harness.serve.supervision.ledger import ProcessLedger
from harness.serve.supervision.watchdog import Watchdog

REPO_ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

pytestmark = pytest.mark.skipif(not watchdog_mod.WATCHDOG_SUPPORTED, reason="POSIX only")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def kill_leftovers(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# A server that ignores SIGTERM (like vLLM in start-up) with a grandchild in its group, one that
# left the group (setsid), and one that left the group and then lost its parent (re-parented to
# init: no longer in the server's tree, found by the pid the watchdog saw). The parent lives a
# second, longer than the watchdog takes to look (0.2 s here, 1 s by default).
STUBBORN_SERVER = """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # inherited by the children through exec
    in_group = subprocess.Popen(["sleep", "300"])
    escaped = subprocess.Popen(["sleep", "300"], start_new_session=True)
    middle = subprocess.Popen([sys.executable, "-c",
        "import subprocess, time; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(1)"], stdout=subprocess.PIPE, text=True)
    orphan = int(middle.stdout.readline())
    middle.wait()
    print("TREE", os.getpid(), in_group.pid, escaped.pid, orphan, flush=True)
    time.sleep(300)
"""

HARNESS = """
    import json, os, sys, time
    from harness.serve.supervision import watchdog
    from harness.serve.supervision.process import ManagedProcess
    work, grace_s, fork_holder = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
    dog = watchdog.Watchdog(grace_s=grace_s, poll_s=0.2)
    watchdog.default_watchdog.replace(dog)
    dog.announcer()  # start it now and wait until it runs its loop (its imports are done): on a
    while "_psutil_linux" not in open(f"/proc/{dog.pid}/maps").read():  # loaded machine its
        time.sleep(0.02)                     # start-up can outlast the orphan's parent below
    servers = [ManagedProcess(f"server-{i}", [sys.executable, work + "/server.py"],
                              f"{work}/server-{i}.log").start() for i in range(2)]
    trees = []
    for server in servers:
        while "TREE" not in server.read_log():
            time.sleep(0.02)
        trees += [int(pid) for pid in server.read_log().split("TREE")[1].split()[:4]]
    holder = os.fork() if fork_holder else -1  # a forked child keeps a copy of the socket
    if holder == 0:
        time.sleep(300)
        os._exit(0)
    print(json.dumps({"tree": trees, "watchdog": dog.pid, "holder": holder}),
          flush=True)
    time.sleep(300)
"""


def start_harness(tmp_path: Path, grace_s: float = 0.5, fork_holder: bool = False,
                  new_session: bool = False) -> tuple[subprocess.Popen[str], dict]:
    (tmp_path / "server.py").write_text(textwrap.dedent(STUBBORN_SERVER))
    (tmp_path / "fake_harness.py").write_text(textwrap.dedent(HARNESS))
    # TMPDIR: the ledger (and port registry) of this harness lies in tmp_path
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path)}
    harness = subprocess.Popen(
        [PY, str(tmp_path / "fake_harness.py"), str(tmp_path), str(grace_s), "1" if fork_holder else "0"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "fake_harness.err", "w"), text=True, env=env,
        start_new_session=new_session)
    line = harness.stdout.readline()
    assert line, (tmp_path / "fake_harness.err").read_text()
    info = json.loads(line)
    assert len(info["tree"]) == 8 and not any(gone(pid) for pid in info["tree"])
    orphans = info["tree"][3::4]
    assert all(psutil.Process(pid).ppid() != info["tree"][0] and os.getsid(pid) == pid
               for pid in orphans)
    return harness, info


@pytest.mark.parametrize("fork_holder", [False, True], ids=["plain", "forked-child-holds-socket"])
def test_sigkilled_harness_leaves_no_process_of_any_server_tree(tmp_path, fork_holder):
    harness, info = start_harness(tmp_path, fork_holder=fork_holder)
    everything = info["tree"] + [info["watchdog"]]
    try:
        harness.kill()
        harness.wait(5)
        killed_at = time.monotonic()
        assert wait_until(lambda: all(gone(pid) for pid in everything), 8), \
            [pid for pid in everything if not gone(pid)]
        # SIGTERM is ignored by every one of them: the 0.5 s grace, then SIGKILL
        assert time.monotonic() - killed_at < 6
        report = (tmp_path / "fake_harness.err").read_text()
        assert "is gone" in report and "SIGKILL" in report and "all gone" in report
        if fork_holder:
            assert "re-parented" in report
    finally:
        kill_leftovers(everything + ([info["holder"]] if info["holder"] > 0 else []))


def test_watchdog_survives_a_kill_of_the_harness_process_group(tmp_path):
    # CI runners and terminals kill the whole group of the harness; the watchdog is not in it
    harness, info = start_harness(tmp_path, new_session=True)
    everything = info["tree"] + [info["watchdog"]]
    try:
        assert os.getsid(info["watchdog"]) == info["watchdog"] != os.getsid(harness.pid)
        os.killpg(harness.pid, signal.SIGKILL)
        harness.wait(5)
        assert wait_until(lambda: all(gone(pid) for pid in everything), 8)
    finally:
        kill_leftovers(everything)


def test_harness_that_exits_normally_takes_its_watchdog_along(tmp_path):
    script = tmp_path / "short.py"
    script.write_text(textwrap.dedent("""
        import sys
        from harness.serve.supervision import watchdog
        from harness.serve.supervision.process import ManagedProcess
        with ManagedProcess("quick", ["sleep", "300"], sys.argv[1] + "/quick.log"):
            print(watchdog.default_watchdog().pid, flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path)}
    done = subprocess.run([PY, str(script), str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    watchdog_pid = int(done.stdout)
    assert wait_until(lambda: gone(watchdog_pid), 3)
    assert "watchdog" not in done.stderr  # nothing was left for it to do, so it said nothing


def test_child_registers_itself_before_exec(tmp_path):
    # the harness dies after fork, before it could send the group: the child announced it
    script = tmp_path / "announce.py"
    script.write_text(textwrap.dedent("""
        import subprocess, time
        from harness.serve.supervision.spawn import child_preexec
        from harness.serve.supervision.watchdog import Watchdog
        dog = Watchdog(grace_s=0.3)
        child = subprocess.Popen(["sleep", "300"], start_new_session=True,
                                 preexec_fn=child_preexec(None, dog.announcer()))
        print(child.pid, dog.pid, flush=True)   # and never dog.watch(...)
        time.sleep(300)
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    harness = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    child, dog = map(int, harness.stdout.readline().split())
    try:
        time.sleep(0.3)
        assert not gone(child)
        harness.kill()
        harness.wait(5)
        assert wait_until(lambda: gone(child) and gone(dog), 5)
    finally:
        kill_leftovers([child, dog])


def test_a_dead_watchdog_is_replaced_with_every_group_sent_again(tmp_path):
    dog = Watchdog(grace_s=0.3, poll_s=0.1)
    first = subprocess.Popen(["sleep", "300"], start_new_session=True)
    second = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        dog.watch(first.pid, process_create_time(first.pid), "first")
        old = dog.pid
        os.kill(old, signal.SIGKILL)
        assert wait_until(lambda: gone(old), 3)
        dog.watch(second.pid, process_create_time(second.pid), "second")
        assert dog.pid not in (None, old)
        new = dog.pid
        dog.close(wait_s=5)  # EOF with both groups still registered: the new one stops both
        assert first.wait(5) == -signal.SIGTERM and second.wait(5) == -signal.SIGTERM
        assert gone(new)
    finally:
        kill_leftovers([first.pid, second.pid])
        first.wait(), second.wait()


def test_an_unwatched_group_is_left_alone(tmp_path):
    dog = Watchdog(grace_s=0.3)
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        dog.watch(child.pid, process_create_time(child.pid), "sleeper")
        dog.unwatch(child.pid)
        pid = dog.pid
        dog.close(wait_s=5)
        assert gone(pid)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_a_group_whose_pid_was_reused_is_not_ours():
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        created = process_create_time(stranger.pid)
        # the same PID, recorded with another create_time: our group is gone, the PID reused
        assert terminate_groups([TrackedGroup(stranger.pid, created - 100, "old")], 0.2) == set()
        assert stranger.poll() is None
        left = terminate_groups([TrackedGroup(stranger.pid, created, "ours")], 0.2)
        assert left == set() and stranger.wait(5) == -signal.SIGTERM
    finally:
        stranger.kill()
        stranger.wait()


# --- the ledger ------------------------------------------------------------------------------


def dead_pid_and_create_time() -> tuple[int, float]:
    # alive while its start is read ("true" may be gone first: a null start is not a ledger's)
    proc = subprocess.Popen(["sleep", "30"])
    created = process_create_time(proc.pid)
    proc.kill()
    proc.wait()
    assert created is not None
    return proc.pid, created


def test_sweep_stops_the_groups_of_dead_harnesses_only(tmp_path):
    ledger = ProcessLedger(tmp_path)
    ignoring = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    orphan = subprocess.Popen([PY, "-c", ignoring], start_new_session=True)
    mine = subprocess.Popen(["sleep", "300"], start_new_session=True)
    dead_owner, dead_created = dead_pid_and_create_time()
    try:
        time.sleep(0.3)  # the orphan has set its handler
        ledger.record("mine", mine.pid, process_create_time(mine.pid))
        entries = json.loads(ledger.path.read_text())["groups"]
        entries[str(orphan.pid)] = {**entries[str(mine.pid)], "name": "baseline", "pid": orphan.pid,
                                    "pgid": orphan.pid,
                                    "create_time": process_create_time(orphan.pid),
                                    "owner_pid": dead_owner, "owner_create_time": dead_created}
        entries["1"] = {**entries[str(orphan.pid)], "name": "long gone", "pid": 999999999,
                        "pgid": 999999999}
        ledger.path.write_text(json.dumps({"groups": entries}))
        swept = ledger.sweep(grace_s=0.3)
        assert [(o.name, o.pid, o.owner_pid) for o in swept] == [("baseline", orphan.pid, dead_owner)]
        assert orphan.wait(5) == -signal.SIGKILL  # it ignored SIGTERM
        assert mine.poll() is None, "a live harness's server is not an orphan"
        assert set(ledger.entries()) == {str(mine.pid)}
        assert ledger.sweep() == []
    finally:
        for proc in (orphan, mine):
            proc.kill()
            proc.wait()


def test_managed_process_is_in_the_ledger_while_it_runs(tmp_path):
    with process_ledger.default_ledger.replaced(ProcessLedger(tmp_path)) as ledger:
        proc = ManagedProcess("recorded", ["sleep", "300"], tmp_path / "r.log").start()
        try:
            entry = ledger.entries()[str(proc.pid)]
            assert entry["pid"] == entry["pgid"] == proc.pid and entry["name"] == "recorded"
            assert entry["create_time"] == pytest.approx(process_create_time(proc.pid), abs=1)
            assert entry["owner_pid"] == os.getpid()
            assert proc in live_processes()
        finally:
            proc.stop()
        assert ledger.entries() == {}


def test_ledger_failures_never_stop_a_server(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with process_ledger.default_ledger.replaced(ProcessLedger(blocker)):
        with ManagedProcess("unrecorded", ["sleep", "300"], tmp_path / "u.log") as proc:
            assert proc.is_running()
        assert process_registry.sweep_orphans() == []


def test_a_group_registered_again_with_another_create_time_replaces_the_old_one():
    state = watchdog_mod._Watch()
    state.apply("+ 4242 1000.0 baseline")
    state.groups[4242].seen[4243] = 1000.5
    state.apply("+ 4242 1000.2 baseline")  # within the create_time tolerance: the same group
    assert state.groups[4242].seen == {4243: 1000.5}
    state.apply("+ 4242 2000.0 decode-0 with spaces")  # the PID went to a new server
    assert state.groups[4242] == TrackedGroup(4242, 2000.0, "decode-0 with spaces")
    state.apply("garbage")
    state.apply("+ notanumber -")
    state.apply("- 4242")
    assert state.groups == {}
