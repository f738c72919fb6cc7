"""The thread budget of a CPU server: what each of its threads may do on the one core it is
pinned to, as environment settings `build_env` applies (a value the parent shell already set wins,
so a run can compare against vLLM's own behaviour).

A pinned TP1 CPU server is three processes on one core: the API server, the engine core and
its worker. Sampled every 100 ms during a smoke evaluation (harness.run.evidence.cpu_load,
`pd-accuracy bench`), the threads that want that core are:

| thread | process | what it does | budget |
|---|---|---|---|
| main (`python`) | engine core, worker | vLLM's shm message queue: a reader with nothing to read calls `sched_yield()` for 1 s after its last read, on the core its writer needs | `PD_ACCURACY_MQ_SPIN_SLEEP_US=100`: sleep between checks instead (harness.serve.plugins.idle.mq_spin) |
| the connector's transport progress (`python`) | worker | polls the UCX worker's event fds | 1 ms poll timeout (harness.connectors: the transport's idle plugin); left at that |
| `gloo_tcp_loop` x13 | worker | one per torch.distributed gloo group; `epoll_wait` with gloo's fixed 10 ms timeout | `PD_ACCURACY_SHARE_GLOO_GROUPS=1`: a world of one rank shares one group (harness.serve.plugins.idle.gloo_groups) |
| OpenMP team | worker | vLLM binds one OpenMP thread per core of VLLM_CPU_OMP_THREADS_BIND | one thread per pinned core already: no team to spin, OMP_WAIT_POLICY changes nothing |
| tokenizers, torch intra-op | API server, engine core | sized from the CPU affinity, which is the one core | 1 already |

The first and third need a setting; the rest are listed so the next reader does not re-measure them.
"""
from __future__ import annotations

from typing import MutableMapping

from harness.protocol.switches import MQ_SPIN_SLEEP_ENV, SHARE_GLOO_GROUPS_ENV

# variable -> value for every CPU server (GPU servers keep vLLM's spinning: a GPU host has
# cores to spare and the spin is what keeps its steps back to back)
CPU_SERVER_ENV = {
    # 100 us: off the run queue between checks; a CPU decode step takes milliseconds
    MQ_SPIN_SLEEP_ENV: "100",
    # TP1 CPU servers: one gloo loop thread instead of 13 (groups of one rank need no peers)
    SHARE_GLOO_GROUPS_ENV: "1",
}


def apply(env: MutableMapping[str, str]) -> None:
    """Add the CPU thread budget to a server's `env`, keeping what the caller already set."""
    for name, value in CPU_SERVER_ENV.items():
        env.setdefault(name, value)
