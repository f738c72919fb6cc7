"""What one KV connector needs from the harness and gives back, as one typed value: its driver.

A connector package (harness/connectors/<name>/) lists its drivers in ``DRIVERS``, one
:class:`KvConnector` per ``driven`` row of its ``ROWS``. Everything connector-specific the
harness does goes through it:

- the servers: ``kv_transfer_config`` per role, the env and ports per server (a side channel);
- the proxy: what the prefill hop asks for and how its answer becomes the decode hop's params;
- the evidence: its ``/metrics`` samples mapped onto connector-neutral transfer counters, with
  the server role whose page carries each; which params list the blocks that crossed, so the
  judge can say how many bytes should have moved (or that it cannot say).

The rest of the harness reads the neutral names only (``kv_bytes``, ``failed_transfers``...).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

PAIR_ROLES = ("prefill", "decode")
# The connector-neutral transfer counters (harness.eval.metrics.TransferCounters field names)
KV_COUNTERS = ("kv_bytes", "kv_transfers", "failed_transfers", "failed_notifications",
               "expired_requests")


@dataclass(frozen=True)
class MetricMap:
    """vLLM ``/metrics`` sample name -> neutral counter, and the roles whose servers expose it
    (the side that performs a transfer counts it: a READ on the decode, a WRITE on the prefill;
    a counter both sides add to names both)."""

    samples: Mapping[str, str]
    # counter -> role, or roles (default: the decode)
    role_of: Mapping[str, "str | tuple[str, ...]"] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.samples.values()) - set(KV_COUNTERS)
        if unknown:
            raise ValueError(f"not neutral counters: {sorted(unknown)}; use {KV_COUNTERS}")

    def roles(self, counter: str) -> tuple[str, ...]:
        role = self.role_of.get(counter, "decode")
        return (role,) if isinstance(role, str) else tuple(role)

    def counters_from(self, role: str) -> dict[str, str]:
        """The samples a server of ``role`` contributes: sample name -> counter."""
        return {s: c for s, c in self.samples.items() if role in self.roles(c)}

    def samples_of(self, counter: str) -> tuple[str, ...]:
        """The sample names that add to ``counter``."""
        return tuple(s for s, c in self.samples.items() if c == counter)


@dataclass(frozen=True)
class LogPatterns:
    """What a connector's lines in a server log mean (harness.serve.launch.logscan reads every
    driven connector's): regexes, each None where the connector has none."""

    error_word: str | None = None     # a word that marks a line as error-looking unless routine
    harmless: str | None = None       # error-looking lines every healthy start prints
    root_cause: str | None = None     # a line that is the cause of whatever follows it
    # a prefill line naming a request whose KV blocks it released after its lease ran out (the
    # request id in group 1)
    lease_expired: str | None = None


@dataclass(frozen=True)
class ServerPorts:
    """Ports a connector needs per P/D server beyond its HTTP port (none for most)."""

    per_rank: int = 0          # a contiguous block of ``per_rank x TP`` ports, first one passed on


@dataclass(frozen=True)
class KvConnector:
    """One connector, as the harness drives it. Subclasses override the methods that differ."""

    value: str                          # the cell's kv_connector value
    vllm_name: str                      # kv_transfer_config's "kv_connector"
    metrics: MetricMap
    ports: ServerPorts = ServerPorts()
    # what the prefill hop asks for: compute the prompt, keep its KV for a remote decoder
    prefill_params: Mapping[str, Any] = field(default_factory=dict)
    # which bytes the judge can expect: "blocks" (listed blocks x geometry) or None (cannot say)
    byte_accounting: str | None = None
    # whether the harness's kv-digest plugin (harness.serve.plugins.kv_digest) hooks this
    # connector's vLLM class; False: the kv-digest check is left out, and the record says why
    kv_digest: bool = False
    # whether the prefill answers the params the decode needs; False: it answers none and the
    # proxy names the transfer itself (a transfer id on both hops)
    prefill_answers_params: bool = True
    # the kv_connector_extra_config key that takes a directory both servers of a pair share
    # (the deployment makes a fresh one per pair); None: the connector needs none
    shared_path_key: str | None = None
    # verdict check -> why this connector cannot be held to it: the record says "not available
    # for <value>: why", never a pass (harness.run.evaluation.cell_eval)
    not_available: Mapping[str, str] = field(default_factory=dict)
    # the kv_connector_extra_config key of how long the prefill holds a request's blocks for
    # its decode (seconds); None: it has no lease (the lease weathers do not run with it)
    lease_key: str | None = None
    log: LogPatterns = LogPatterns()

    # ---- servers ------------------------------------------------------------------------
    def kv_transfer_config(self, role: str, *, kv_role: str, kv_buffer_device: str,
                           kv_layout: str = "default",
                           side_port: int | None = None) -> dict[str, Any]:
        """vLLM's ``--kv-transfer-config`` for a server of ``role`` (prefill or decode);
        ``side_port``: the first of its reserved ports."""
        return {"kv_connector": self.vllm_name, "kv_role": kv_role,
                "kv_buffer_device": kv_buffer_device}

    def server_env(self, *, host: str, side_host: str | None,
                   side_port: int | None) -> dict[str, str]:
        """Environment a P/D server needs (``side_port``: the first of its reserved ports)."""
        return {}

    def not_available_lines(self) -> dict[str, str]:
        """``not_available`` as the verdict's lines: check -> "<check>: not available for
        <value>: <why>"."""
        return {check: f"{check}: not available for {self.value}: {why}"
                for check, why in self.not_available.items()}

    # ---- proxy --------------------------------------------------------------------------
    def prefill_params_for(self, request_id: str) -> dict[str, Any]:
        """The prefill hop's ``kv_transfer_params`` for one request (most: the same for all)."""
        return dict(self.prefill_params)

    def prefill_answer(self, received: Mapping[str, Any] | None, *,
                       sent: Mapping[str, Any], side: str | None) -> Mapping[str, Any] | None:
        """What the decode hop's params derive from, once the prefill answered: its answer
        (``received``), or for a connector whose prefill answers none, what the proxy names from
        the params it ``sent`` the prefill and the prefill's side channel ``side`` (host:port)."""
        return received

    def decode_params(self, received: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The decode hop's ``kv_transfer_params`` from what the prefill answered (None: the
        decode gets none and recomputes)."""
        return None if received is None else dict(received)

    # ---- evidence -----------------------------------------------------------------------
    def block_params(self, received: Mapping[str, Any] | None,
                     sent: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The params that list the blocks which crossed for one request (None: nothing was
        to cross), given what the prefill answered and what the decode was sent."""
        return sent


__all__ = ["KV_COUNTERS", "PAIR_ROLES", "KvConnector", "LogPatterns", "MetricMap", "ServerPorts"]
