"""The host store on a shared machine: a per-user 0700 directory that another user's (or a
link) is refused, and ledger / port / namespace entries that are validated before anything acts
on them (a forged entry is skipped with a warning; it never kills, never breaks a start)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import psutil
import pytest

from harness.serve.host.liveness import process_create_time
from harness.serve.host.ports import PortAllocator
from harness.serve.host.store import HostStateError, owned_dir
from harness.serve.net.netns import TopologyLedger
from harness.serve.supervision.ledger import ProcessLedger, group_entry_problem
from harness.serve.template.client import sweep_template_dirs


def test_state_dir_is_created_0700_and_tightened(tmp_path):
    made = owned_dir(tmp_path / "state")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o777)
    assert stat.S_IMODE(owned_dir(loose).stat().st_mode) == 0o700


def test_another_users_or_a_linked_state_dir_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(HostStateError, match="not a directory"):
        owned_dir(tmp_path / "link")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(theirs).st_uid + 1)
    with pytest.raises(HostStateError, match="belongs to uid"):
        owned_dir(theirs)
    with pytest.raises(HostStateError):
        PortAllocator(lock_dir=theirs)


@pytest.fixture
def victim():
    """A process group the forger would like killed; it must survive every sweep."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_groups(path, groups):
    path.write_text(json.dumps({"groups": groups}))


def test_forged_ledger_entries_are_skipped_and_never_killed(tmp_path, victim, caplog):
    ledger = ProcessLedger(tmp_path)
    dead = _dead_pid()
    good_owner = {"owner_pid": dead, "owner_create_time": 1.0e9, "host": None}
    _write_groups(ledger.path, {
        # a null start time used to count as "ours": the sweep SIGTERMed the forger's choice
        str(victim.pid): {"name": "x", "pid": victim.pid, "pgid": victim.pid,
                          "create_time": None, **good_owner},
        # owner_pid null raised TypeError out of the sweep, and every start failed after it
        "777": {"name": "y", "pid": 777, "pgid": 777, "create_time": 5.0, "owner_pid": None},
        "0": {"name": "z", "pid": 0, "pgid": 0, "create_time": 5.0, **good_owner},
        str(os.getpgrp()): {"name": "own", "pid": os.getpgrp(), "pgid": os.getpgrp(),
                            "create_time": process_create_time(os.getpgrp()) or 5.0,
                            **good_owner},
        "bad": "not a mapping",
    })
    assert ledger.sweep(grace_s=0.1) == []
    time.sleep(0.2)
    assert victim.poll() is None and psutil.pid_exists(victim.pid)
    assert sum("skipping entry" in r.message for r in caplog.records) == 5
    ledger.record("server", victim.pid, process_create_time(victim.pid))   # a start still works
    assert list(ledger.entries()) == [str(victim.pid)]


@pytest.mark.parametrize("entry, problem", [
    ({"pgid": 0, "pid": 0}, "is not a server's group"),
    ({"pgid": 1, "pid": 1}, "is not a server's group"),
    ({"pgid": "12", "pid": 12}, "is not a server's group"),
    ({"pgid": 12, "pid": 13}, "is not the group's leader"),
    ({"pgid": 12, "pid": 12, "create_time": None}, "create_time None is not a start time"),
    ({"pgid": 12, "pid": 12, "create_time": float("nan")}, "is not a start time"),
    ({"pgid": 12, "pid": 12, "create_time": 5.0, "owner_pid": True}, "owner_pid True"),
    ({"pgid": 12, "pid": 12, "create_time": 5.0, "owner_pid": 3, "owner_create_time": None},
     "owner_create_time None"),
])
def test_group_entry_problems(entry, problem):
    assert problem in group_entry_problem(str(entry["pgid"]), entry)


def test_own_group_is_never_a_valid_entry():
    own = os.getpgrp()
    entry = {"pgid": own, "pid": own, "create_time": 5.0, "owner_pid": 3,
             "owner_create_time": 5.0}
    assert "this harness's own group" in group_entry_problem(str(own), entry)


def test_a_malformed_port_entry_is_skipped_and_dropped(tmp_path):
    (tmp_path / "registry.json").write_text(json.dumps({"ports": {
        "notaport": {"pid": 1}, "30001": {"pid": None}, "30002": "x"}}))
    allocator = PortAllocator(lock_dir=tmp_path, port_range=(30000, 30100))
    ports = allocator.reserve(1, owner="t")
    stored = json.loads((tmp_path / "registry.json").read_text())["ports"]
    assert list(stored) == [str(ports[0])]
    allocator.release(ports)


def test_a_forged_topology_entry_is_skipped(tmp_path):
    ledger = TopologyLedger(tmp_path)
    ledger.path.write_text(json.dumps({"topologies": {
        "eth0": {"tag": "eth0", "subnet": 1, "owner_pid": _dead_pid(), "owner_create_time": 1e9},
        "abc123": {"tag": "abc123", "subnet": 999, "owner_pid": _dead_pid(),
                   "owner_create_time": 1e9}}}))
    assert ledger.take_orphans() == []


def test_template_folders_of_dead_harnesses_are_swept(tmp_path):
    stale, live = tmp_path / f"{_dead_pid()}-abc", tmp_path / f"{os.getpid()}-def"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "server-1.rc").write_text("0")
    assert sweep_template_dirs(tmp_path) == [stale]
    assert live.exists() and not stale.exists()


def test_a_template_folder_is_removed_when_the_template_stops(tmp_path):
    from harness.serve.template.client import ServerTemplate

    template = ServerTemplate(sys.executable, tmp_path)
    assert template.dir.is_dir() and template.dir.parent.name == "templates"
    assert stat.S_IMODE(template.dir.parent.stat().st_mode) == 0o700
    template.stop()   # never started: stop is the one exit path left to clean up
    assert not template.dir.exists()
