"""GPU leases across processes: no double-booking, memory budgets respected, dead leases reclaimed."""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from pathlib import Path

import pytest
from filelock import FileLock

from harness.serve.gpu_lease import (
    Gpu,
    GpuInventory,
    GpuLeaseImpossible,
    GpuLeaser,
    GpuLeaseTimeout,
    server_gpu_settings,
)

GIB = 2**30


def inventory(n: int = 2, gib: int = 10) -> GpuInventory:
    return GpuInventory([Gpu(i, gib * GIB) for i in range(n)])


def test_exclusive_leases_are_disjoint(tmp_path):
    leaser = GpuLeaser(inventory(4), tmp_path)
    with leaser.lease(2, owner="a") as a, leaser.lease(1, owner="b") as b:
        assert len(a) == 2 and len(b) == 1
        assert not set(a) & set(b)
        with leaser.lease(1) as c:
            assert not set(c) & (set(a) | set(b))
        assert leaser.try_acquire(2) is None          # only one GPU left
    assert leaser.leases() == []                       # released on exit


def test_shared_leases_pack_within_memory(tmp_path):
    leaser = GpuLeaser(inventory(2, gib=10), tmp_path, safety_fraction=0.9)   # 9 GiB usable each
    first = leaser.acquire(exclusive=False, memory_bytes=4 * GIB)
    second = leaser.acquire(exclusive=False, memory_bytes=4 * GIB)
    assert first.devices == second.devices             # best fit packs onto the same GPU
    third = leaser.acquire(exclusive=False, memory_bytes=4 * GIB)
    assert third.devices != first.devices              # 12 GiB would exceed 9
    # one whole GPU is not free any more: exclusive must wait
    assert leaser.try_acquire(1, exclusive=True) is None
    leaser.release(third)
    excl = leaser.acquire(1, exclusive=True)
    assert excl.devices != first.devices
    # nothing shared may land on the exclusive GPU, even when it has no shared load;
    # the shared GPU takes 1 GiB more (exactly 9 GiB) but not 2
    assert leaser.try_acquire(exclusive=False, memory_bytes=2 * GIB) is None
    assert leaser.try_acquire(exclusive=False, memory_bytes=1 * GIB).devices == first.devices


def test_impossible_requests_fail_at_once(tmp_path):
    leaser = GpuLeaser(inventory(2, gib=10), tmp_path)
    start = time.monotonic()
    with pytest.raises(GpuLeaseImpossible, match="inventory has 2"):
        leaser.acquire(3, timeout_s=30)
    with pytest.raises(GpuLeaseImpossible, match="safety fraction"):
        leaser.acquire(exclusive=False, memory_bytes=int(9.5 * GIB), timeout_s=30)
    with pytest.raises(GpuLeaseImpossible, match="memory_bytes"):
        leaser.acquire(exclusive=False)
    assert time.monotonic() - start < 5


def test_busy_request_times_out(tmp_path):
    leaser = GpuLeaser(inventory(1), tmp_path)
    with leaser.lease(owner="holder"):
        start = time.monotonic()
        with pytest.raises(GpuLeaseTimeout, match="holder"):
            leaser.acquire(1, timeout_s=0.3)
        assert 0.3 <= time.monotonic() - start < 3


def test_waiter_gets_the_gpu_when_released(tmp_path):
    import threading

    leaser = GpuLeaser(inventory(1), tmp_path)
    held = leaser.acquire()
    threading.Timer(0.2, leaser.release, args=(held,)).start()
    with leaser.lease(timeout_s=5) as got:
        assert got.devices == (0,)


def _die_holding(lock_dir: str) -> None:
    leaser = GpuLeaser(inventory(2), lock_dir)
    leaser.acquire(2, owner="doomed")
    os._exit(0)   # no release: imitates a crashed xdist worker


