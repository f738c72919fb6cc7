"""A sandbox for running the command line in-process on bad input: cwd, HOME and TMPDIR in a
temporary directory, and every way to start a process recorded and refused (a command that
starts a child on bad input fails the test that ran it)."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from harness.serve.supervision import process as process_module


class ChildProcess(AssertionError):
    """A command tried to start a process."""


def guard_processes(monkeypatch) -> list[str]:
    """Refuse (and record) every child process: subprocess, fork, the harness's servers."""
    started: list[str] = []

    def refuse(what):
        def start(*args, **kwargs):
            started.append(f"{what}: {str(args[1:2] or args[:1])[:200]}")
            raise ChildProcess(f"{what} started a child process")
        return start
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess.Popen"))
    monkeypatch.setattr(os, "fork", refuse("os.fork"))
    monkeypatch.setattr(os, "posix_spawn", refuse("os.posix_spawn"))
    monkeypatch.setattr(process_module.ManagedProcess, "start", refuse("ManagedProcess.start"))
    return started


def enter(root: Path, monkeypatch) -> list[str]:
    """cwd, HOME and TMPDIR under `root`; returns the list of refused child processes. The
    vLLM feature probe's cache stays the user's (a warm one: this vLLM was probed before)."""
    import harness.serve.launch.vllm_features  # noqa: F401  (binds the cache to the real HOME)

    for name in ("cwd", "home", "tmp", "envs"):
        (root / name).mkdir(exist_ok=True)
    monkeypatch.chdir(root / "cwd")
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("TMPDIR", str(root / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(root / "tmp"))
    monkeypatch.setenv("PD_ACCURACY_VLLM_ENVS", str(root / "envs"))
    return guard_processes(monkeypatch)


def files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink() or p.is_dir()}


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]
