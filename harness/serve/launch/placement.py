"""Placement: which CPU cores and GPUs each role of a cell's servers uses."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Which CPU cores / GPUs each role uses. CPU: one core per server, round-robin."""

    cpu_cores: tuple[int, ...] = ()
    gpu_base: int = 0                      # first GPU index this cell may use
    gpu_layout: str = "shared"             # "shared": all roles from gpu_base; "split": P then D

    @classmethod
    def detect(cls, gpu_layout: str = "shared") -> "Placement":
        cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
        return cls(cpu_cores=cores or tuple(range(os.cpu_count() or 1)), gpu_layout=gpu_layout)

    def core_for(self, role: str, index: int, tp: int = 1) -> str | None:
        """VLLM_CPU_OMP_THREADS_BIND: one core per TP rank, ranks separated by '|'."""
        if not self.cpu_cores:
            return None
        # prefill and baseline share the first core (they are rarely busy at the same time);
        # decode gets the last, so a P/D request uses both cores. A TP>1 server's further ranks
        # take the following cores (wrapping: on 2 cores a TP2 prefill binds "0|1").
        n = len(self.cpu_cores)
        order = {"baseline": 0, "prefill": 0, "decode": n - 1}[role]
        first = order + index * max(tp, 1)
        return "|".join(str(self.cpu_cores[(first + r) % n]) for r in range(max(tp, 1)))

    def gpus_for(self, role: str, index: int, tp: int, prefill_gpus: int) -> tuple[int, ...]:
        start = self.gpu_base
        if self.gpu_layout == "split" and role == "decode":
            start += prefill_gpus
        if self.gpu_layout == "split" and role in ("prefill", "decode"):
            start += index * tp
        return tuple(range(start, start + tp))