def test_dead_process_lease_is_reclaimed(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_die_holding, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    state = json.loads((tmp_path / "gpu-leases.json").read_text())
    assert [l["owner"] for l in state["leases"]] == ["doomed"]
    leaser = GpuLeaser(inventory(2), tmp_path)
    with leaser.lease(2, timeout_s=2) as lease:
        assert lease.devices == (0, 1)
    assert leaser.leases() == []


def test_reused_pid_lease_is_reclaimed(tmp_path):
    leaser = GpuLeaser(inventory(1), tmp_path)
    mine = leaser.acquire()
    rows = json.loads((tmp_path / "gpu-leases.json").read_text())
    rows["leases"][0]["pid_started"] -= 1000     # same pid, older process: the owner is gone
    (tmp_path / "gpu-leases.json").write_text(json.dumps(rows))
    assert leaser.try_acquire() is not None
    assert mine.lease_id not in {l.lease_id for l in leaser.leases()}


def _worker(lock_dir: str, journal_dir: str, n_gpus: int, seed: int, rounds: int, mode: str) -> None:
    """Lease in a loop; while holding, record the lease in a journal and check the invariants
    against everyone else's journal entries (under a separate lock)."""
    rng = random.Random(seed)
    inv = inventory(n_gpus, gib=10)
    leaser = GpuLeaser(inv, lock_dir, safety_fraction=0.9, poll_interval_s=0.005)
    journal = Path(journal_dir) / "journal.json"
    check_lock = FileLock(str(Path(journal_dir) / "journal.lock"))
    violations = []
    for i in range(rounds):
        exclusive = mode == "exclusive" or (mode == "mixed" and rng.random() < 0.3)
        count = rng.choice([1, 1, 2]) if exclusive else 1
        memory = None if exclusive else rng.choice([2, 3, 4]) * GIB
        with leaser.lease(count, exclusive=exclusive, memory_bytes=memory, owner=f"w{seed}", timeout_s=60) as lease:
            entry = {"id": f"{seed}-{i}", "devices": list(lease.devices), "exclusive": exclusive, "memory": memory}
            with check_lock:
                held = json.loads(journal.read_text()) if journal.exists() else []
                for other in held:
                    shared_gpus = set(other["devices"]) & set(entry["devices"])
                    if shared_gpus and (other["exclusive"] or exclusive):
                        violations.append(f"double-booked {shared_gpus}: {other} / {entry}")
                if not exclusive:
                    for gpu in entry["devices"]:
                        used = memory + sum(o["memory"] for o in held if gpu in o["devices"] and not o["exclusive"])
                        if used > 0.9 * 10 * GIB:
                            violations.append(f"GPU {gpu} over budget: {used / GIB:.0f} GiB")
                journal.write_text(json.dumps(held + [entry]))
            time.sleep(rng.uniform(0.001, 0.01))
            with check_lock:
                held = json.loads(journal.read_text())
                journal.write_text(json.dumps([e for e in held if e["id"] != entry["id"]]))
    (Path(journal_dir) / f"result-{seed}.json").write_text(json.dumps(violations))


@pytest.mark.parametrize("mode,n_gpus", [("exclusive", 2), ("shared", 2), ("mixed", 4)])
def test_four_processes_never_double_book(tmp_path, mode, n_gpus):
    lock_dir, journal_dir = tmp_path / "locks", tmp_path / "journal"
    journal_dir.mkdir()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(lock_dir), str(journal_dir), n_gpus, seed, 15, mode))
             for seed in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    violations = [v for seed in range(4) for v in json.loads((journal_dir / f"result-{seed}.json").read_text())]
    assert violations == []
    assert json.loads((journal_dir / "journal.json").read_text()) == []
    assert GpuLeaser(inventory(n_gpus), lock_dir).leases() == []


def test_journal_check_catches_double_booking(tmp_path):
    """The stress test's checker is not vacuous: a leaser that ignores holders gets caught."""
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    (journal_dir / "journal.json").write_text(json.dumps(
        [{"id": "x", "devices": [0], "exclusive": True, "memory": None}]))
    import harness.serve.gpu_lease as gl

    original = gl.GpuLeaser._choose
    gl.GpuLeaser._choose = lambda self, leases, count, exclusive, memory_bytes: (0,)   # ignores holders
    try:
        _worker(str(tmp_path / "locks"), str(journal_dir), 1, 99, 1, "exclusive")
    finally:
        gl.GpuLeaser._choose = original
    assert "double-booked" in json.loads((journal_dir / "result-99.json").read_text())[0]


def test_server_settings_for_shared_and_exclusive(tmp_path):
    inv = GpuInventory([Gpu(3, 141 * GIB), Gpu(5, 141 * GIB)])
    leaser = GpuLeaser(inv, tmp_path)
    with leaser.lease(exclusive=False, memory_bytes=8 * GIB) as shared:
        settings = server_gpu_settings(shared, inv)
        assert settings.env == {"CUDA_VISIBLE_DEVICES": str(shared.devices[0])}
        util = float(settings.args[settings.args.index("--gpu-memory-utilization") + 1])
        assert util == 0.06                               # 8/141 = 0.0567, rounded up
        assert settings.args[settings.args.index("--kv-cache-memory-bytes") + 1] == str(4 * GIB)
        explicit = server_gpu_settings(shared, inv, kv_cache_memory_bytes=GIB)
        assert explicit.args[-1] == str(GIB)
        with pytest.raises(ValueError, match="does not fit"):
            server_gpu_settings(shared, inv, kv_cache_memory_bytes=9 * GIB)
    with leaser.lease(2) as tp2:
        settings = server_gpu_settings(tp2, inv)
        assert settings.env == {"CUDA_VISIBLE_DEVICES": "3,5"} and settings.args == []


def test_inventory_rejects_duplicates_and_sorts():
    inv = GpuInventory([Gpu(1, GIB), Gpu(0, GIB)])
    assert [g.index for g in inv.devices] == [0, 1]
    with pytest.raises(ValueError):
        GpuInventory([Gpu(0, GIB), Gpu(0, GIB)])
