"""No server outlives the harness: Ctrl-C in the middle of a real run takes down every vLLM
process it started (API servers, engine cores, workers) — by process group, never by name."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest


def _vllm_descendants(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for c in children:
        try:
            if c.name() != "flock":
                out.append(c)
        except psutil.NoSuchProcess:
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("when", ["starting", "serving"])
def test_ctrl_c_mid_run_leaves_no_process(tmp_path: Path, when: str) -> None:
    log = open(tmp_path / "run.log", "w")
    run = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "run", "--model", "tiny-llama-random",
         "--limit", "5", "--max-model-len", "4096", "--num-fewshot", "1", "--max-gen-toks", "16",
         "--results-dir", str(tmp_path / "results")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        seen: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and run.poll() is None:
            for p in _vllm_descendants(run.pid):
                seen.setdefault(p.pid, p)
            servers = [p for p in seen.values() if "vllm.entrypoints" in " ".join(p.cmdline() if _alive(p) else [])]
            engines = [p for p in seen.values() if p.pid not in {s.pid for s in servers}]
            if when == "starting" and len(servers) >= 3:
                break
            if when == "serving" and (tmp_path / "results").exists() and len(engines) >= 3 and \
                    any((tmp_path / "results").rglob("*")):
                break
            if when == "serving" and "evaluating" in (tmp_path / "run.log").read_text():
                break
            time.sleep(0.5)
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
        for p in _vllm_descendants(run.pid):
            seen.setdefault(p.pid, p)
        assert len(seen) >= 3, f"expected the run to have started servers, saw {len(seen)}"
        os.kill(run.pid, signal.SIGINT)
        run.wait(timeout=120)
        time.sleep(1.0)
        survivors = [p for p in seen.values() if _alive(p)]
        assert not survivors, f"left behind after Ctrl-C: {[(p.pid, p.name()) for p in survivors]}"
        assert run.returncode != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        log.close()
