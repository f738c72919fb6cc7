"""GPU leases shared by every process on one host (pytest-xdist workers, farm steps).

A lease is a row in a JSON state file guarded by a file lock, so processes that know nothing of
each other still never double-book a GPU:

- exclusive leases get GPUs nobody else holds (real models, TP groups);
- shared leases (tiny models) may sit on the same GPU while the sum of their memory budgets stays
  within the GPU's memory × `safety_fraction`; a shared lease never lands on an exclusively held
  GPU and vice versa.

A lease whose process died (pid gone, or reused by a newer process; ``liveness.owner_alive``)
is reclaimed by the next caller, so a crashed worker cannot wedge the farm. Waiting is blocking
with a timeout; a request no inventory could ever satisfy fails at once.

`server_gpu_settings` turns a lease into the server's env/args: CUDA_VISIBLE_DEVICES, and for
budgeted leases both `--gpu-memory-utilization` (vLLM's start-up check compares free memory
against it) and `--kv-cache-memory-bytes` (otherwise servers profiling memory at the same moment
count each other's allocations and fail with "insufficient memory for KV cache").
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from filelock import FileLock

from harness.core.atomic import atomic_write_text
from harness.core.platform import detect_gpus
from harness.serve.liveness import owner_alive, process_create_time, this_host

DEFAULT_LOCK_DIR = Path(os.environ.get("PD_ACCURACY_LOCK_DIR", "/tmp/pd-accuracy-locks"))
DEFAULT_SAFETY_FRACTION = 0.9
STATE_FILE = "gpu-leases.json"
LOCK_FILE = "gpu-leases.lock"


class GpuLeaseError(RuntimeError):
    pass


class GpuLeaseImpossible(GpuLeaseError, ValueError):
    """No state of the inventory could satisfy the request (too many GPUs, too much memory)."""


class GpuLeaseTimeout(GpuLeaseError, TimeoutError):
    """The request was satisfiable but the GPUs stayed busy until the timeout."""


@dataclass(frozen=True)
class Gpu:
    index: int              # physical index (what CUDA_VISIBLE_DEVICES names)
    memory_bytes: int


@dataclass(frozen=True)
class GpuInventory:
    devices: tuple[Gpu, ...]

    def __init__(self, devices: Sequence[Gpu]):
        object.__setattr__(self, "devices", tuple(sorted(devices, key=lambda g: g.index)))
        if len({g.index for g in self.devices}) != len(self.devices):
            raise ValueError("GpuInventory: duplicate GPU index")

    @classmethod
    def detect(cls) -> "GpuInventory":
        """This machine's GPUs (nvidia-smi, else torch), honouring CUDA_VISIBLE_DEVICES."""
        return cls([Gpu(d.index, d.memory_bytes) for d in detect_gpus()])

    def memory_of(self, index: int) -> int:
        for gpu in self.devices:
            if gpu.index == index:
                return gpu.memory_bytes
        raise KeyError(f"GPU {index} is not in the inventory")


@dataclass(frozen=True)
class Lease:
    """GPUs held by one owner. Iterating yields the device indices."""

    lease_id: str
    devices: tuple[int, ...]
    exclusive: bool
    memory_bytes: int | None        # per-GPU budget (required for shared leases)
    owner: str = ""
    pid: int = 0
    pid_started: float = 0.0        # process create_time: tells a reused pid from the original
    host: str = ""
    since: float = 0.0

    def __iter__(self) -> Iterator[int]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(i) for i in self.devices)


