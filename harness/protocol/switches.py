"""The environment variables that switch an in-server plugin on (or off) and write nothing back:
the harness sets them per server (harness.serve.launch), the plugin reads them in each of vLLM's
processes (harness.serve.plugins.startup, .idle). Those whose plugins write evidence live with
it: the fault spec (harness.protocol.faults), the KV digest (harness.protocol.kv_digest)."""
from __future__ import annotations

COMPILE_KEY_ENV = "PD_ACCURACY_SHARED_COMPILE_CACHE"   # "1": ports left out of the compile key
FORK_START_ENV = "PD_ACCURACY_FORK_START"              # "1": a CPU server forks its engine core
AMX_PERMISSION_ENV = "PD_ACCURACY_AMX_PERMISSION"      # "0": do not ask Linux for AMX tiles
MQ_SPIN_SLEEP_ENV = "PD_ACCURACY_MQ_SPIN_SLEEP_US"     # µs a message-queue reader sleeps
SHARE_GLOO_GROUPS_ENV = "PD_ACCURACY_SHARE_GLOO_GROUPS"   # "1": one gloo group in a world of one


def parse_mq_spin_sleep_us(env) -> int | None:
    """Microseconds a message-queue reader sleeps between checks (MQ_SPIN_SLEEP_ENV); None when
    unset (vLLM's own yield). Read by the plugin in each server and by the harness's input check."""
    raw = env.get(MQ_SPIN_SLEEP_ENV, "").strip()
    if not raw:
        return None
    value = int(raw)
    if value <= 0:
        raise ValueError(f"{MQ_SPIN_SLEEP_ENV} must be a positive number of microseconds, "
                         f"got {raw!r}")
    return value

