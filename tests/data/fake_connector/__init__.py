"""A made-up KV connector, as a package of its own outside the harness: what adding one takes
(tests/connectors/test_made_up_connector.py registers it). Its capabilities differ from NIXL's
on purpose: any block-size pair, its own dtype refusal, a lease, expirations counted on the
decode and failed transfers on the prefill, its own lease-expired log line."""
from __future__ import annotations

from harness.connectors.driver import KvConnector, LogPatterns, MetricMap
from harness.connectors.facts import ANY_BLOCKS, KV_DTYPE_MIX, ConnectorRow, Refusal

VALUE = "made-up"

ROWS = {VALUE: ConnectorRow(
    "MadeUpConnector", "json:loads", ("cpu", "cuda"), driven=True, label="MadeUp",
    weathers=("expiry", "load-failures", "drizzle"), block_sizes=ANY_BLOCKS,
    refusals={KV_DTYPE_MIX: Refusal(how="its handshake says 'dtypes differ, made-up'",
                                    fails_with="dtypes differ, made-up")},
    distributions=("made-up-transfer",))}
DRIVERS = (KvConnector(
    value=VALUE, vllm_name="MadeUpConnector",
    metrics=MetricMap({"vllm:madeup_expired_total": "expired_requests",
                       "vllm:madeup_failed_total": "failed_transfers"},
                      role_of={"expired_requests": "decode", "failed_transfers": "prefill"}),
    lease_key="madeup_lease_seconds",
    log=LogPatterns(lease_expired=r"made-up lease over for (\S+)")),)
