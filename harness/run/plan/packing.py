"""Which baseline groups run at once on the GPUs, and on which: the one scheduler of a GPU run.

A GPU's memory is the scarce thing when tiny and real-shape servers share it. Every server the
harness starts has an explicit budget (its KV cache bytes, `--gpu-memory-utilization` for vLLM's
start-up check), so the memory a group holds at its peak can be estimated before it starts:
its baseline, the pair it evaluates and the next pair, started while that one is evaluated
(harness.run.runner). A group is admitted to a GPU when that peak fits the GPU's room next to the
groups already there, and no more groups run than the host's cores can start and drive.

`run` (harness.run.plan.packed), `farm` (each job packs its shard on the GPUs it was given)
and the Buildkite steps (a TP1 cell asks for one GPU) all plan with this module. Pure: no
process is started here; the caller measures the GPUs and the cores.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from harness.core.cell import Cell

GIB = 1 << 30
# what a vLLM server holds on its GPU beyond weights and KV cache: the CUDA context, the
# activation workspace of its profiling run and its CUDA graphs (tiny models on vLLM 0.26:
# 1.3-1.9 GiB each on the H200 with --kv-cache-memory-bytes 512 MiB)
SERVER_OVERHEAD_BYTES = 2 * GIB
# vLLM refuses to start unless the GPU's free memory is at least this share of its total
# (`--gpu-memory-utilization`, which the harness sets for shared GPUs, harness.serve.deploy)
START_CHECK_SHARE = 0.06
# cores one group keeps busy at its peak: the servers' start-up (imports, compile) and, later,
# the proxy, lm-eval's client and three engine loops
CORES_PER_GROUP = 2
# servers in start-up at once on one GPU when the caller sets no cap (--max-starting): 12 tiny
# servers started together on the H200's 16 cores were all healthy in 80-120 s cold
STARTING_PER_GPU = 12
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "auto": 2}


@dataclass(frozen=True)
class GroupJob:
    """One baseline group: the cells that share a baseline server, run by one `run` process."""

    index: int
    baseline_key: str
    cell_ids: tuple[str, ...]
    gpus: int                   # GPUs its widest server needs (servers share them)
    peak_bytes: int             # GPU memory per GPU while its servers are all up
    servers_at_peak: int
    warm_key: tuple             # servers of equal warm_key share JIT and compile caches
    start_weight: float         # how slow its cold start is (higher starts first)

    @property
    def name(self) -> str:
        return f"g{self.index:02d}-{self.baseline_key}"


@dataclass(frozen=True)
class GpuRoom:
    """One GPU as the scheduler sees it: its index (in CUDA_VISIBLE_DEVICES numbering) and the
    bytes groups may take on it."""

    index: int
    total_bytes: int
    free_bytes: int

    @property
    def usable_bytes(self) -> int:
        """What groups may hold: the free memory less the headroom vLLM's start-up check
        asks of the last server to start."""
        return max(0, self.free_bytes - int(START_CHECK_SHARE * self.total_bytes))


def model_weight_bytes(config: Mapping, dtype: str = "bfloat16") -> int:
    """The weights of a decoder described by a config.json, from its published shape (random
    weight checkpoints hold none on disk): embeddings, attention and MLP of every layer."""
    text = config.get("text_config") or config
    hidden = int(text.get("hidden_size") or 0)
    layers = int(text.get("num_hidden_layers") or 0)
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or (hidden // heads if heads else 0))
    inter = int(text.get("intermediate_size") or 4 * hidden)
    vocab = int(text.get("vocab_size") or 0)
    experts = int(text.get("num_experts") or text.get("n_routed_experts")
                  or text.get("num_local_experts") or 1)
    moe_inter = int(text.get("moe_intermediate_size") or inter)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * (moe_inter * experts if experts > 1 else inter)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    params = layers * (attention + mlp) + vocab * hidden * (1 if tied else 2)
    return params * _DTYPE_BYTES.get(dtype, 2)


def server_bytes(kv_cache_bytes: int, weight_bytes: int, tp: int = 1) -> int:
    """One server's GPU memory per GPU: its share of the weights, its KV cache, the overhead."""
    return weight_bytes // max(tp, 1) + kv_cache_bytes + SERVER_OVERHEAD_BYTES


def warm_key(cell: Cell) -> tuple:
    """What a server's JIT kernels and torch.compile artifacts depend on: servers that agree on
    it reuse one another's caches (FlashInfer's JIT directory, vLLM's compile cache)."""
    return (cell.model, cell.backend, cell.runner, cell.dtype, cell.compile,
            cell.decode_kv_cache_dtype)


def start_weight(cell: Cell, weight_bytes: int) -> float:
    """A rough order of cold start-up cost: FlashInfer compiles its kernels in the first server
    of a configuration (210-264 s on the H200, against 38-90 s for FLASH_ATTN), hybrid models
    build more kernels, larger weights take longer to place."""
    weight = 1.0 + weight_bytes / (8 * GIB)
    if cell.backend == "FLASHINFER":
        weight += 3.0
    if cell.spec_decode != "none":
        weight += 0.5
    return weight


