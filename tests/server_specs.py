"""ServerSpec builders shared by the unit tests of server planning (no server starts)."""
from __future__ import annotations

from harness.serve.launch.server_spec import ServerSpec


def make_spec(role: str = "baseline", device: str = "cpu", gpu_backend: str = "FLASH_ATTN",
              **kw) -> ServerSpec:
    """A tiny model's server spec: CPU_ATTN on CPU, `gpu_backend` on CUDA; a P/D role gets a
    NIXL side-channel port; `kw` overrides any field."""
    defaults = dict(role=role, index=0, model_path="/models/tiny", served_model_name="tiny",
                    port=8100, backend="CPU_ATTN" if device == "cpu" else gpu_backend,
                    block_size=128, device=device, python="/venv/bin/python")
    if role != "baseline":
        defaults["side_channel_port"] = 5600
    defaults.update(kw)
    return ServerSpec(**defaults)


def flag(argv: list[str], name: str) -> str | None:
    """Value following `name` in argv, or None when the flag is absent."""
    return argv[argv.index(name) + 1] if name in argv else None
