"""PortAllocator: distinct ports across processes, dead-PID reclaim, contiguous blocks."""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

import port_for
import psutil
import pytest

from harness.serve.host.liveness import process_create_time
from harness.serve.host.ports import PortAllocator, PortsExhaustedError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _reserve_many(lock_dir: str, count: int, start_barrier, results, release_event) -> None:
    """Worker: reserve ``count`` ports one at a time, report them, and stay alive (holding the
    reservations) until told to exit."""
    allocator = PortAllocator(lock_dir=lock_dir)
    start_barrier.wait()
    ports = [allocator.reserve(1, owner=f"worker-{os.getpid()}/{i}")[0] for i in range(count)]
    results.put((os.getpid(), ports))
    release_event.wait(60)


def test_concurrent_processes_never_get_the_same_port(tmp_path):
    workers, per_worker = 4, 25
    ctx = multiprocessing.get_context("spawn")
    barrier, results, release_event = ctx.Barrier(workers), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_reserve_many,
                         args=(str(tmp_path), per_worker, barrier, results, release_event))
             for _ in range(workers)]
    for proc in procs:
        proc.start()
    try:
        by_pid = dict(results.get(timeout=60) for _ in procs)
        all_ports = [port for ports in by_pid.values() for port in ports]
        assert len(all_ports) == workers * per_worker
        assert len(set(all_ports)) == len(all_ports), "a port was handed out twice"
        # the registry agrees: every port is booked once, by the worker that received it
        registry = PortAllocator(lock_dir=tmp_path).reservations()
        assert {port: entry["pid"] for port, entry in registry.items()} == {
            port: pid for pid, ports in by_pid.items() for port in ports}
        # and nothing from the kernel's ephemeral range
        eph_low, eph_high = port_for.ephemeral.port_ranges()[0]
        assert not any(eph_low <= port <= eph_high for port in all_ports)
    finally:
        release_event.set()
        for proc in procs:
            proc.join(30)
    # spawn workers exit through sys.exit, so their atexit hook released everything
    assert all(proc.exitcode == 0 for proc in procs)
    assert PortAllocator(lock_dir=tmp_path).reservations() == {}


def test_reservation_of_dead_pid_is_reclaimed(tmp_path):
    # A harness that dies without atexit (os._exit, SIGKILL) leaves its entries behind.
    child_code = (
        "import json, os; from harness.serve.host.ports import PortAllocator; "
        f"ports = PortAllocator(lock_dir={str(tmp_path)!r}).reserve(2, owner='doomed'); "
        "print(json.dumps(ports), flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", child_code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}).stdout
    leaked = json.loads(out)
    raw = json.loads((tmp_path / "registry.json").read_text())["ports"]
    assert sorted(map(int, raw)) == sorted(leaked), "the dead child's entries are on disk"
    # a range holding only the leaked ports: they can only be had by reclaiming them
    low = min(leaked)
    narrow = PortAllocator(lock_dir=tmp_path, port_range=(low, low + 1))
    assert narrow.reserve(1, owner="heir") == [low]
    registry = narrow.reservations()
    assert registry[low]["owner"] == "heir" and registry[low]["pid"] == os.getpid()
    assert max(leaked) not in registry
    narrow.release([low])


def test_reused_pid_does_not_keep_a_reservation(tmp_path):
    allocator = PortAllocator(lock_dir=tmp_path)
    [port] = allocator.reserve(1, owner="me")
    registry = json.loads((tmp_path / "registry.json").read_text())
    # same live PID, different start time: the PID now belongs to someone else
    registry["ports"][str(port)]["create_time"] -= 1000
    (tmp_path / "registry.json").write_text(json.dumps(registry))
    assert port not in allocator.reservations()


def test_live_reservation_and_bound_port_are_never_handed_out(tmp_path):
    first = PortAllocator(lock_dir=tmp_path)
    [port] = first.reserve(1, owner="holder")
    same_range = PortAllocator(lock_dir=tmp_path, port_range=(port, port + 1))
    with pytest.raises(PortsExhaustedError):
        same_range.reserve(1, owner="thief")  # registered by a live PID (this one)
    first.release([port])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with pytest.raises(PortsExhaustedError):
            same_range.reserve(1, owner="thief")  # free in the registry but bound by a socket
    assert same_range.reserve(1, owner="now free") == [port]
    same_range.release([port])


def test_reserve_block_is_contiguous_and_disjoint(tmp_path):
    allocator = PortAllocator(lock_dir=tmp_path)
    blocks = [allocator.reserve_block(4, owner=f"decode-{i}/nixl-side-channel") for i in range(5)]
    for block in blocks:
        assert block == list(range(block[0], block[0] + 4))
        assert all(not port_for.port_is_used(port) for port in block)
    flat = [port for block in blocks for port in block]
    assert len(set(flat)) == len(flat)
    singles = allocator.reserve(10, owner="http")
    assert len(set(singles)) == 10 and not set(singles) & set(flat)
    assert set(allocator.reservations()) == set(flat) | set(singles)
    allocator.release(flat + singles)
    # a block cannot straddle a reserved port
    low = blocks[0][0]
    tight = PortAllocator(lock_dir=tmp_path, port_range=(low, low + 3))
    [middle] = PortAllocator(lock_dir=tmp_path, port_range=(low + 1, low + 2)).reserve(1, "x")
    with pytest.raises(PortsExhaustedError):
        tight.reserve_block(2, owner="straddler")
    tight.release([middle])  # not ours (other allocator, same pid): released by pid ownership
    assert tight.reserve_block(3, owner="fits now") == [low, low + 1, low + 2]


def test_released_ports_can_be_reserved_again(tmp_path):
    allocator = PortAllocator(lock_dir=tmp_path)
    ports = allocator.reserve_block(3, owner="first run")
    narrow = PortAllocator(lock_dir=tmp_path, port_range=(ports[0], ports[-1] + 1))
    with pytest.raises(PortsExhaustedError):
        narrow.reserve(1, owner="second run")
    allocator.release(ports)
    assert allocator.reservations() == {}
    again = narrow.reserve(3, owner="second run")
    assert sorted(again) == ports
    narrow.release_all()
    assert narrow.reservations() == {}


def test_release_leaves_other_processes_ports_alone(tmp_path):
    allocator = PortAllocator(lock_dir=tmp_path)
    [port] = allocator.reserve(1, owner="mine")
    registry = json.loads((tmp_path / "registry.json").read_text())
    parent = psutil.Process(os.getppid())  # a live process that is not us
    registry["ports"][str(port)].update(pid=parent.pid, create_time=process_create_time(parent.pid))
    (tmp_path / "registry.json").write_text(json.dumps(registry))
    allocator.release([port])
    assert allocator.reservations()[port]["pid"] == parent.pid


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        PortAllocator(lock_dir=tmp_path, port_range=(40000, 20000))
    allocator = PortAllocator(lock_dir=tmp_path)
    with pytest.raises(ValueError):
        allocator.reserve(0, owner="nobody")
    with pytest.raises(ValueError):
        allocator.reserve_block(0, owner="nobody")