@dataclass
class GpuLeaser:
    """Cross-process GPU lease manager backed by `lock_dir/gpu-leases.{lock,json}`."""

    inventory: GpuInventory
    lock_dir: Path | str = DEFAULT_LOCK_DIR
    safety_fraction: float = DEFAULT_SAFETY_FRACTION
    poll_interval_s: float = 0.05
    default_timeout_s: float = 3600.0
    _host: str = field(default_factory=this_host, repr=False)

    def __post_init__(self) -> None:
        self.lock_dir = Path(self.lock_dir)
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.lock_dir / LOCK_FILE))
        self._state_path = self.lock_dir / STATE_FILE

    # ---- state file (call only while holding the lock) ------------------------------------
    def _read(self) -> list[Lease]:
        try:
            rows = json.loads(self._state_path.read_text()).get("leases", [])
        except FileNotFoundError:
            return []
        except ValueError:
            return []  # torn or foreign file: writes are atomic, so this only follows manual edits
        return [Lease(**{**row, "devices": tuple(row["devices"])}) for row in rows]

    def _write(self, leases: list[Lease]) -> None:
        payload = {"leases": [asdict(lease) for lease in leases]}
        atomic_write_text(self._state_path, json.dumps(payload, indent=1))

    def _live(self) -> list[Lease]:
        leases = self._read()
        alive = [l for l in leases if owner_alive(l.pid, l.pid_started, l.host)]
        if len(alive) != len(leases):
            self._write(alive)
        return alive

    # ---- allocation -----------------------------------------------------------------------
    def capacity(self, index: int) -> int:
        return int(self.inventory.memory_of(index) * self.safety_fraction)

    def _check_possible(self, count: int, exclusive: bool, memory_bytes: int | None) -> None:
        if count < 1:
            raise GpuLeaseImpossible(f"asked for {count} GPUs; need at least 1")
        if count > len(self.inventory.devices):
            raise GpuLeaseImpossible(f"asked for {count} GPUs; the inventory has {len(self.inventory.devices)}")
        if not exclusive:
            if not memory_bytes or memory_bytes <= 0:
                raise GpuLeaseImpossible("a shared lease needs memory_bytes (its per-GPU budget)")
            fitting = [g for g in self.inventory.devices if self.capacity(g.index) >= memory_bytes]
            if len(fitting) < count:
                raise GpuLeaseImpossible(
                    f"{count} shared GPU(s) with {memory_bytes / 2**30:.1f} GiB each: only {len(fitting)} GPU(s) "
                    f"have that much under the {self.safety_fraction:.0%} safety fraction")

    def _choose(self, leases: list[Lease], count: int, exclusive: bool, memory_bytes: int | None) -> tuple[int, ...] | None:
        exclusive_held = {i for l in leases if l.exclusive for i in l.devices}
        shared_used: dict[int, int] = {}
        for l in leases:
            if not l.exclusive:
                for i in l.devices:
                    shared_used[i] = shared_used.get(i, 0) + (l.memory_bytes or 0)
        indices = [g.index for g in self.inventory.devices]
        if exclusive:
            free = [i for i in indices if i not in exclusive_held and i not in shared_used]
            return tuple(free[:count]) if len(free) >= count else None
        assert memory_bytes is not None
        room = {i: self.capacity(i) - shared_used.get(i, 0) - memory_bytes
                for i in indices if i not in exclusive_held}
        fitting = sorted((left, i) for i, left in room.items() if left >= 0)
        # best fit: pack tiny servers onto already-shared GPUs, keep whole GPUs for exclusive leases
        if len(fitting) < count:
            return None
        return tuple(sorted(i for _, i in fitting[:count]))

    def try_acquire(self, count: int = 1, exclusive: bool = True, memory_bytes: int | None = None,
                    owner: str = "") -> Lease | None:
        """One non-blocking attempt; None when the GPUs are busy right now."""
        self._check_possible(count, exclusive, memory_bytes)
        with self._lock:
            leases = self._live()
            devices = self._choose(leases, count, exclusive, memory_bytes)
            if devices is None:
                return None
            pid = os.getpid()
            lease = Lease(
                lease_id=uuid.uuid4().hex[:12], devices=devices, exclusive=exclusive,
                memory_bytes=memory_bytes, owner=owner, pid=pid,
                pid_started=process_create_time(pid) or 0.0, host=self._host, since=time.time(),
            )
            self._write(leases + [lease])
            return lease

    def acquire(self, count: int = 1, exclusive: bool = True, memory_bytes: int | None = None,
                owner: str = "", timeout_s: float | None = None) -> Lease:
        """Block until the lease is granted; GpuLeaseTimeout after `timeout_s`."""
        timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            lease = self.try_acquire(count, exclusive, memory_bytes, owner)
            if lease is not None:
                return lease
            if time.monotonic() >= deadline:
                holders = ", ".join(f"{l.owner or 'pid ' + str(l.pid)}@{list(l.devices)}" for l in self.leases())
                kind = "exclusive" if exclusive else f"shared {memory_bytes} B"
                raise GpuLeaseTimeout(f"no {count} GPU(s) ({kind}) free after {timeout_s:.0f} s; held by: {holders}")
            # jitter so waiting workers do not poll in lock-step
            time.sleep(self.poll_interval_s * (0.5 + random.random()))

    def release(self, lease: Lease) -> None:
        with self._lock:
            leases = self._read()
            self._write([l for l in leases if l.lease_id != lease.lease_id])

    @contextlib.contextmanager
    def lease(self, count: int = 1, exclusive: bool = True, memory_bytes: int | None = None,
              owner: str = "", timeout_s: float | None = None) -> Iterator[Lease]:
        """Hold `count` GPUs for the block. The Lease iterates as device indices."""
        held = self.acquire(count, exclusive, memory_bytes, owner, timeout_s)
        try:
            yield held
        finally:
            self.release(held)

    def leases(self) -> list[Lease]:
        """Current live leases (dead ones reclaimed on the way)."""
        with self._lock:
            return self._live()


@dataclass(frozen=True)
class ServerGpuSettings:
    env: dict[str, str]
    args: list[str]


def server_gpu_settings(lease: Lease, inventory: GpuInventory, kv_cache_memory_bytes: int | None = None,
                        kv_cache_fraction: float = 0.5) -> ServerGpuSettings:
    """Env and argv that confine one vLLM server to its lease.

    An exclusive lease without a budget gets only CUDA_VISIBLE_DEVICES (vLLM's defaults own the
    GPU). A budgeted lease also gets `--gpu-memory-utilization` = budget / smallest leased GPU
    (rounded up to 0.01) and `--kv-cache-memory-bytes` (given, or `kv_cache_fraction` of the
    budget), so concurrent start-ups never size their KV cache from each other's free memory.
    """
    env = {"CUDA_VISIBLE_DEVICES": lease.cuda_visible_devices}
    args: list[str] = []
    budget = lease.memory_bytes
    if budget:
        smallest = min(inventory.memory_of(i) for i in lease.devices)
        utilization = min(0.99, max(0.01, math.ceil(budget / smallest * 100) / 100))
        kv_bytes = kv_cache_memory_bytes if kv_cache_memory_bytes is not None else int(budget * kv_cache_fraction)
        if kv_bytes >= budget:
            raise ValueError(f"kv cache {kv_bytes} B does not fit the lease budget {budget} B (weights need room too)")
        args += ["--gpu-memory-utilization", f"{utilization:.2f}", "--kv-cache-memory-bytes", str(kv_bytes)]
    elif kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    return ServerGpuSettings(env=env, args=args)


def describe(leases: Sequence[Lease]) -> list[dict[str, Any]]:
    """Plain rows for logs and `--dry-run` output."""
    return [asdict(l) for l in leases]
