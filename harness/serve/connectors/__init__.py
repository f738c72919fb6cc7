"""The harness's modules that drive a KV connector inside vLLM's servers."""
from __future__ import annotations

from typing import Any, Callable, Mapping


def variable_parsers() -> dict[str, Callable[[Mapping[str, str]], Any]]:
    """The PD_ACCURACY_* variables these modules read in a server, each with the parser they
    use there (ValueError: a value they refuse); the command line parses them first."""
    from harness.serve.connectors.nixl_vars import DELAY_ENV, parse_delay_us

    return {DELAY_ENV: parse_delay_us}
