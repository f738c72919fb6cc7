"""The made-up weather's fault in the decode: it only notes that it was armed."""
from __future__ import annotations

ARMED: list[bool] = []


def arm() -> None:
    ARMED.append(True)
