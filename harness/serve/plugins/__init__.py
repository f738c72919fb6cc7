"""vLLM general plugins the harness ships (entry-point group ``vllm.general_plugins``).

vLLM calls each ``register()`` in every process it starts (API server, engine core, workers),
so each is cheap, idempotent, never raises and does nothing unless it is relevant; that contract
is :mod:`harness.serve.plugins.entry`, which every ``register`` is made with:

* :mod:`harness.serve.plugins.kv_digest.hook` — a digest of each request's prompt KV on both
  sides of the transfer (``PD_ACCURACY_KV_DIGEST_FILE``, unset = off).
* :mod:`harness.serve.plugins.faults.decode` — canary faults on the decode server's received KV
  (``PD_ACCURACY_FAULT``, unset = off; :mod:`harness.protocol.faults`).
* :mod:`harness.serve.plugins.startup` — fork start, the compile-cache key, AMX tile permission.
* :mod:`harness.serve.plugins.idle.mq_spin` — vLLM's message-queue readers sleep between checks
  instead of yielding the core their writer needs (``PD_ACCURACY_MQ_SPIN_SLEEP_US``; the CPU
  thread budget sets it).
* :mod:`harness.serve.plugins.idle.gloo_groups` — in a world of one rank, one shared gloo group
  instead of one per parallel dimension, each with its polling thread
  (``PD_ACCURACY_SHARE_GLOO_GROUPS``; the CPU thread budget sets it).

The digest and the canaries listen on vLLM's KV connector interface
(:mod:`harness.serve.plugins.kv_events.interface`), so they serve any connector; what one
connector does its own way is in its package's in-server part (``harness/connectors/<name>/
in_server``), and so is a plugin that serves one connector only (its transport's idle poll).
``VLLM_PLUGINS=name,...`` (vLLM's own allow-list) restricts which plugins load.
"""
