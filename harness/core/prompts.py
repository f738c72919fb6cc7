"""The one name of a prompt: the client's question records (harness.eval.lmeval) and the proxy's
per-request records (harness.serve.proxy) are joined through it under weather."""
from __future__ import annotations

import hashlib


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


__all__ = ["prompt_hash"]
