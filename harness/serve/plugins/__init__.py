"""vLLM general plugins the harness ships (entry-point group ``vllm.general_plugins``).

vLLM calls each ``register()`` in every process it starts (API server, engine core, workers),
so each is cheap, idempotent, never raises and does nothing unless it is relevant:

* :mod:`harness.serve.connectors.nixl_idle` — gives NIXL's UCX progress thread a poll timeout so idle
  servers stop spinning a core (``PD_ACCURACY_NIXL_PTHR_DELAY_US``, default 1000, 0 = off).
* :mod:`harness.serve.plugins.startup.cpu_amx` — asks Linux for AMX tile state in every server process on
  a host with AMX: without it vLLM CPU 0.32's decode dies of SIGILL at its first step on
  received KV (``PD_ACCURACY_AMX_PERMISSION=0`` = off, to see that crash).
* :mod:`harness.serve.plugins.faults.decode` — canary KV corruption on the decode server
  (``PD_ACCURACY_FAULT=corrupt-block|swap-blocks``, unset = off).

``VLLM_PLUGINS=name,...`` (vLLM's own allow-list) restricts which plugins load.
"""

NIXL_IDLE_PLUGIN = "pd_accuracy_nixl_idle"
FAULTS_PLUGIN = "pd_accuracy_faults"