def group_jobs(cells: Sequence[Cell], *, kv_cache_bytes: Callable[[Cell], int],
               weight_bytes: Callable[[Cell], int], layout: str = "shared") -> list[GroupJob]:
    """The run's baseline groups, in the order they should start: one group of each warm key
    first, slowest cold start first (its JIT and compile caches then serve the rest), then the
    others in the profile's order."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.baseline_key, []).append(cell)
    jobs = []
    for index, members in enumerate(groups.values()):
        first = members[0]
        pairs = len({_pair_identity(c) for c in members})
        widest = max(max(c.prefill_tp, c.decode_tp, c.baseline_tp) for c in members)
        gpus = max(1, max(c.gpus_needed["total"] for c in members) if layout == "split"
                else max(c.gpus_needed["min_shared"] for c in members))
        weights = max(weight_bytes(c) for c in members)
        per_server = server_bytes(max(kv_cache_bytes(c) for c in members), weights, widest)
        # the baseline, the pair being evaluated and the next one, started meanwhile
        servers = 1 + min(pairs, 2) * max(c.num_prefill + c.num_decode for c in members)
        peak = per_server * servers
        if layout == "shared" and gpus > 1:
            peak = math.ceil(peak / gpus)      # a TP server's ranks spread over its GPUs
        jobs.append(GroupJob(index=index, baseline_key=first.baseline_key,
                             cell_ids=tuple(c.cell_id for c in members), gpus=gpus,
                             peak_bytes=peak, servers_at_peak=servers, warm_key=warm_key(first),
                             start_weight=max(start_weight(c, weights) for c in members)))
    leaders: dict[tuple, GroupJob] = {}
    for job in sorted(jobs, key=lambda j: -j.start_weight):
        leaders.setdefault(job.warm_key, job)
    first_wave = sorted(leaders.values(), key=lambda j: (-j.start_weight, j.index))
    return first_wave + [j for j in jobs if leaders.get(j.warm_key) is not j]


def _pair_identity(cell: Cell) -> tuple:
    from harness.serve.deploy import pair_key
    return pair_key(cell)


def max_parallel_groups(cores: int, gpus: int) -> int:
    """Groups the host's cores can start and drive at once (at least one per GPU)."""
    return max(gpus, cores // CORES_PER_GROUP, 1)


@dataclass
class Packer:
    """Admits groups to GPUs as room frees: the longest-waiting group that fits goes next, on
    the GPUs with the most room left. State only; the caller starts and ends the groups."""

    rooms: Sequence[GpuRoom]
    max_groups: int
    held: dict[int, int] = field(default_factory=dict)          # GPU -> bytes held by groups
    running: dict[int, tuple[int, ...]] = field(default_factory=dict)   # job index -> GPUs

    def __post_init__(self) -> None:
        for room in self.rooms:
            self.held.setdefault(room.index, 0)

    def room_left(self, gpu: int) -> int:
        room = next(r for r in self.rooms if r.index == gpu)
        return room.usable_bytes - self.held[gpu]

    def never_fits(self, job: GroupJob) -> str | None:
        """Why `job` cannot run on these GPUs even alone (None: it can)."""
        if job.gpus > len(self.rooms):
            return f"needs {job.gpus} GPUs, {len(self.rooms)} visible"
        best = sorted((r.usable_bytes for r in self.rooms), reverse=True)[:job.gpus]
        if best and min(best) < job.peak_bytes:
            return (f"needs {job.peak_bytes / GIB:.1f} GiB per GPU at its peak, the GPUs have "
                    f"{min(best) / GIB:.1f} GiB free")
        return None

    def place(self, job: GroupJob) -> tuple[int, ...] | None:
        """The GPUs `job` gets now (held until `release`), or None while it does not fit. A
        group alone on idle GPUs always gets them: its own check (vLLM's) then speaks."""
        if len(self.running) >= self.max_groups:
            return None
        order = sorted(self.held, key=lambda g: (-self.room_left(g), g))[:job.gpus]
        if len(order) < job.gpus:
            return None
        alone = not any(self.held[g] for g in order)
        if not alone and any(self.room_left(g) < job.peak_bytes for g in order):
            return None
        for g in order:
            self.held[g] += job.peak_bytes
        self.running[job.index] = tuple(sorted(order))
        return self.running[job.index]

    def release(self, job: GroupJob) -> None:
        for g in self.running.pop(job.index, ()):
            self.held[g] -= job.peak_bytes


def groups_at_once(jobs: Sequence[GroupJob], rooms: Sequence[GpuRoom], max_groups: int) -> int:
    """How many of `jobs`, taken in order, the packer runs together on `rooms` (at least one):
    what `-n auto` gives the pytest plugin's workers on a GPU machine."""
    packer = Packer(rooms, max_groups)
    placed = 0
    for job in jobs:
        if packer.place(job) is None:
            break
        placed += 1
    return max(1, placed)


def read_gpu_rooms(devices: Iterable, used_bytes: Mapping[int, int] | None = None) -> list[GpuRoom]:
    """GpuRoom per visible device (index = its position in CUDA_VISIBLE_DEVICES order), free =
    total less what nvidia-smi says is used now."""
    used_bytes = used_bytes or {}
    return [GpuRoom(i, d.memory_bytes, d.memory_bytes - used_bytes.get(d.index, 0))
            for i, d in enumerate(devices)]


def plan_json(jobs: Sequence[GroupJob]) -> str:
    """The plan as JSON lines (`run --dry-run` on a GPU machine, the packing record)."""
    return "\n".join(json.dumps({"group": j.name, "cells": list(j.cell_ids), "gpus": j.gpus,
                                 "peak_gib": round(j.peak_bytes / GIB, 2),
                                 "servers_at_peak": j.servers_at_peak}) for j in jobs)


__all__ = ["GIB", "GpuRoom", "GroupJob", "Packer", "STARTING_PER_GPU", "group_jobs", "groups_at_once",
           "max_parallel_groups", "model_weight_bytes", "read_gpu_rooms", "server_bytes",
           "warm_key"]

